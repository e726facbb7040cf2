package gate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
)

// Recovery is evidence that arrives outside any delivery: an operator who
// found out what happened, or a lookup the reconciler made. Its rows of the
// decision table are below, as pure functions like the rest; the two
// executors at the end only carry them out, under the operation's lease
// like any other writer, so a resolution and a running owner can never both
// record an outcome.

const (
	// ActGrant: reopen the operation (pending_effect) with exactly one
	// attempt allowed, which the next delivery makes under the same
	// identity and idempotency key.
	ActGrant Action = "grant"
	// ActCheckLater: the lookup could not tell; the operation stays in the
	// lane and is checked again later.
	ActCheckLater Action = "check_later"
)

var (
	// ErrInvalidResolution: the request itself is malformed (a 400).
	ErrInvalidResolution = errors.New("invalid resolution")
	// ErrRefused: the request makes no sense in the operation's state, or
	// the operation changed while it was being applied; nothing was written.
	ErrRefused = errors.New("refused")
)

// MaxActor bounds who an intervention names.
const MaxActor = 256

// Check reports a resolution the ledger must not record, wrapping
// ErrInvalidResolution.
func (r Resolution) Check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidResolution, fmt.Sprintf(format, a...))
	}
	switch r.Kind {
	case ResolveHappened, ResolveNotHappened, ResolveAbandon, ResolveReplay, ResolveCancel, OutboxRetryNow:
	default:
		return bad("kind must be happened, not_happened, abandon, replay or cancel, not %q", Bound(string(r.Kind), 64))
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{{"reason", r.Reason, MaxReason}, {"actor", r.Actor, MaxActor}, {"result_id", r.ResultID, MaxReason}} {
		if f.name != "result_id" && strings.TrimSpace(f.v) == "" {
			return bad("%s is required", f.name)
		}
		if len(f.v) > f.max {
			return bad("%s is longer than %d bytes", f.name, f.max)
		}
		if why := Unstorable(f.v); why != "" {
			return bad("%s %s", f.name, why)
		}
	}
	if (r.Kind == ResolveHappened) != (r.ResultID != "") {
		if r.Kind == ResolveHappened {
			return bad("happened needs the effect's result_id as its evidence")
		}
		return bad("only happened carries a result_id")
	}
	return nil
}

// DecideResolution is the table's rows for an operator's resolution:
//
//	resolution    from                                   path                 then
//	happened      effect_indeterminate, terminal_failure → effect_confirmed   the next delivery acks
//	not_happened  effect_indeterminate                   → pending_effect     one attempt granted
//	abandon       effect_indeterminate                   → terminal_failure   dead-lettered under policy gateway
//	replay        terminal_failure                       → pending_effect     one attempt granted
//	cancel        open and handed off, no attempt in doubt → terminal_failure dead-lettered; a replay hands it back
//	anything else                                        refused: nothing written
//
// Open operations (received, reserved, pending_effect) are refused because
// an owner may be calling the downstream right now: no one can know yet.
// Cancel is the exception, for a handed-off operation whose only owner is
// the relay: Resolve applies it under the operation's lease, so no relay
// pass is at work meanwhile, and it is refused when an earlier attempt left
// no outcome, since that effect may have happened.
func DecideResolution(op *Operation, r Resolution) (Plan, error) {
	refuse := func(why string) (Plan, error) {
		return Plan{}, fmt.Errorf("%w: %s is %s: %s", ErrRefused, op.ID, op.State, why)
	}
	reason := fmt.Sprintf("operator %s (%s): %s", r.Kind, r.Actor, r.Reason)
	switch r.Kind {
	case ResolveCancel:
		return decideCancel(op, reason, refuse)
	case OutboxRetryNow:
		return Plan{}, fmt.Errorf("%w: retry_now changes an outbox entry's schedule, not the operation; the ledger records it", ErrInvalidResolution)
	}
	switch {
	case op.State == StateConflicting:
		return refuse("a conflict record is never executed; resolve the original operation " + op.ConflictOf)
	case op.State.Confirmed():
		return refuse("the effect is already confirmed (" + op.ResultID + ")")
	case op.State != StateEffectIndeterminate && op.State != StateTerminalFailure:
		return refuse("the effect question is still open and an owner may be at work; wait until it settles")
	}
	switch r.Kind {
	case ResolveHappened:
		p := plan(ActConfirm, Ack, reason, StateEffectConfirmed)
		p.ResultID, p.AfterSent = r.ResultID, []State{StateAckPending, StateAcknowledged}
		return p, nil
	case ResolveNotHappened:
		if op.State != StateEffectIndeterminate {
			return refuse("not_happened settles an indeterminate effect; to try a terminal operation again, replay it")
		}
		return grant(reason), nil
	case ResolveAbandon:
		if op.State != StateEffectIndeterminate {
			return refuse("it has already ended")
		}
		return terminal(plan(ActExhaust, AnswerFor(StateTerminalFailure, op.DeadLetterPolicy), reason, StateTerminalFailure)), nil
	case ResolveReplay:
		if op.State != StateTerminalFailure {
			return refuse("only terminal operations are replayed; settle an indeterminate one with happened, not_happened or abandon")
		}
		return grant(reason), nil
	}
	return Plan{}, fmt.Errorf("%w: unknown kind %q", ErrInvalidResolution, r.Kind)
}

