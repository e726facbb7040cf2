package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// Outbox is the handoff routes' queue in the ledger: storage.Ledger.
type Outbox interface {
	// ClaimOutboxEach takes up to want[route] due entries of each route in
	// one statement and keeps every other relay away from them for horizon.
	ClaimOutboxEach(ctx context.Context, want map[string]int, horizon time.Duration) ([]*gate.OutboxEntry, error)
	// RescheduleOutbox sets when entry id is due again, unless its schedule
	// moved since the claim that set it to claimed.
	RescheduleOutbox(ctx context.Context, id string, claimed, at time.Time) error
	// SweepOutbox empties up to limit entries whose effect is evidenced.
	SweepOutbox(ctx context.Context, limit int) (int, error)
}

// Relayer makes the next step of an entry's operation under its lease:
// (*gate.Gate).Relay.
type Relayer interface {
	Relay(ctx context.Context, route *gate.Route, e *gate.OutboxEntry) (*gate.Result, error)
}

// RelayRecorder counts the relay's work for metrics.
type RelayRecorder interface {
	// Relayed is called once per pass, with what became of the entry (see
	// the Relay outcome constants).
	Relayed(ctx context.Context, route, outcome string, took time.Duration)
	// RelayFailed counts a failure of the relay's own bookkeeping: a claim,
	// a sweep or a reschedule the ledger refused.
	RelayFailed(ctx context.Context, stage string)
	// RelayLimit is called with a route's concurrency limit whenever a
	// round of the relay reads it.
	RelayLimit(ctx context.Context, route string, limit int)
}

// What became of one entry a relay pass took up.
const (
	// RelayAcked: the effect is evidenced; the sweep empties the entry.
	RelayAcked = "acked"
	// RelayDeadLettered: the attempts ran out; the operation is terminal
	// with its dead letter, and the entry keeps the message for a replay.
	RelayDeadLettered = "dead_lettered"
	// RelayRetry: the operation is still open (a documented failure, a busy
	// lease); the entry is due again after a jittered backoff.
	RelayRetry = "retry"
	// RelayParked: the effect's outcome is unknown and the route cannot
	// find it out by itself; the operation waits in the indeterminate lane
	// and the relay takes the entry up only if an operator grants an attempt.
	RelayParked = "parked"
	// RelayError: Redis, Postgres or the gate failed; tried again shortly.
	RelayError = "error"
)

// Stages of the relay's own failures.
const (
	StageClaim      = "claim"
	StageSweep      = "sweep"
	StageReschedule = "reschedule"
)

// relaySlack is what a claim's horizon keeps beyond the longest a pass can
// take (its route's relay deadline): the time to record the acknowledgment
// and release the lease, so that no other relay takes the entry while its
// pass is still writing.
const relaySlack = 10 * time.Second

// sweepBatch bounds the entries one sweep statement empties.
const sweepBatch = 500

// errorWait caps the wait after a pass that failed on the gateway's own
// dependencies: they usually come back quickly, and the claim's horizon
// already holds the entry if the reschedule fails as well.
const errorWait = 5 * time.Second

// Relay delivers the outbox entries of handoff routes. Every replica runs
// one, without a leader: the ledger hands each due entry to one relay
// (FOR UPDATE SKIP LOCKED, with a horizon longer than a pass can take), and
// the operation's lease and fence keep a relay and a delivery of the same
// message from both writing. A pass is the gate's Relay, so the idempotency
// key, the evidence before the mark, the attempt limit and the
// reconciliation after a lost response are those of a push.
//
// How many passes of one route run at once follows its downstream
// (RelayLimits): more while its calls keep their speed, fewer when it
// answers 429 or 503 or stops answering in time. Each round claims what
// every route has room for in one statement.
type Relay struct {
	outbox      Outbox
	relayer     Relayer
	recorder    RelayRecorder
	log         *slog.Logger
	poll        time.Duration
	concurrency int
	limits      *RelayLimits
	now         func() time.Time
	routes      map[string]*gate.Route
	names       []string
	horizon     time.Duration
	jitter      func(time.Duration) time.Duration
	wake        <-chan struct{}
}

