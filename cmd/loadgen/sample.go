package main

import (
	"cmp"
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	sampleEvery = 100 * time.Millisecond
	// walWindow is the width of the windows over which WAL per message is
	// also measured, in samples (about a second).
	walWindow = 10
	// progressEvery is how often a running phase reports, in samples.
	progressEvery = 50
)

// waitCounts counts, over the samples of a phase, what each backend of the
// measured database was doing: on CPU, waiting on a named event (WALWrite,
// WALSync, a lock...), or idle waiting for its client.
type waitCounts map[string]int

// walPoint is the WAL position at time at (since sampling began), when done
// messages had finished.
type walPoint struct {
	at        time.Duration
	wal, done int64
}

type samples struct {
	waits waitCounts
	wal   []walPoint
}

// sample polls the server every sampleEvery until stop is called: the wait
// events of database db's backends (when db is set) and the cluster's WAL
// position against the messages done so far. It runs on a connection to
// another database, so it stays out of the measured database's figures;
// queries adds up what it ran, so that it can be left out of the other
// databases' count.
func sample(ctx context.Context, obs *pgxpool.Pool, db string, queries, done *atomic.Int64, progress func(done int64)) (stop func() samples) {
	var s samples
	s.waits = waitCounts{}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() {
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for tick := 1; ; tick++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if tick%progressEvery == 0 && progress != nil {
				progress(done.Load())
			}
			n := done.Load()
			at := time.Since(start)
			queries.Add(1)
			rows, err := obs.Query(ctx, `
				SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint, a.state,
					coalesce(a.wait_event_type, ''), coalesce(a.wait_event, '')
				FROM (SELECT 1) AS one
				LEFT JOIN pg_stat_activity AS a ON a.datname = $1 AND a.backend_type = 'client backend'`, db)
			if err != nil {
				continue // a sample lost to a busy machine is only a sample
			}
			var wal int64
			for rows.Next() {
				var state *string
				var typ, event string
				if rows.Scan(&wal, &state, &typ, &event) != nil {
					continue
				}
				if state != nil {
					s.waits[waitLabel(*state, typ, event)]++
				}
			}
			if rows.Err() == nil && wal > 0 {
				s.wal = append(s.wal, walPoint{at: at, wal: wal, done: n})
			}
			rows.Close()
		}
	})
	return func() samples {
		cancel()
		wg.Wait()
		return s
	}
}

// waitLabel names one backend's sample. A backend that is active with no
// wait event is running on CPU (or waiting for one: Postgres cannot tell).
func waitLabel(state, typ, event string) string {
	switch {
	case state == "active" && typ == "":
		return "CPU"
	case state == "active":
		return typ + ":" + event
	case state == "idle":
		return "idle (client's turn)"
	case state == "":
		return "unknown"
	}
	return state
}

type share struct {
	label string
	n     int
}

// top is the largest k labels by count, then the rest summed as "other".
func (w waitCounts) top(k int) (shares []share, total int) {
	for label, n := range w {
		shares = append(shares, share{label, n})
		total += n
	}
	slices.SortFunc(shares, func(a, b share) int {
		return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.label, b.label))
	})
	if len(shares) > k {
		rest := 0
		for _, s := range shares[k:] {
			rest += s.n
		}
		shares = append(shares[:k], share{"other", rest})
	}
	return shares, total
}

// background is the WAL that the rest of the cluster writes while this tool
// writes nothing, sampled just before a phase: its rate in bytes per second,
// the median over windows of step samples (robust to a burst) and the mean
// (which counts bursts in).
type background struct {
	median, mean float64
	span         time.Duration
}

func backgroundRate(points []walPoint, step int) background {
	if len(points) < 2 {
		return background{median: math.NaN(), mean: math.NaN()}
	}
	first, last := points[0], points[len(points)-1]
	b := background{span: last.at - first.at, median: math.NaN(), mean: math.NaN()}
	if b.span > 0 {
		b.mean = float64(last.wal-first.wal) / b.span.Seconds()
	}
	var rates []float64
	for i := 0; i+step < len(points); i += step {
		a, z := points[i], points[i+step]
		if dt := (z.at - a.at).Seconds(); dt > 0 {
			rates = append(rates, float64(z.wal-a.wal)/dt)
		}
	}
	if len(rates) > 0 {
		b.median = median(rates)
	}
	return b
}

// medianWALPerMessage is the median, over consecutive windows of step
// samples, of the WAL written per message finished in the window, less what
// the rest of the cluster writes in that time at bgRate bytes per second. WAL
// is cluster-wide: another database's burst (a CREATE DATABASE copies its
// template through the WAL) lands in a few windows and leaves the median
// alone, and the steady part of the others' WAL is what bgRate takes out. It
// is NaN with fewer than three windows that finished at least minDone
// messages each.
func medianWALPerMessage(points []walPoint, step int, minDone int64, bgRate float64) (m float64, windows int) {
	if math.IsNaN(bgRate) {
		bgRate = 0
	}
	var ratios []float64
	for i := 0; i+step < len(points); i += step {
		a, b := points[i], points[i+step]
		if d := b.done - a.done; d >= minDone && d > 0 {
			own := float64(b.wal-a.wal) - bgRate*(b.at-a.at).Seconds()
			ratios = append(ratios, own/float64(d))
		}
	}
	if len(ratios) < 3 {
		return math.NaN(), len(ratios)
	}
	return median(ratios), len(ratios)
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	m := len(v) / 2
	if len(v)%2 == 1 {
		return v[m]
	}
	return (v[m-1] + v[m]) / 2
}