// decideCancel is DecideResolution's row for cancelling an outbox entry.
func decideCancel(op *Operation, reason string, refuse func(string) (Plan, error)) (Plan, error) {
	switch {
	case op.State == StateConflicting:
		return refuse("a conflict record has no outbox entry")
	case op.HandedOffAt == nil:
		return refuse("it was never handed off, so it has no outbox entry to cancel")
	case op.State.Confirmed():
		return refuse("the effect is already confirmed (" + op.ResultID + ")")
	case op.State == StateTerminalFailure:
		return refuse("its entry is already out of the relay's queue; replay it to hand it back")
	case op.State == StateEffectIndeterminate:
		return refuse("an attempt may have taken effect; settle it with happened, not_happened or abandon")
	}
	if a := op.LastAttempt; a != nil && (a.Outcome == "" || a.Outcome == OutcomeUnknown) {
		return refuse(fmt.Sprintf("attempt %d has no known outcome, so the effect may have happened; "+
			"wait until it is settled or parked as indeterminate", a.N))
	}
	return terminal(plan(ActExhaust, Ack, reason, StateTerminalFailure)), nil
}

func grant(reason string) Plan {
	p := plan(ActGrant, Nack, reason, StatePendingEffect)
	p.Grant = true
	return p
}

// Reconcilable says why the reconciler must leave op alone ("" when it may
// ask the lookup): only indeterminate operations of routes whose effect can
// be looked up, and was when the operation began — lookup routes, and
// handoff routes whose relay asks a lookup. An unsafe effect is never
// touched: nothing but a person can settle it.
func Reconcilable(r *Route, op *Operation) string {
	switch {
	case op.State != StateEffectIndeterminate:
		return "not indeterminate"
	case op.ConflictOf != "":
		return "a conflict record"
	case r == nil || op.Shape != r.Shape || (r.Shape != ShapeLookup && r.Shape != ShapeHandoff):
		return "not a lookup route"
	case r.Effect.LookupURL == "":
		return "the route has no lookup url"
	}
	return ""
}

