package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Gate runs one delivery through the evidence lifecycle: identify, decide,
// reserve, record intent, call, record evidence, and only then say "ack".
type Gate struct {
	Ledger       Ledger
	Reservations Reservations
	Effects      Effects
	// Local runs local routes' statements; nil when no route is local.
	Local Local
	// Owner names this process in reservations and evidence.
	Owner string
	Now   func() time.Time
	// NewToken returns a fresh owner token per delivery; it is combined with
	// Owner so leases say which process and which request hold them.
	NewToken func() string
	// Tracer and Recorder are optional: spans for each step of a delivery,
	// and the counts behind the gateway's metrics.
	Tracer   trace.Tracer
	Recorder Recorder
}

// Result is the gate's answer for one delivery.
type Result struct {
	Decision    Decision
	Reason      string
	OperationID string
	State       State
	// finish is the ledger work that follows the response: recording
	// deliveries that changed nothing. onSent runs only when the ack was
	// written out: marking the operation acknowledged. release is the lease
	// to drop once both are done. All of it is kept off the path to the ack
	// so the ack costs only what evidence needs.
	finish  []func(ctx context.Context) error
	onSent  []func(ctx context.Context) error
	release []Lease
	leases  Reservations
}

// Finish runs the post-response work on the caller. Call it after the
// broker's response has been written, with sent saying whether writing it
// succeeded; failures are logged, never turned into a different answer.
// AfterAnswer runs the same work in the background, batched.
func (r *Result) Finish(ctx context.Context, log *slog.Logger, sent bool) {
	r.ledgerWork(ctx, log, sent)
	if len(r.release) > 0 {
		r.logFailure(ctx, log, r.leases.ReleaseAll(ctx, r.release))
	}
}

// ledgerWork runs the ledger half of the post-response work: the ack mark
// first (only when sent), then the delivery records.
func (r *Result) ledgerWork(ctx context.Context, log *slog.Logger, sent bool) {
	if sent {
		for _, f := range r.onSent {
			r.logFailure(ctx, log, f(ctx))
		}
	}
	for _, f := range r.finish {
		r.logFailure(ctx, log, f(ctx))
	}
}

func (r *Result) hasLedgerWork(sent bool) bool {
	return len(r.finish) > 0 || (sent && len(r.onSent) > 0)
}

func (r *Result) logFailure(ctx context.Context, log *slog.Logger, err error) {
	if err != nil && log != nil {
		log.WarnContext(ctx, "post-ack bookkeeping failed", "operation_id", r.OperationID, "err", err)
	}
}

func (r *Result) then(f func(ctx context.Context) error) { r.finish = append(r.finish, f) }

// whenSent registers work that may only follow an ack that reached the wire.
func (r *Result) whenSent(f func(ctx context.Context) error) { r.onSent = append(r.onSent, f) }

// releaseAfter registers the lease to drop after the response, once the
// ledger work is done.
func (r *Result) releaseAfter(rs Reservations, l Lease) {
	r.release, r.leases = append(r.release, l), rs
}

// InfraError marks a failure of the gateway's own dependencies (ledger,
// reservation store). Its answer is always a nack: evidence we cannot read or
// write is never coerced into success or failure.
type InfraError struct {
	Op  string
	Err error
}

func (e *InfraError) Error() string { return e.Op + ": " + e.Err.Error() }
func (e *InfraError) Unwrap() error { return e.Err }

// bound is Bound at the size of a recorded reason.
func bound(s string) string { return Bound(s, MaxReason) }

// delivery is the per-request working set.
type delivery struct {
	route *Route
	msg   *Message
	id    Identity
	rec   *Delivery
	now   time.Time
	// deadline is when the broker stops waiting for our answer.
	deadline time.Time
	// spanID is the delivery's span, kept with a new operation so that its
	// redeliveries can link back to it.
	spanID string
	// downstream is the time spent in downstream calls, which the gate's own
	// latency excludes.
	downstream time.Duration
}

