package gate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
)

// The relay performs a handoff route's effect after its broker was acked.
// It is a delivery without a broker: it takes the operation's lease, and
// the same decision table and executor decide and record every step, under
// the route's RelayShape. Only its deadline differs: no broker is waiting,
// so a call may take as long as the route's effect timeout allows.

// relayMargin is the time a relay attempt keeps, after its call's timeout,
// to record the result.
const relayMargin = 10 * time.Second

// RelayRoute is route as the relay applies it: the shape its downstream
// has (RelayShape), and a deadline of its own call rather than a broker's.
func RelayRoute(route *Route) *Route {
	rr := *route
	rr.Shape = route.RelayShape()
	rr.AckDeadline = route.Effect.Timeout + relayMargin
	rr.Renewal = Renewal{}
	return &rr
}

// Relay makes the next step of outbox entry e's operation, as a delivery
// would: an attempt, a lookup first, or nothing when the operation is
// settled, held or parked. The Result's Decision is Ack once the effect is
// evidenced, Nack when the entry should be taken up again later; call its
// Finish with sent=true to record the acknowledgment the broker already
// had and to release the lease. Errors are *InfraError or ErrNotFound.
func (g *Gate) Relay(ctx context.Context, route *Route, e *OutboxEntry) (*Result, error) {
	if route.Shape != ShapeHandoff {
		return nil, fmt.Errorf("gate: relay: route %s is %s, not handoff", route.Name, route.Shape)
	}
	ctx, end := g.span(ctx, "relay", attribute.String("ackgate.operation.id", e.OperationID))
	res, err := g.relay(ctx, RelayRoute(route), e)
	end(err)
	return res, err
}

func (g *Gate) relay(ctx context.Context, rr *Route, e *OutboxEntry) (*Result, error) {
	op, _, err := g.Ledger.FindByID(ctx, e.OperationID)
	if errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if err != nil {
		return nil, &InfraError{"find operation", err}
	}
	now := g.Now()
	// The operation's own identity: the entry's message lacks the private
	// attributes a key or fingerprint may be drawn from.
	d := &delivery{route: rr, msg: e.Message, now: now, deadline: now.Add(rr.AckDeadline),
		id: Identity{Key: op.Key, ScopeKey: op.ScopeKey, OperationID: op.ID, Fingerprint: op.Fingerprint,
			IdempotencyKey: op.IdempotencyKey}}
	ctx, cancel := context.WithDeadline(ctx, d.deadline)
	defer cancel()
	// No fingerprint: the entry is the operation's own message, not a
	// delivery that could conflict with it.
	p := Decide(Evidence{Route: rr, Op: op, Now: now})
	switch p.Action {
	case ActAckExisting, ActHoldTerminal, ActHoldIndeterminate:
		return &Result{Decision: p.Answer, Reason: bound(p.Reason), OperationID: op.ID, State: op.State}, nil
	case ActConflict, ActHandOff, ActRetentionGap:
		return nil, fmt.Errorf("gate: relay: %s planned %s for a handed-off operation", op.ID, p.Action)
	}
	if h := LeaseRecorded(Evidence{Route: rr, Op: op, Now: now}, p); h.Action == ActHoldLease {
		return &Result{Decision: Nack, Reason: bound(h.Reason), OperationID: op.ID, State: op.State}, nil
	}
	return g.reserved(ctx, d, op, p)
}

// RelayBackoff is how long an entry whose pass left its operation open
// waits before the next: the route's RetryMin, doubled per pass, at most
// RetryMax. The relay adds jitter, so a downstream recovering from an
// outage is not met by every entry at once.
func RelayBackoff(r *Route, passes int) time.Duration {
	lo, hi := time.Second, 5*time.Minute
	if h := r.Handoff; h != nil {
		lo, hi = max(h.RetryMin, time.Millisecond), max(h.RetryMax, h.RetryMin)
	}
	return doubling(lo, hi, passes)
}
