package gate

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// owned is a delivery that holds the operation's lease. Everything it writes
// carries the lease's fencing token, so if a newer owner takes over, the
// ledger refuses this one's writes and it can only answer nack.
type owned struct {
	g     *Gate
	d     *delivery
	op    *Operation // the operation as this owner last wrote it; nil before claim
	lease Lease
	// extensions counts lease renewals; leaseLost is set when a renewal found
	// the lease gone. Both are recorded with the settling write.
	extensions int
	leaseLost  bool
	// claimed is set once this delivery's claim committed, so its delivery
	// row exists and can be answered.
	claimed bool
}

// decisionFor is what the gate answers for an operation left in state s.
func decisionFor(s State, p DeadLetterPolicy) Decision {
	switch s {
	case StateAckPending:
		return Ack
	case StateTerminalFailure:
		return Terminal(p)
	}
	return Nack
}

func (o *owned) route() *Route { return o.d.route }

func (o *owned) run(ctx context.Context, plan Plan) (*Result, error) {
	switch plan.Action {
	case ActAttempt:
		if err := o.claim(ctx, plan.Reason, true, "", StateReserved, StatePendingEffect); err != nil {
			return o.refused(err)
		}
		return o.attempt(ctx)
	case ActLookupFirst:
		// A lookup is a read: ask under the lease before writing anything, then
		// commit the answer together with the claim.
		lr := o.lookup(ctx)
		switch lr.Outcome {
		case OutcomeConfirmed:
			err := o.claim(ctx, "lookup found the effect: "+lr.ResultID, false, lr.ResultID,
				StateReserved, StateEffectConfirmed, StateAckPending)
			if err != nil {
				return o.refused(err)
			}
			return o.acked("effect confirmed by lookup"), nil
		case OutcomeAbsent:
			if err := o.claim(ctx, "lookup says the effect is absent: retry allowed", true, "", StateReserved, StatePendingEffect); err != nil {
				return o.refused(err)
			}
			return o.attempt(ctx)
		default:
			return o.indeterminateByClaim(ctx, "earlier result lost and the lookup is unavailable: "+lr.Reason)
		}
	case ActMarkIndeterminate:
		return o.indeterminateByClaim(ctx, plan.Reason)
	case ActExhaust:
		if err := o.claim(ctx, plan.Reason, false, "", StateReserved, StateTerminalFailure); err != nil {
			return o.refused(err)
		}
		return o.terminalResult(plan.Reason), nil
	case ActRetentionGap:
		if err := o.claim(ctx, plan.Reason, false, "", StateTerminalFailure); err != nil {
			return o.refused(err)
		}
		return o.terminalResult(plan.Reason), nil
	}
	return o.g.nack(o.d, "no plan for "+string(plan.Action)), nil
}

func (o *owned) indeterminateByClaim(ctx context.Context, reason string) (*Result, error) {
	if err := o.claim(ctx, reason, false, "", StateReserved, StateEffectIndeterminate); err != nil {
		return o.refused(err)
	}
	return o.result(Nack, reason), nil
}

