package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/ackgate/ackgate/gate"
)

// DueClaimer hands out indeterminate operations of a lookup route whose
// check is due, each to one replica: storage.Maintenance.ClaimDue.
type DueClaimer interface {
	// ClaimDue claims up to limit operations of route due for a check (never
	// checked and unchanged for interval, or past their next check) and
	// moves their next check horizon ahead, so no other replica takes them
	// meanwhile.
	ClaimDue(ctx context.Context, route string, interval, horizon time.Duration, limit int) ([]gate.Operation, error)
}

// Settler asks a route's lookup about one operation and records the answer
// under the operation's lease: (*gate.Gate).Reconcile.
type Settler interface {
	Reconcile(ctx context.Context, route *gate.Route, op *gate.Operation) (gate.Plan, error)
}

// LookupRecorder counts the reconciler's work for metrics.
type LookupRecorder interface {
	// Reconciled is called once per operation the reconciler took up, with
	// what became of it (see the Outcome constants).
	Reconciled(ctx context.Context, route string, outcome string, took time.Duration)
}

// What became of one operation the reconciler took up.
const (
	// OutcomeFound: the lookup found the effect; the operation is confirmed.
	OutcomeFound = "found"
	// OutcomeAbsent: the effect is not there; one attempt is granted.
	OutcomeAbsent = "absent"
	// OutcomeUnavailable: the lookup could not tell; checked again later.
	OutcomeUnavailable = "unavailable"
	// OutcomeHeld: a delivery or an operator holds the lease; skipped.
	OutcomeHeld = "held"
	// OutcomeRefused: the operation changed meanwhile; nothing written.
	OutcomeRefused = "refused"
	// OutcomeError: Redis, Postgres or the gate failed; tried again later.
	OutcomeError = "error"
)

// maxClaim bounds the operations one replica claims per route and tick.
const maxClaim = 100

// claimSlack is added to the time a claimed batch needs: the claim must
// outlast the lease, the lookup and the write of its last operation.
const claimSlack = 30 * time.Second

// Reconciler settles the indeterminate lane of lookup routes. Every replica
// runs one; the ledger shares the due operations out among them, and each
// operation's lease keeps a reconciler and a delivery from both writing.
// Only lookup routes are ever worked: an unsafe effect is settled by a
// person, and idempotent or repeatable routes have nothing to ask.
type Reconciler struct {
	claims   DueClaimer
	settle   Settler
	recorder LookupRecorder
	log      *slog.Logger
	poll     time.Duration
	routes   []*gate.Route
	pacers   map[string]*rate.Limiter
}

// ReconcilerOptions builds a Reconciler.
type ReconcilerOptions struct {
	Claims  DueClaimer
	Settler Settler
	// Routes are all the gateway's routes; only lookup routes are worked.
	Routes []*gate.Route
	// Poll is how often this replica looks for due operations.
	Poll     time.Duration
	Recorder LookupRecorder
	Logger   *slog.Logger
}

// NewReconciler keeps the lookup routes of o.Routes, each with a pacer at
// its Reconcile.RatePerSecond.
func NewReconciler(o ReconcilerOptions) (*Reconciler, error) {
	if o.Claims == nil || o.Settler == nil {
		return nil, errors.New("recovery: a reconciler needs Claims and Settler")
	}
	if o.Poll <= 0 {
		return nil, fmt.Errorf("recovery: reconciler poll %s must be positive", o.Poll)
	}
	r := &Reconciler{claims: o.Claims, settle: o.Settler, recorder: o.Recorder, log: o.Logger,
		poll: o.Poll, pacers: map[string]*rate.Limiter{}}
	if r.log == nil {
		r.log = slog.Default()
	}
	for _, rt := range o.Routes {
		if (rt.Shape != gate.ShapeLookup && rt.Shape != gate.ShapeHandoff) || rt.Effect.LookupURL == "" {
			continue
		}
		if rt.Reconcile.Interval <= 0 || rt.Reconcile.RatePerSecond <= 0 {
			return nil, fmt.Errorf("recovery: route %q has no reconcile policy", rt.Name)
		}
		r.routes = append(r.routes, rt)
		r.pacers[rt.Name] = newPacer(rt.Reconcile.RatePerSecond)
	}
	return r, nil
}