// AfterCheck is the table's row for the reconciler's lookup of an
// indeterminate operation:
//
//	lookup answer   path                        then
//	found           → effect_confirmed          the next delivery acks
//	  (handed off)  → … → acknowledged          the broker was acked at the handoff
//	absent          → pending_effect            one attempt granted, same key
//	unavailable     —                           checked again at NextCheck
func AfterCheck(ev Evidence, res LookupResult) Plan {
	switch res.Outcome {
	case OutcomeConfirmed:
		p := plan(ActConfirm, Ack, "reconciler's lookup found the effect: "+res.ResultID, StateEffectConfirmed)
		p.ResultID, p.AfterSent = res.ResultID, []State{StateAckPending, StateAcknowledged}
		if ev.Op != nil && ev.Op.HandedOffAt != nil {
			// Its broker was acked at the handoff: nothing is left to send.
			p.Path, p.AfterSent = append(p.Path, p.AfterSent...), nil
		}
		return p
	case OutcomeAbsent:
		return grant("reconciler's lookup says the effect is absent: one attempt allowed with the same key")
	}
	why := res.Reason
	if why == "" {
		why = "no answer"
	}
	return plan(ActCheckLater, Nack, "reconciler's lookup could not tell: "+why)
}

// NextCheck is when an operation whose lookup could not tell for the
// checks-th time is asked again: the route's interval, doubled per check,
// at most its max interval.
func NextCheck(r *Route, checks int, now time.Time) time.Time {
	lo := max(r.Reconcile.Interval, time.Second)
	return now.Add(doubling(lo, max(r.Reconcile.MaxInterval, lo), checks))
}

// doubling is the n-th wait (from 1) of a backoff that starts at lo and
// doubles up to hi.
func doubling(lo, hi time.Duration, n int) time.Duration {
	wait := lo
	for i := 1; i < n && wait < hi; i++ {
		wait *= 2
	}
	return min(wait, hi)
}

// interventionTTL is the lease a resolution holds: it makes no call, so it
// needs only its few round trips.
const interventionTTL = 30 * time.Second

// Resolve applies an operator's resolution to operation id and returns the
// operation as it now is, with changed false when nothing was written
// because the same request was already applied. Errors: ErrInvalidResolution,
// ErrNotFound, ErrRefused (nothing written), ErrHeld (a delivery or the
// reconciler holds the lease now: try again), or an *InfraError.
func (g *Gate) Resolve(ctx context.Context, id string, r Resolution) (*Operation, bool, error) {
	if err := r.Check(); err != nil {
		return nil, false, err
	}
	ctx, end := g.span(ctx, "operator resolution", attribute.String("ackgate.operation.id", id),
		attribute.String("ackgate.resolution", string(r.Kind)))
	op, changed, err := g.resolve(ctx, id, r)
	end(err)
	return op, changed, err
}

func (g *Gate) resolve(ctx context.Context, id string, r Resolution) (*Operation, bool, error) {
	op, last, err := g.Ledger.FindByID(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return nil, false, err
	}
	if err != nil {
		return nil, false, &InfraError{"find operation", err}
	}
	if last != nil && last.Resolution == r && op.State == last.To && op.Fence == last.Fence {
		return op, false, nil // the same request again, and nothing has happened since
	}
	p, err := DecideResolution(op, r)
	if err != nil {
		return op, false, err
	}
	lease, err := g.Reservations.Acquire(ctx, op.ID, g.Owner+"/"+g.NewToken(), interventionTTL, op.Fence)
	if errors.Is(err, ErrHeld) {
		return op, false, fmt.Errorf("%w: %s is being worked on now; try again", ErrHeld, op.ID)
	}
	if err != nil {
		return op, false, &InfraError{"acquire reservation", err}
	}
	defer func() { _ = g.Reservations.Release(context.WithoutCancel(ctx), lease) }()

	now := g.Now()
	steps, err := stepsAlong(op.State, p.Path, p.Reason)
	if err != nil {
		return op, false, err
	}
	iv := &Intervention{Resolution: r, From: op.State, To: p.Target(), Fence: lease.Fence, At: now}
	var granted int
	if p.Grant {
		granted = op.AttemptCount + 1
	}
	var dl *DeadLetter
	if p.DeadLetter {
		dl = &DeadLetter{OperationID: op.ID, Reason: bound(p.Reason), At: now}
	}
	c := ResolveChange(Intervening(op, lease), steps, iv, granted, p.ResultID, dl, p.Reason, now)
	if err := g.write(ctx, op, c); err != nil {
		return op, false, err
	}
	after, _, err := g.Ledger.FindByID(ctx, id)
	if err != nil {
		return nil, true, &InfraError{"read resolved operation", err}
	}
	return after, true, nil
}