// Deliver processes one decoded message for a route. The returned error is an
// *InfraError (or nil); the Result is always usable and says Nack on error.
func (g *Gate) Deliver(ctx context.Context, route *Route, msg *Message) (*Result, error) {
	start := time.Now()
	d := &delivery{route: route, msg: msg}
	res, err := g.deliver(ctx, d)
	dec, reason := Nack, "evidence store unavailable"
	if res != nil {
		dec, reason = res.Decision, res.Reason
	}
	_, s := g.startSpan(ctx, "ack decision")
	if s.IsRecording() {
		s.SetAttributes(attribute.String("ackgate.decision", string(dec)), attribute.String("ackgate.reason", reason))
		if res != nil && res.OperationID != "" {
			s.SetAttributes(attribute.String("ackgate.operation.id", res.OperationID), attribute.String("ackgate.state", string(res.State)))
		}
	}
	endSpan(s, err)
	g.recorder().Delivered(ctx, route, msg.Broker, dec, time.Since(start)-d.downstream)
	return res, err
}

func (g *Gate) deliver(ctx context.Context, d *delivery) (*Result, error) {
	route, msg := d.route, d.msg
	now := g.Now()
	id, err := Identify(route, msg)
	if err != nil {
		var ie *IdentityError
		if errors.As(err, &ie) {
			return &Result{Decision: Reject, Reason: bound(ie.Error())}, nil
		}
		return nil, fmt.Errorf("identify: %w", err)
	}
	d.id, d.now, d.deadline, d.spanID = id, now, now.Add(route.AckDeadline), spanID(ctx)
	d.rec = &Delivery{
		OperationID: id.OperationID, N: 1, Broker: msg.Broker, Source: msg.Source,
		MessageID: msg.MessageID, BrokerAttempt: msg.BrokerAttempt, ReceivedAt: now,
		TraceID: traceID(ctx),
	}
	if !msg.PublishTime.IsZero() {
		published := msg.PublishTime
		d.rec.PublishTime = &published
	}
	// Nothing we do after the broker stops waiting can become an ack, so the
	// whole delivery, ledger writes included, is bounded by its deadline.
	ctx, cancel := context.WithDeadline(ctx, d.deadline)
	defer cancel()

	// The claim is the delivery's first word with the ledger: it creates
	// the operation as the table plans a new one, or finds it. A new
	// operation's first owner holds fence 1, which the ledger gives it; its
	// lease in the reservation store follows.
	fresh := Decide(Evidence{Route: route, PublishTime: msg.PublishTime, Now: now})
	o := &owned{g: g, d: d, lease: Lease{Key: id.OperationID, Owner: g.Owner + "/" + g.NewToken(), Fence: 1,
		Expires: now.Add(leaseTTL(route))}}
	o.firstExpiry = o.lease.Expires
	var (
		op      *Operation
		created bool
	)
	if fresh.Action == ActApplyLocal {
		// A local route's operation is created in its statement's
		// transaction, so that a statement that cannot run (its route's
		// configuration) leaves nothing behind, not even an attempt.
		var res *Result
		if op, res, err = o.createLocal(ctx, fresh); op == nil {
			return res, err
		}
	} else {
		op, created, err = o.claim(ctx, fresh, now)
	}
	if err != nil {
		return g.nack(d, "evidence store unavailable"), &InfraError{"claim operation", err}
	}
	if created {
		res, err := o.created(ctx, fresh)
		if o.taken {
			res.releaseAfter(g.Reservations, o.lease)
		}
		return res, err
	}
	linkFirstDelivery(ctx, op)
	d.rec.N = op.DeliveryCount
	ev := Evidence{Route: route, Op: op, Fingerprint: id.Fingerprint, PublishTime: msg.PublishTime, Now: g.Now()}
	plan := Decide(ev)
	switch plan.Action {
	case ActConflict:
		return g.conflict(ctx, d, op, plan)
	case ActAckExisting, ActHoldTerminal, ActHoldIndeterminate:
		return g.answer(d, op, plan), nil
	}
	if h := LeaseRecorded(ev, plan); h.Action == ActHoldLease {
		g.recorder().Contended(ctx, route)
		return g.answer(d, op, h), nil
	}
	return g.reserved(ctx, d, op, plan)
}