// claim takes the operation under the lease's fence in one commit: a new
// operation is created, an existing one moved only if its state and fence are
// what this owner read. With start set it also records the next attempt and
// its idempotency key, so the attempt is durable before the call is made.
func (o *owned) claim(ctx context.Context, reason string, start bool, resultID string, steps ...State) error {
	now := o.g.Now()
	deadline := o.lease.Expires
	c := &Change{
		Claim: true, Fence: o.lease.Fence, Owner: o.lease.Owner, LeaseDeadline: &deadline,
		Reason: bound(reason), TraceID: o.d.rec.TraceID, At: now,
	}
	var from State
	if o.op == nil {
		steps = append([]State{StateReceived}, steps...)
		o.op = o.newOperation()
	} else {
		from = o.op.State
		if from == StateReserved && len(steps) > 0 && steps[0] == StateReserved {
			steps = steps[1:]
		}
		c.ExpectState = from
	}
	path, err := Path(from, steps...)
	if err != nil {
		return err
	}
	c.Steps = stepsWith(path, reason)
	next := *o.op
	next.State = path[len(path)-1].To
	rec := *o.d.rec
	rec.Reason, rec.Owner = bound(reason), o.lease.Owner
	if !start {
		// Nothing follows this commit, so the answer is already known.
		rec.Decision = decisionFor(next.State, o.route().DeadLetter)
	}
	c.Delivery = &rec
	next.Fence, next.Owner = o.lease.Fence, o.lease.Owner
	next.DeliveryCount++
	next.Reason = c.Reason
	if start {
		c.StartAttempt = &Attempt{
			N: next.AttemptCount + 1, Kind: AttemptEffect, IdempotencyKey: o.d.id.IdempotencyKey,
			Fence: o.lease.Fence, StartedAt: now,
		}
		next.AttemptCount++
		next.LastAttempt = c.StartAttempt
		if next.FirstAttemptAt == nil {
			next.FirstAttemptAt = &now
		}
	}
	if resultID != "" {
		c.ResultID, c.EvidenceAt = resultID, &now
		next.ResultID, next.EvidenceAt = resultID, &now
	}
	if next.State == StateTerminalFailure {
		c.DeadLetter = o.deadLetter(reason, now)
	}
	if next.State == StateEffectIndeterminate {
		c.Lane, next.Lane = "operator", "operator"
	}
	c.Operation = &next
	cctx, end := o.g.span(ctx, "ledger claim", attribute.String("ackgate.operation.id", next.ID),
		attribute.Int64("ackgate.fence", o.lease.Fence), attribute.String("ackgate.state", string(next.State)))
	if from == "" {
		err = o.g.Ledger.Create(cctx, c)
	} else {
		err = o.g.Ledger.Apply(cctx, c)
	}
	end(err)
	if err != nil {
		return err
	}
	o.g.recorder().Transitioned(ctx, o.route(), c.Steps)
	o.op = &next
	o.claimed = true
	return nil
}

func (o *owned) newOperation() *Operation {
	r, id, now := o.route(), o.d.id, o.d.now
	return &Operation{
		ID: id.OperationID, ScopeKey: id.ScopeKey, Tenant: r.Tenant, Route: r.Name,
		KeySource: r.Key.Kind, Key: id.Key, Fingerprint: id.Fingerprint,
		FingerprintVersion: r.Fingerprint.Version, Shape: r.Shape, DeadLetterPolicy: r.DeadLetter,
		ContractVersion: r.ContractVersion, IdempotencyKey: id.IdempotencyKey,
		LeaseStart: &now, TraceID: o.d.rec.TraceID, SpanID: o.d.spanID,
		CreatedAt: now, UpdatedAt: now, RetainUntil: now.Add(r.Retention),
	}
}

func (o *owned) deadLetter(reason string, at time.Time) *DeadLetter {
	if o.route().DeadLetter != DeadLetterGateway {
		return nil
	}
	return &DeadLetter{OperationID: o.op.ID, Reason: bound(reason), At: at}
}