// RelayOptions builds a Relay.
type RelayOptions struct {
	Outbox  Outbox
	Relayer Relayer
	// Routes are all the gateway's routes; only handoff routes are relayed.
	Routes []*gate.Route
	// Poll is how long the relay waits before looking again after a look
	// that found nothing due; while it finds work it looks again at once.
	Poll time.Duration
	// Concurrency is the most entries of one route this replica relays at
	// once; below it the route's limit adapts to its downstream.
	Concurrency int
	// Limits are the routes' adaptive limits, fed by the effects the
	// Relayer calls through Limits.Observe; nil builds limits that nothing
	// feeds, which stay at their start.
	Limits   *RelayLimits
	Recorder RelayRecorder
	Logger   *slog.Logger
	// Now is the clock of the reschedules; nil means time.Now.
	Now func() time.Time
	// Wake, when set, ends a wait for the next poll: the ledger of this
	// process sends on it when it commits an outbox entry, so a handoff is
	// relayed at once rather than up to Poll later. Entries handed off by
	// other replicas still wait for the poll.
	Wake <-chan struct{}
}

// NewRelay keeps the handoff routes of o.Routes.
func NewRelay(o RelayOptions) (*Relay, error) {
	if o.Outbox == nil || o.Relayer == nil {
		return nil, errors.New("recovery: a relay needs Outbox and Relayer")
	}
	if o.Poll <= 0 {
		return nil, fmt.Errorf("recovery: relay poll %s must be positive", o.Poll)
	}
	if o.Concurrency < 1 {
		return nil, fmt.Errorf("recovery: relay concurrency %d must be at least 1", o.Concurrency)
	}
	r := &Relay{outbox: o.Outbox, relayer: o.Relayer, recorder: o.Recorder, log: o.Logger, poll: o.Poll,
		concurrency: o.Concurrency, limits: o.Limits, now: o.Now, routes: map[string]*gate.Route{}, jitter: equalJitter,
		wake: o.Wake}
	if r.limits == nil {
		r.limits = NewRelayLimits(o.Routes, o.Concurrency)
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	if r.now == nil {
		r.now = time.Now
	}
	for _, rt := range o.Routes {
		if rt.Shape != gate.ShapeHandoff {
			continue
		}
		r.routes[rt.Name] = rt
		r.names = append(r.names, rt.Name)
		r.horizon = max(r.horizon, gate.RelayRoute(rt).AckDeadline+relaySlack)
	}
	return r, nil
}

// Routes are the names of the routes this relay works.
func (r *Relay) Routes() []string { return r.names }

// Horizon is how long a claimed entry is kept from every other relay: the
// longest pass of any handoff route (its effect timeout and the time to
// record it) plus a margin, so a live pass is never overlapped.
func (r *Relay) Horizon() time.Duration { return r.horizon }

// Run relays until ctx ends and returns once the passes under way have
// recorded what they did. Each round claims, in one statement, what every
// route has room for under its limit; a route waits until a quarter of its
// limit is free (or none of its passes runs) before it claims again, so
// claims come in batches rather than one entry per finished pass. A round
// that finds less than it asked for has emptied the due entries, and the
// next one comes after Poll, or sooner when Wake says an entry was handed
// off.
func (r *Relay) Run(ctx context.Context) {
	if len(r.names) == 0 {
		return
	}
	var passes sync.WaitGroup
	defer passes.Wait()
	freed := make(chan struct{}, 1)
	var lastSweep time.Time
	for {
		want := r.wanted(ctx, true)
		if len(want) == 0 {
			// Every route is busy: wait for a pass to end.
			select {
			case <-freed:
				continue
			case <-ctx.Done():
				return
			}
		}
		got, err := r.claim(ctx, want)
		r.start(ctx, &passes, got, freed)
		if time.Since(lastSweep) >= r.poll {
			r.sweep(ctx)
			lastSweep = time.Now()
		}
		if err == nil && len(got) == total(want) {
			continue // every route got all it asked for: there may be more
		}
		if err != nil && ctx.Err() == nil {
			r.log.Warn("relay claim failed; trying again after the poll interval", "err", err, "poll", r.poll.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.poll):
		case <-r.wake:
		}
	}
}

// Tick is one round: it empties the evidenced entries, claims up to
// Concurrency due entries of each route (the most its limit may reach,
// whatever the limit is now), and relays them side by side, returning once
// every pass has recorded what it did. It reports how many entries it took
// up.
func (r *Relay) Tick(ctx context.Context) (int, error) {
	if len(r.names) == 0 {
		return 0, nil
	}
	r.sweep(ctx)
	got, err := r.claim(ctx, r.wanted(ctx, false))
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	r.start(ctx, &wg, got, nil)
	wg.Wait()
	return len(got), nil
}

// wanted is how many entries of each route a round claims: with adapt,
// its room under its limit, once that is at least a quarter of the limit
// or nothing of the route runs; without, Concurrency.
func (r *Relay) wanted(ctx context.Context, adapt bool) map[string]int {
	want := make(map[string]int, len(r.names))
	for _, name := range r.names {
		if !adapt {
			want[name] = r.concurrency
			continue
		}
		lim := r.limits.of(name)
		limit, room, running := lim.state()
		if r.recorder != nil {
			r.recorder.RelayLimit(ctx, name, limit)
		}
		if room > 0 && (room >= max(1, limit/4) || running == 0) {
			want[name] = room
		}
	}
	return want
}

func total(want map[string]int) int {
	n := 0
	for _, v := range want {
		n += v
	}
	return n
}

// start runs a pass for every entry in got, each counted in flight under its
// route's limit until it ends; freed, when set, is told of every end.
func (r *Relay) start(ctx context.Context, passes *sync.WaitGroup, got []*gate.OutboxEntry, freed chan<- struct{}) {
	for _, e := range got {
		lim := r.limits.of(e.Route)
		lim.Take(1)
		passes.Go(func() {
			defer func() {
				lim.Release()
				if freed != nil {
					select {
					case freed <- struct{}{}:
					default:
					}
				}
			}()
			r.pass(ctx, e)
		})
	}
}

func (r *Relay) claim(ctx context.Context, want map[string]int) ([]*gate.OutboxEntry, error) {
	got, err := r.outbox.ClaimOutboxEach(ctx, want, r.horizon)
	if err != nil {
		r.failed(ctx, StageClaim)
		return nil, fmt.Errorf("claim outbox: %w", err)
	}
	return got, nil
}

func (r *Relay) sweep(ctx context.Context) {
	for {
		n, err := r.outbox.SweepOutbox(ctx, sweepBatch)
		if err != nil {
			if ctx.Err() == nil {
				r.failed(ctx, StageSweep)
				r.log.Warn("outbox sweep failed; trying again on the next poll", "err", err)
			}
			return
		}
		if n < sweepBatch {
			return
		}
	}
}

func (r *Relay) failed(ctx context.Context, stage string) {
	if r.recorder != nil {
		r.recorder.RelayFailed(ctx, stage)
	}
}

// pass relays entry e once and decides when it is due again.
func (r *Relay) pass(ctx context.Context, e *gate.OutboxEntry) {
	start := time.Now()
	rt := r.routes[e.Route]
	if rt == nil {
		// The claim names only known routes; this is a programming error,
		// and the entry stays in the outbox for a gateway that knows it.
		r.log.Error("relay claimed an entry of a route it does not relay", "route", e.Route, "operation", e.OperationID)
		return
	}
	// A call that was made is recorded even when shutdown begins
	// meanwhile, within the pass's own deadline; the horizon covers it.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.horizon-relaySlack/2)
	defer cancel()
	var (
		res *gate.Result
		err error
	)
	if e.Unopened != nil {
		// Its private values are sealed under a key this gateway does not
		// hold: no call is made with what is left, and restoring the key
		// (GATEWAY_OUTBOX_OLD_KEYS) lets a later pass deliver it.
		err = e.Unopened
		r.log.Error("relay cannot open an outbox entry's sealed values; it is taken up again later", "route", rt.Name,
			"operation", e.OperationID, "err", err)
	} else {
		res, err = r.relayer.Relay(pctx, rt, e)
	}
	outcome := RelayError
	var wait time.Duration
	switch {
	case err != nil:
		wait = min(gate.RelayBackoff(rt, 1), errorWait)
		if errors.Is(err, gate.ErrNotFound) {
			// The operation was removed (its retention ran out): nothing
			// is left to relay, and the entry went with it.
			wait = 0
		}
	case res.Decision == gate.Ack && res.State == gate.StateTerminalFailure:
		outcome = RelayDeadLettered
	case res.Decision == gate.Ack:
		outcome = RelayAcked
	case res.State == gate.StateEffectIndeterminate:
		// Out of the claimable states: only an operator's grant brings the
		// entry back, and then after the route's shortest wait.
		outcome, wait = RelayParked, gate.RelayBackoff(rt, 1)
	default:
		outcome, wait = RelayRetry, gate.RelayBackoff(rt, e.Passes)
	}
	if res != nil {
		res.Finish(pctx, r.log, true)
	}
	if err != nil && pctx.Err() == nil && e.Unopened == nil {
		r.log.Warn("relay pass failed; the entry is taken up again later", "route", rt.Name,
			"operation", e.OperationID, "err", err)
	}
	if wait > 0 {
		at := r.now().Add(r.jitter(wait))
		if rerr := r.outbox.RescheduleOutbox(pctx, e.OperationID, e.NextAttemptAt, at); rerr != nil {
			// The claim's horizon holds the entry until it is due anyway.
			r.failed(ctx, StageReschedule)
			r.log.Warn("relay could not reschedule an entry; it is due again after the claim horizon",
				"route", rt.Name, "operation", e.OperationID, "err", rerr)
		}
	}
	if r.recorder != nil {
		r.recorder.Relayed(ctx, rt.Name, outcome, time.Since(start))
	}
}

// equalJitter is d's "equal jitter": half of it fixed, the other half at
// random. The waits of entries that failed together spread apart, yet
// none retries sooner than half its backoff or later than the whole.
func equalJitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// OutboxStat is one route's undelivered entries: how many, since when the
// oldest waits, and since when the oldest of those the relay may take now
// has been due (zero when none is due): the relay's lag.
type OutboxStat struct {
	Route     string
	Depth     int64
	Oldest    time.Time
	OldestDue time.Time
}

// OutboxSnapshot is the outbox as one refresh counted it.
type OutboxSnapshot struct {
	// At is when the count was taken; zero before the first one.
	At    time.Time
	Stats []OutboxStat
}

// OutboxDepth keeps the outbox gauges' numbers, counted in the background
// like the lanes' (see Lanes): a scrape never queries the ledger. Entries
// of a route no handoff route of this gateway names are logged once per
// refresh: they wait for a gateway that has the route.
type OutboxDepth struct {
	count func(context.Context) ([]OutboxStat, error)
	known map[string]bool
	log   *slog.Logger

	mu   sync.RWMutex
	snap OutboxSnapshot
}

// NewOutboxDepth counts with count, one statement over the ledger; routes
// are the gateway's routes.
func NewOutboxDepth(count func(context.Context) ([]OutboxStat, error), routes []*gate.Route, log *slog.Logger) (*OutboxDepth, error) {
	if count == nil {
		return nil, errors.New("recovery: the outbox gauges need a count")
	}
	if log == nil {
		log = slog.Default()
	}
	known := map[string]bool{}
	for _, rt := range routes {
		if rt.Shape == gate.ShapeHandoff {
			known[rt.Name] = true
		}
	}
	return &OutboxDepth{count: count, known: known, log: log}, nil
}

// Refresh counts the outbox now and replaces the snapshot.
func (o *OutboxDepth) Refresh(ctx context.Context) error {
	at := time.Now()
	stats, err := o.count(ctx)
	if err != nil {
		return err
	}
	for _, s := range stats {
		if !o.known[s.Route] {
			o.log.Warn("the outbox holds entries of a route this gateway does not relay; they wait for a gateway that has it as a handoff route",
				"route", s.Route, "entries", s.Depth, "oldest", s.Oldest)
		}
	}
	o.mu.Lock()
	o.snap = OutboxSnapshot{At: at, Stats: stats}
	o.mu.Unlock()
	return nil
}

// Snapshot is the latest count; it never touches the ledger.
func (o *OutboxDepth) Snapshot() OutboxSnapshot {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.snap
}

// Run refreshes every period until ctx ends.
func (o *OutboxDepth) Run(ctx context.Context, period time.Duration) {
	if len(o.known) == 0 {
		return
	}
	every(ctx, period, o.log, "outbox gauges refresh", o.Refresh)
}