// Reconcile asks route's lookup once about indeterminate operation op and
// records the answer with what it settles. Errors: ErrRefused (op is not
// the reconciler's, or it changed meanwhile: nothing written), ErrHeld
// (someone holds the lease: skip it this round), or an *InfraError.
func (g *Gate) Reconcile(ctx context.Context, route *Route, op *Operation) (Plan, error) {
	if why := Reconcilable(route, op); why != "" {
		return Plan{}, fmt.Errorf("%w: %s: %s", ErrRefused, op.ID, why)
	}
	ctx, end := g.span(ctx, "reconcile", attribute.String("ackgate.operation.id", op.ID))
	p, err := g.reconcile(ctx, route, op)
	end(err)
	return p, err
}

func (g *Gate) reconcile(ctx context.Context, route *Route, op *Operation) (Plan, error) {
	if route.Shape == ShapeHandoff {
		route = RelayRoute(route) // its lookup is the relay's
	}
	ttl := route.Effect.Timeout + interventionTTL
	lease, err := g.Reservations.Acquire(ctx, op.ID, g.Owner+"/"+g.NewToken(), ttl, op.Fence)
	if errors.Is(err, ErrHeld) {
		return Plan{}, err
	}
	if err != nil {
		return Plan{}, &InfraError{"acquire reservation", err}
	}
	defer func() { _ = g.Reservations.Release(context.WithoutCancel(ctx), lease) }()

	started := g.Now()
	lctx, cancel := context.WithTimeout(ctx, max(route.Effect.Timeout, time.Second))
	res := g.Effects.Lookup(lctx, &EffectRequest{Route: route, OperationID: op.ID,
		IdempotencyKey: op.IdempotencyKey, Fence: lease.Fence})
	cancel()
	now := g.Now()
	p := AfterCheck(Evidence{Route: route, Op: op, Held: true, Now: now}, res)

	lookup := &Attempt{N: op.AttemptCount + 1, Kind: AttemptLookup, IdempotencyKey: op.IdempotencyKey,
		Fence: lease.Fence, ContractVersion: route.ContractVersion, StartedAt: started, FinishedAt: &now, Outcome: res.Outcome,
		StatusCode: res.StatusCode, ResultID: res.ResultID, Reason: bound(res.Reason)}
	steps, err := stepsAlong(op.State, p.Path, p.Reason)
	if err != nil {
		return Plan{}, err
	}
	var (
		granted int
		next    *time.Time
		checks  int
	)
	switch p.Action {
	case ActGrant:
		granted = lookup.N + 1
	case ActCheckLater:
		checks = op.Checks + 1
		t := NextCheck(route, checks, now)
		next = &t
	}
	c := ReconcileChange(Intervening(op, lease), steps, lookup, p.ResultID, granted, next, checks, p.Reason, now)
	if err := g.write(ctx, op, c); err != nil {
		return Plan{}, err
	}
	return p, nil
}

// write commits an intervening change, turning a lost race into
// ErrRefused: the operation moved on, and nothing of c was written.
func (g *Gate) write(ctx context.Context, op *Operation, c *Change) error {
	err := g.Ledger.Write(ctx, c)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrStateChanged), errors.Is(err, ErrFenced), errors.Is(err, ErrNotFound):
		return fmt.Errorf("%w: %s changed while this was being applied (%v); read it again", ErrRefused, op.ID, err)
	}
	return &InfraError{"write " + string(c.Kind), err}
}
