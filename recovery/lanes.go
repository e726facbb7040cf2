package recovery

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// LaneStat is how many operations of a route wait in one lane state, and
// when the oldest of them was created.
type LaneStat struct {
	Route  string
	State  gate.State
	N      int64
	Oldest time.Time
}

// LaneSnapshot is the lanes as one refresh counted them.
type LaneSnapshot struct {
	// At is when the count was taken; zero before the first one.
	At    time.Time
	Stats []LaneStat
}

// Lanes keeps the lane gauges' numbers. A scrape reads the snapshot and
// never the ledger: counting on every scrape would put a query per scraper
// and replica on Postgres, growing with the ledger. A background refresh
// runs the count every period instead, so the gauges are at most that old
// (the snapshot's age is a gauge of its own).
type Lanes struct {
	count func(context.Context) ([]LaneStat, error)
	log   *slog.Logger
	now   func() time.Time

	mu   sync.RWMutex
	snap LaneSnapshot
}

// NewLanes counts with count, which must be one statement over the ledger.
func NewLanes(count func(context.Context) ([]LaneStat, error), log *slog.Logger) (*Lanes, error) {
	if count == nil {
		return nil, errors.New("recovery: lanes need a count")
	}
	if log == nil {
		log = slog.Default()
	}
	return &Lanes{count: count, log: log, now: time.Now}, nil
}

// Refresh counts the lanes now and replaces the snapshot.
func (l *Lanes) Refresh(ctx context.Context) error {
	at := l.now()
	stats, err := l.count(ctx)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.snap = LaneSnapshot{At: at, Stats: stats}
	l.mu.Unlock()
	return nil
}

// Snapshot is the latest count; it never touches the ledger.
func (l *Lanes) Snapshot() LaneSnapshot {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.snap
}

// Run refreshes every period until ctx ends.
func (l *Lanes) Run(ctx context.Context, period time.Duration) {
	every(ctx, period, l.log, "lane gauges refresh", l.Refresh)
}