// Routes are the routes this reconciler works.
func (r *Reconciler) Routes() []*gate.Route { return r.routes }

// Run reconciles every Poll until ctx ends.
func (r *Reconciler) Run(ctx context.Context) {
	if len(r.routes) == 0 {
		return
	}
	every(ctx, r.poll, r.log, "reconciler", r.Tick)
}

// Tick claims each lookup route's due operations and settles them, routes
// side by side, each at its own pace. It returns the routes' errors
// (claims that failed); an operation that could not be settled is counted
// and left for a later tick.
func (r *Reconciler) Tick(ctx context.Context) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, rt := range r.routes {
		wg.Go(func() {
			if err := r.route(ctx, rt); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("route %s: %w", rt.Name, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// batch is how many operations of rt one tick claims: what its pace allows
// in one poll period, at least one.
func (r *Reconciler) batch(rt *gate.Route) int {
	n := math.Ceil(rt.Reconcile.RatePerSecond * r.poll.Seconds())
	return int(min(max(n, 1), maxClaim))
}

// horizon is how long a claim keeps other replicas away: the time the
// batch takes at the route's pace, plus one lookup's lease and a margin.
func (r *Reconciler) horizon(rt *gate.Route, n int) time.Duration {
	pace := time.Duration(float64(n) / rt.Reconcile.RatePerSecond * float64(time.Second))
	return pace + rt.Effect.Timeout + 2*claimSlack
}

func (r *Reconciler) route(ctx context.Context, rt *gate.Route) error {
	n := r.batch(rt)
	ops, err := r.claims.ClaimDue(ctx, rt.Name, rt.Reconcile.Interval, r.horizon(rt, n), n)
	if err != nil {
		return err
	}
	p := r.pacers[rt.Name]
	for i := range ops {
		if err := p.Wait(ctx); err != nil {
			return nil // shutting down: the claims lapse and another tick takes them
		}
		r.one(ctx, rt, &ops[i])
	}
	return nil
}

// newPacer is a route's pace of lookups: a token bucket
// (golang.org/x/time/rate) at rps per second on average, with bursts of up
// to rps (at least one) after a quiet spell.
func newPacer(rps float64) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(rps), int(max(1, rps)))
}

// settleGrace bounds how long a lookup already under way may take to be
// written down once the replica is shutting down.
const settleGrace = 10 * time.Second

func (r *Reconciler) one(ctx context.Context, rt *gate.Route, op *gate.Operation) {
	start := time.Now()
	// A lookup that was asked is recorded even when shutdown begins
	// meanwhile: the record must hold every question put to the provider.
	// Shutdown waits for it, bounded by the lookup's own timeout.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rt.Effect.Timeout+settleGrace)
	defer cancel()
	plan, err := r.settle.Reconcile(sctx, rt, op)
	outcome := OutcomeError
	switch {
	case err == nil:
		switch plan.Action {
		case gate.ActConfirm:
			outcome = OutcomeFound
		case gate.ActGrant:
			outcome = OutcomeAbsent
		default:
			outcome = OutcomeUnavailable
		}
	case errors.Is(err, gate.ErrHeld):
		outcome = OutcomeHeld
	case errors.Is(err, gate.ErrRefused):
		outcome = OutcomeRefused
	}
	if outcome == OutcomeError && ctx.Err() == nil {
		r.log.Warn("reconcile failed; the operation is checked again later", "route", rt.Name,
			"operation", op.ID, "err", err)
	}
	if r.recorder != nil {
		r.recorder.Reconciled(ctx, rt.Name, outcome, time.Since(start))
	}
}