// answer builds the result of a plan that writes nothing before the answer:
// the delivery's answer follows the response (unless the claim that found
// the operation recorded it already), and so does an ack's mark.
func (g *Gate) answer(d *delivery, op *Operation, p Plan) *Result {
	res := &Result{Decision: p.Answer, Reason: bound(p.Reason), OperationID: d.id.OperationID}
	if op == nil {
		return res
	}
	res.State = op.State
	// A delivery that found the operation acknowledged was answered by the
	// claim that found it (Claim.AckedAnswer); the relay has no broker
	// delivery to answer.
	if d.rec != nil && !(op.State == StateAcknowledged && p.Action == ActAckExisting) {
		a := &Answer{N: d.rec.N, Decision: p.Answer, Reason: res.Reason, Anomaly: p.Anomaly}
		ledger, id := g.Ledger, op.ID
		res.then(func(ctx context.Context) error { return ledger.AnswerDelivery(ctx, id, a) })
	}
	if len(p.AfterSent) > 0 {
		id, from, fence, route, path, reason := op.ID, op.State, op.Fence, d.route, p.AfterSent, ackReason(d)
		res.whenSent(func(ctx context.Context) error {
			return g.markAcknowledged(ctx, route, id, from, fence, path, reason)
		})
	}
	return res
}

func (g *Gate) nack(d *delivery, reason string) *Result {
	return &Result{Decision: Nack, Reason: reason, OperationID: d.id.OperationID}
}

// ackReason is what the acknowledged mark says: a delivery's response was
// written, or, for the relay, the broker had its ack at the handoff.
func ackReason(d *delivery) string {
	if d.rec == nil {
		return "the broker was acknowledged when the operation was handed off"
	}
	return ReasonAckWritten
}

// markAcknowledged records the path of an ack that reached the wire, under
// the fence that confirmed the effect.
func (g *Gate) markAcknowledged(ctx context.Context, route *Route, opID string, from State, fence int64, path []State, reason string) error {
	c := AckedChange(opID, from, fence, nil, g.Now())
	steps, err := stepsAlong(from, path, reason)
	if err != nil {
		return err
	}
	c.Steps = steps
	err = g.Ledger.Write(ctx, c)
	if errors.Is(err, ErrStateChanged) {
		return nil // a concurrent redelivery marked it first
	}
	if err == nil {
		g.recorder().Transitioned(ctx, route, c.Steps)
	}
	return err
}

// conflict keeps a reused key with a different payload as its own record.
func (g *Gate) conflict(ctx context.Context, d *delivery, orig *Operation, p Plan) (*Result, error) {
	rec := &Operation{
		ID: ConflictID(d.id.ScopeKey, d.id.Fingerprint), ScopeKey: d.id.ScopeKey,
		Tenant: d.route.Tenant, Route: d.route.Name, KeySource: d.route.Key.Kind, Key: d.id.Key,
		Fingerprint: d.id.Fingerprint, FingerprintVersion: d.route.Fingerprint.Version,
		ConflictOf: orig.ID, State: p.Target(), Shape: d.route.Shape,
		DeadLetterPolicy: d.route.DeadLetter, ContractVersion: d.route.ContractVersion,
		Reason: bound(p.Reason), TraceID: d.rec.TraceID,
		CreatedAt: d.now, UpdatedAt: d.now, RetainUntil: d.now.Add(d.route.Retention),
	}
	c := &Conflict{Original: orig, Record: rec, At: d.now}
	rd := *d.rec
	rd.OperationID, rd.N, rd.Decision, rd.Reason = rec.ID, 0, p.Answer, rec.Reason
	c.Delivery = &rd
	if p.Answer == Ack {
		c.DeadLetter = &DeadLetter{OperationID: rec.ID, Reason: rec.Reason, At: d.now}
	}
	cctx, s := g.startSpan(ctx, "ledger record conflict")
	if s.IsRecording() {
		s.SetAttributes(attribute.String("ackgate.operation.id", rec.ID))
	}
	stored, err := g.Ledger.RecordConflict(cctx, c)
	endSpan(s, err)
	if err != nil {
		return g.nack(d, "evidence store unavailable"), &InfraError{"record conflict", err}
	}
	return &Result{Decision: p.Answer, Reason: rec.Reason, OperationID: stored.ID, State: stored.State}, nil
}