// attempt calls the downstream once, under renewal, and commits what came back.
func (o *owned) attempt(ctx context.Context) (*Result, error) {
	req := &EffectRequest{
		Route: o.route(), Message: o.d.msg, OperationID: o.op.ID,
		IdempotencyKey: o.op.IdempotencyKey, Fence: o.lease.Fence,
	}
	callCtx, cancel := context.WithDeadline(ctx, o.callDeadline())
	callCtx, end := o.g.span(callCtx, "downstream effect", attribute.String("ackgate.operation.id", req.OperationID),
		attribute.Int("ackgate.attempt", o.op.AttemptCount), attribute.Int64("ackgate.fence", req.Fence))
	stop := o.renew(callCtx)
	began := time.Now()
	er := o.g.Effects.Execute(callCtx, req)
	took := time.Since(began)
	stop()
	trace.SpanFromContext(callCtx).SetAttributes(attribute.String("ackgate.outcome", string(er.Outcome)),
		attribute.Int("ackgate.lease.extensions", o.extensions))
	end(nil)
	cancel()
	o.d.downstream += took
	o.g.recorder().Downstream(ctx, o.route(), AttemptEffect, er.Outcome, took)
	now := o.g.Now()
	fin := &Attempt{
		N: o.op.AttemptCount, Kind: AttemptEffect, IdempotencyKey: o.op.IdempotencyKey,
		Fence: o.lease.Fence, StartedAt: o.op.LastAttempt.StartedAt, FinishedAt: &now,
		Outcome: er.Outcome, StatusCode: er.StatusCode, ResultID: er.ResultID, Reason: bound(er.Reason),
	}
	switch er.Outcome {
	case OutcomeConfirmed:
		return o.settle(ctx, fin, "downstream confirmed the effect", er.ResultID, StateEffectConfirmed, StateAckPending)
	case OutcomeTerminal:
		return o.settle(ctx, fin, "downstream refused for good: "+er.Reason, "", StateTerminalFailure)
	}
	// Retryable or unknown: ask the decision table what the evidence now allows.
	after := *o.op
	after.LastAttempt = fin
	plan := Decide(Evidence{Route: o.route(), Op: &after, Now: now})
	switch plan.Action {
	case ActAttempt:
		return o.settle(ctx, fin, "attempt failed, the broker will redeliver: "+plan.Reason, "")
	case ActExhaust:
		return o.settle(ctx, fin, plan.Reason, "", StateTerminalFailure)
	case ActLookupFirst:
		lr := o.lookup(ctx)
		switch lr.Outcome {
		case OutcomeConfirmed:
			return o.settle(ctx, fin, "response lost; lookup found the effect: "+lr.ResultID, lr.ResultID, StateEffectConfirmed, StateAckPending)
		case OutcomeAbsent:
			return o.settle(ctx, fin, "response lost; lookup says absent, a retry is allowed", "")
		default:
			return o.settle(ctx, fin, "response lost and the lookup is unavailable: "+lr.Reason, "", StateEffectIndeterminate)
		}
	default:
		return o.settle(ctx, fin, plan.Reason, "", StateEffectIndeterminate)
	}
}

// settle commits an attempt's outcome (and any transitions) under the fence,
// then answers. Only a committed confirmation becomes an ack.
func (o *owned) settle(ctx context.Context, fin *Attempt, reason, resultID string, steps ...State) (*Result, error) {
	now := o.g.Now()
	if o.leaseLost {
		reason += " (lease lost during the call)"
	}
	c := &Change{
		Operation: &Operation{ID: o.op.ID}, ExpectState: o.op.State, Fence: o.lease.Fence,
		FinishAttempt: fin, Reason: bound(reason), LeaseExtensions: o.extensions, At: now,
	}
	path, err := Path(o.op.State, steps...)
	if err != nil {
		return nil, err
	}
	c.Steps = stepsWith(path, reason)
	next := *o.op
	next.LastAttempt = fin
	if len(path) > 0 {
		next.State = path[len(path)-1].To
	}
	if resultID != "" {
		c.ResultID, c.EvidenceAt = resultID, &now
	}
	switch next.State {
	case StateTerminalFailure:
		c.DeadLetter = o.deadLetter(reason, now)
	case StateEffectIndeterminate:
		c.Lane = "operator"
	}
	c.Answer = &Answer{Owner: o.lease.Owner, Decision: decisionFor(next.State, o.route().DeadLetter), Reason: c.Reason}
	sctx, end := o.g.span(ctx, "ledger settle", attribute.String("ackgate.operation.id", next.ID),
		attribute.Int64("ackgate.fence", o.lease.Fence), attribute.String("ackgate.state", string(next.State)))
	err = o.g.Ledger.Apply(sctx, c)
	end(err)
	if err != nil {
		return o.refused(err)
	}
	o.g.recorder().Transitioned(ctx, o.route(), c.Steps)
	o.op = &next
	switch next.State {
	case StateAckPending:
		return o.acked(reason), nil
	case StateTerminalFailure:
		return o.terminalResult(reason), nil
	}
	return o.result(Nack, reason), nil
}

