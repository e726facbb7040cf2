package soak

import (
	"context"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/ackgate/ackgate/internal/soak/pushsim"
)

// What a caller's fault (a failover, a partition) cost, measured from the
// broker's side and from each gateway's readiness: the records a drill
// reports.

// EventRecord is one event as it ran, and its cost.
type EventRecord struct {
	Name       string
	Start, End time.Time
	// Err is the event's own failure ("" when it did what it says).
	Err string
	// Window is the time after Start until the next event, or until the
	// broker was done; Nacked counts the pushes in it that were not acked
	// (a nack, a timeout, a broken connection), Acked those that were.
	Window         time.Duration
	Nacked, Acked  int
	FirstNack      time.Duration // after Start; 0 when none
	LastNack       time.Duration // after Start
	NackedStatuses map[int]int
	// Recovered is when, after Start, deliveries were acked again: the
	// first moment after a nack from which the next two seconds hold acks
	// and no nack (0 when nothing was nacked). NackedBefore counts the
	// nacks until then; the rest came later, from single operations (a
	// parked one nacked until it is settled).
	Recovered    time.Duration
	NackedBefore int
	// Unready is, per gateway, how long /readyz did not answer 200 within
	// the window.
	Unready []time.Duration
}

// maxWindow bounds the time after an event that is counted as its cost.
const maxWindow = 2 * time.Minute

// settledFor is how long answers must hold acks and no nack to count as
// recovered.
const settledFor = 2 * time.Second

// recovered is the first moment just after a nack from which the answers
// of the next settledFor hold at least one ack and no nack, as a time after
// start; 0 when nothing was nacked, the whole window when it never holds.
// It starts from the nacks because a failover's effect may begin a while
// after the event does (a switchover takes a second to demote).
func recovered(answers []pushsim.Answer, start, end time.Time) time.Duration {
	var in []pushsim.Answer
	for _, a := range answers {
		if !a.At.Before(start) && a.At.Before(end) {
			in = append(in, a)
		}
	}
	sort.Slice(in, func(i, j int) bool { return in[i].At.Before(in[j].At) })
	var cands []time.Time
	for _, a := range in {
		if !pushsim.IsAck(a.Status) {
			cands = append(cands, a.At.Add(time.Nanosecond))
		}
	}
	for _, t := range cands {
		acks, nacks := 0, 0
		for _, a := range in {
			if a.At.Before(t) || !a.At.Before(t.Add(settledFor)) {
				continue
			}
			if pushsim.IsAck(a.Status) {
				acks++
			} else {
				nacks++
			}
		}
		if nacks == 0 && acks > 0 {
			return t.Sub(start)
		}
	}
	if len(cands) == 0 {
		return 0
	}
	return end.Sub(start)
}

// readiness polls each gateway's /readyz every 200 ms (each poll gives up
// after a second) and keeps every answer: when the poll began, and whether
// it was a 200.
type readiness struct {
	mu      sync.Mutex
	samples [][]sample
	every   time.Duration
}

type sample struct {
	at time.Time
	ok bool
}

// unready is how long gateway g was not ready within [from, to): each
// failed poll counts until the next poll began.
func (rd *readiness) unready(g int, from, to time.Time) time.Duration {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	ss := rd.samples[g]
	var d time.Duration
	for i, s := range ss {
		if s.ok {
			continue
		}
		end := s.at.Add(rd.every)
		if i+1 < len(ss) {
			end = ss[i+1].at
		}
		lo, hi := s.at, end
		if lo.Before(from) {
			lo = from
		}
		if hi.After(to) {
			hi = to
		}
		if hi.After(lo) {
			d += hi.Sub(lo)
		}
	}
	return d
}

func (r *runner) watchReadiness(ctx context.Context) (*readiness, func()) {
	rd := &readiness{samples: make([][]sample, len(r.gateways)), every: 200 * time.Millisecond}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	client := &http.Client{Timeout: time.Second}
	for i, g := range r.gateways {
		url := "http://" + g.listen + "/readyz"
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(rd.every):
				}
				at, ok := time.Now(), false
				if resp, err := client.Get(url); err == nil {
					ok = resp.StatusCode == http.StatusOK
					resp.Body.Close()
				}
				rd.mu.Lock()
				rd.samples[i] = append(rd.samples[i], sample{at: at, ok: ok})
				rd.mu.Unlock()
			}
		})
	}
	return rd, func() { cancel(); wg.Wait() }
}

// costs fills each event's window from the broker's answers and the
// gateways' readiness; settled is when the broker was done.
func costs(events []EventRecord, answers []pushsim.Answer, rd *readiness, settled time.Time) {
	for i := range events {
		e := &events[i]
		end := settled
		if i+1 < len(events) && events[i+1].Start.Before(end) {
			end = events[i+1].Start
		}
		if lim := e.Start.Add(maxWindow); lim.Before(end) {
			end = lim
		}
		if end.Before(e.Start) {
			end = e.Start
		}
		e.Window = end.Sub(e.Start)
		e.NackedStatuses = map[int]int{}
		e.Recovered = recovered(answers, e.Start, end)
		for _, a := range answers {
			if a.At.Before(e.Start) || !a.At.Before(end) {
				continue
			}
			if pushsim.IsAck(a.Status) {
				e.Acked++
				continue
			}
			after := a.At.Sub(e.Start)
			if e.Nacked == 0 {
				e.FirstNack = after
			}
			if after < e.Recovered {
				e.NackedBefore++
			}
			e.Nacked++
			e.LastNack = after
			e.NackedStatuses[a.Status]++
		}
		if rd == nil {
			continue
		}
		e.Unready = make([]time.Duration, len(rd.samples))
		for g := range rd.samples {
			e.Unready[g] = rd.unready(g, e.Start, end)
		}
	}
}