// reserved takes the operation's lease and hands the plan to an owner.
func (g *Gate) reserved(ctx context.Context, d *delivery, op *Operation, p Plan) (*Result, error) {
	owner := g.Owner + "/" + g.NewToken()
	rctx, s := g.startSpan(ctx, "reserve")
	if s.IsRecording() {
		s.SetAttributes(attribute.String("ackgate.operation.id", d.id.OperationID), attribute.Int64("ackgate.fence.floor", op.Fence))
	}
	lease, err := g.Reservations.Acquire(rctx, d.id.OperationID, owner, leaseTTL(d.route), op.Fence)
	if errors.Is(err, ErrHeld) {
		endSpan(s, nil)
		g.recorder().Contended(ctx, d.route)
		return g.answer(d, op, Plan{Answer: Nack, Reason: "another owner holds the lease"}), nil
	}
	if err == nil && s.IsRecording() {
		s.SetAttributes(attribute.Int64("ackgate.fence", lease.Fence))
	}
	endSpan(s, err)
	if err != nil {
		return g.nack(d, "reservation store unavailable"), &InfraError{"acquire reservation", err}
	}
	if lease.Reset {
		if h := AfterReset(Evidence{Route: d.route, Op: op, Fingerprint: d.id.Fingerprint, Now: g.Now()}, p); h.Action == ActHoldLease {
			return g.holdLease(ctx, d, op, lease, h), nil
		}
	}
	o := &owned{g: g, d: d, op: op, lease: lease, firstExpiry: lease.Expires, taken: true}
	res, err := o.run(ctx, p)
	res.releaseAfter(g.Reservations, o.lease)
	return res, err
}

// holdLease keeps the lease until h.HoldUntil, so no delivery claims the
// operation before its previous owner must have stopped, and answers nack.
func (g *Gate) holdLease(ctx context.Context, d *delivery, op *Operation, lease Lease, h Plan) *Result {
	res := g.answer(d, op, h)
	// The reset is a fact of the operation's lease history, kept with the
	// answer of the delivery that met it.
	if n := len(res.finish); n > 0 && d.rec != nil {
		a := &Answer{N: d.rec.N, Decision: h.Answer, Reason: bound(h.Reason), ResetFence: lease.Fence}
		ledger, id := g.Ledger, op.ID
		res.finish[n-1] = func(ctx context.Context) error { return ledger.AnswerDelivery(ctx, id, a) }
	}
	if ttl := h.HoldUntil.Sub(g.Now()); ttl >= time.Millisecond {
		if _, err := g.Reservations.Renew(ctx, lease, ttl); err != nil {
			res.releaseAfter(g.Reservations, lease)
		}
	}
	return res
}

// leaseTTL is short when the route renews: a live owner keeps renewing while
// its call runs, and a crashed owner's lease lapses within two renewal
// intervals, so a redelivery can take over long before the broker deadline.
func leaseTTL(r *Route) time.Duration {
	if r.Renewal.Interval > 0 {
		return min(r.AckDeadline, 2*r.Renewal.Interval)
	}
	return r.AckDeadline
}

func traceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}

// stepsAlong turns a plan's path from state from into the ledger's steps,
// checking every edge against the transition table.
func stepsAlong(from State, path []State, reason string) ([]Step, error) {
	edges, err := Path(from, path...)
	if err != nil {
		return nil, err
	}
	out := make([]Step, len(edges))
	for i, t := range edges {
		out[i] = Step{Transition: t, Reason: bound(reason)}
	}
	return out, nil
}