// refused turns a ledger refusal into a nack. A fence or state mismatch means
// another owner moved on: this owner committed nothing and must not ack.
// When this delivery's claim had committed, its delivery row is answered
// after the response (unfenced): a superseded owner's lease loss is kept in
// the evidence, apart from the effect's state.
func (o *owned) refused(err error) (*Result, error) {
	var res *Result
	var ierr error
	switch {
	case errors.Is(err, ErrFenced):
		res = o.g.nack(o.d, "fenced: a newer owner holds the operation; nothing committed")
	case errors.Is(err, ErrStateChanged), errors.Is(err, ErrExists):
		res = o.g.nack(o.d, "operation changed underneath; the broker will redeliver")
	default:
		res, ierr = o.g.nack(o.d, "evidence store unavailable"), &InfraError{"record evidence", err}
	}
	if o.claimed {
		a := &Answer{Owner: o.lease.Owner, Decision: Nack, Reason: res.Reason}
		id := o.op.ID
		res.then(func(ctx context.Context) error { return o.g.Ledger.AnswerDelivery(ctx, id, a) })
	}
	return res, ierr
}

func (o *owned) result(dec Decision, reason string) *Result {
	return &Result{Decision: dec, Reason: bound(reason), OperationID: o.op.ID, State: o.op.State}
}

func (o *owned) terminalResult(reason string) *Result {
	return o.result(Terminal(o.route().DeadLetter), reason)
}

// acked answers ack for a committed ack_pending operation and, once the
// response is out, records that the ack was sent.
func (o *owned) acked(reason string) *Result {
	res := o.result(Ack, reason)
	id, fence := o.op.ID, o.lease.Fence
	res.whenSent(func(ctx context.Context) error {
		return o.g.markAcknowledged(ctx, o.route(), id, StateAckPending, fence)
	})
	return res
}

func (o *owned) lookup(ctx context.Context) LookupResult {
	lctx, cancel := context.WithDeadline(ctx, o.callDeadline())
	defer cancel()
	lctx, end := o.g.span(lctx, "downstream lookup", attribute.String("ackgate.operation.id", o.d.id.OperationID))
	began := time.Now()
	lr := o.g.Effects.Lookup(lctx, &EffectRequest{
		Route: o.route(), Message: o.d.msg, OperationID: o.d.id.OperationID,
		IdempotencyKey: o.d.id.IdempotencyKey, Fence: o.lease.Fence,
	})
	took := time.Since(began)
	trace.SpanFromContext(lctx).SetAttributes(attribute.String("ackgate.outcome", string(lr.Outcome)))
	end(nil)
	o.d.downstream += took
	o.g.recorder().Downstream(ctx, o.route(), AttemptLookup, lr.Outcome, took)
	return lr
}

// callDeadline leaves room, before the broker gives up on us, to commit the
// result and answer.
func (o *owned) callDeadline() time.Time {
	margin := min(2*time.Second, o.route().AckDeadline/5)
	return o.d.deadline.Add(-margin)
}

// renew keeps the lease while the call runs: every Renewal.Interval, only
// while this owner still holds it, and never past the broker deadline plus
// MaxExtension, so stalled work cannot hide the operation forever. It returns
// a stop function that waits for the renewer to end.
func (o *owned) renew(ctx context.Context) (stop func()) {
	r := o.route()
	if r.Renewal.Interval <= 0 {
		return func() {}
	}
	limit := o.d.deadline.Add(r.Renewal.MaxExtension)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(r.Renewal.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			ttl := min(leaseTTL(r), limit.Sub(o.g.Now()))
			if ttl <= 0 {
				return
			}
			l, err := o.g.Reservations.Renew(ctx, o.lease, ttl)
			if errors.Is(err, ErrLeaseLost) {
				o.leaseLost = true
				return
			}
			if err == nil {
				o.lease = l
				o.extensions++
			}
		}
	}()
	return func() { cancel(); <-done }
}
