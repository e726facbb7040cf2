package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// ExpiredStore removes evidence whose retention has run out:
// storage.Maintenance.
type ExpiredStore interface {
	// PurgeBatch deletes up to limit settled operations past their
	// retention, with their rows, in one short transaction, and returns
	// their ids by route.
	PurgeBatch(ctx context.Context, limit int) (map[string][]string, error)
	// KeptOpen counts, per route, operations past their retention that are
	// not settled and therefore kept.
	KeptOpen(ctx context.Context) (map[string]int64, error)
	// PurgePoison deletes up to limit poison records of route (or, with
	// others set, of every route not in others) last seen before cutoff.
	PurgePoison(ctx context.Context, route string, others []string, cutoff time.Time, limit int) (int64, error)
}

// Forgetter drops what the reservation store keeps for operations that no
// longer exist: storage.Reservations.Forget.
type Forgetter interface {
	Forget(ctx context.Context, keys []string) error
}

// PurgeRecorder reports the purge's progress for metrics.
type PurgeRecorder interface {
	// PurgedOperations counts operations of route removed.
	PurgedOperations(ctx context.Context, route string, n int64)
	// PurgedPoison counts poison records removed.
	PurgedPoison(ctx context.Context, n int64)
	// PurgeFinished is called after each complete run with its end time
	// and the operations past retention kept because they are not settled.
	PurgeFinished(ctx context.Context, at time.Time, keptOpen map[string]int64)
}

// DefaultPurgeBatch is how many operations one purge statement removes:
// small enough that its transaction and locks last milliseconds.
const DefaultPurgeBatch = 500

// Purger removes expired evidence. Every replica may run one at once: each
// batch takes its rows with FOR UPDATE SKIP LOCKED, so two purgers remove
// different rows and never wait for each other, and each batch is its own
// short transaction, so deliveries never queue behind a long one.
//
// Only settled operations go: acknowledged, terminal or conflicting. An
// operation past its retention that is still open, indeterminate, or
// confirmed without its ack recorded is kept and counted instead
// (PurgeRecorder.PurgeFinished), because its record is the only thing that
// tells a redelivery it is not new; it leaves when it settles, or by an
// operator's hand.
type Purger struct {
	store    ExpiredStore
	forget   Forgetter
	recorder PurgeRecorder
	log      *slog.Logger
	routes   []*gate.Route
	batch    int
	every    time.Duration
	now      func() time.Time
}

// PurgerOptions builds a Purger.
type PurgerOptions struct {
	Store ExpiredStore
	// Forget, when set, drops the Redis keys of every purged operation.
	Forget Forgetter
	// Routes give each route's retention, which is also its poison records'.
	Routes []*gate.Route
	// Batch is the operations per statement (DefaultPurgeBatch when 0).
	Batch int
	// Every is the pause between runs.
	Every    time.Duration
	Recorder PurgeRecorder
	Logger   *slog.Logger
	Now      func() time.Time
}

// NewPurger checks o.
func NewPurger(o PurgerOptions) (*Purger, error) {
	if o.Store == nil {
		return nil, errors.New("recovery: a purger needs a Store")
	}
	if o.Every <= 0 {
		return nil, fmt.Errorf("recovery: purge interval %s must be positive", o.Every)
	}
	p := &Purger{store: o.Store, forget: o.Forget, recorder: o.Recorder, log: o.Logger,
		routes: o.Routes, batch: o.Batch, every: o.Every, now: o.Now}
	if p.batch <= 0 {
		p.batch = DefaultPurgeBatch
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	if p.now == nil {
		p.now = time.Now
	}
	return p, nil
}

// Run purges every Every until ctx ends.
func (p *Purger) Run(ctx context.Context) { every(ctx, p.every, p.log, "purge", p.RunOnce) }

// RunOnce purges in batches until nothing expired is left, then the poison
// records, then counts what it kept.
func (p *Purger) RunOnce(ctx context.Context) error {
	for {
		n, err := p.Batch(ctx)
		if err != nil {
			return err
		}
		if n < p.batch {
			break
		}
	}
	if err := p.poison(ctx); err != nil {
		return err
	}
	kept, err := p.store.KeptOpen(ctx)
	if err != nil {
		return err
	}
	for route, n := range kept {
		p.log.Debug("operations past retention kept because they are not settled", "route", route, "n", n)
	}
	if p.recorder != nil {
		p.recorder.PurgeFinished(ctx, p.now(), kept)
	}
	return nil
}

// Batch runs one purge statement and drops the purged operations' Redis
// keys; it returns how many operations it removed. Redis failing is logged,
// not returned: the rows are gone, and the keys expire by their TTL anyway.
func (p *Purger) Batch(ctx context.Context) (int, error) {
	byRoute, err := p.store.PurgeBatch(ctx, p.batch)
	if err != nil {
		return 0, err
	}
	var (
		n   int
		ids []string
	)
	for route, list := range byRoute {
		n += len(list)
		ids = append(ids, list...)
		if p.recorder != nil {
			p.recorder.PurgedOperations(ctx, route, int64(len(list)))
		}
	}
	if p.forget != nil && len(ids) > 0 {
		if err := p.forget.Forget(ctx, ids); err != nil {
			p.log.Warn("purged operations' Redis keys not dropped; they expire by their TTL", "n", len(ids), "err", err)
		}
	}
	return n, nil
}

// poison removes poison records last seen longer ago than their route's
// retention; those of routes no longer configured go after the longest.
func (p *Purger) poison(ctx context.Context) error {
	now := p.now()
	var (
		longest time.Duration
		names   = []string{}
	)
	drain := func(route string, others []string, cutoff time.Time) error {
		for {
			n, err := p.store.PurgePoison(ctx, route, others, cutoff, p.batch)
			if err != nil {
				return err
			}
			if n > 0 && p.recorder != nil {
				p.recorder.PurgedPoison(ctx, n)
			}
			if n < int64(p.batch) {
				return nil
			}
		}
	}
	for _, r := range p.routes {
		names = append(names, r.Name)
		longest = max(longest, r.Retention)
		if r.Retention <= 0 {
			continue
		}
		if err := drain(r.Name, nil, now.Add(-r.Retention)); err != nil {
			return err
		}
	}
	if longest <= 0 {
		return nil
	}
	return drain("", names, now.Add(-longest))
}
