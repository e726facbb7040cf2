package gate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
)

// owned is a delivery that holds, or is about to create, the operation's
// lease. Everything it writes carries the lease's fencing token, so if a
// newer owner takes over, the ledger refuses this one's writes and it can
// only answer nack.
type owned struct {
	g     *Gate
	d     *delivery
	op    *Operation // the operation as this owner last wrote it; as found before its claim; nil before creation
	lease Lease
	// taken says the lease is held in the reservation store, so it is
	// renewed during the call and released after the answer. A delivery
	// that created its operation holds the lease the ledger records first
	// and takes it in the store after (take).
	taken bool
	// firstExpiry is when the lease as first taken would have lapsed; the
	// total extension past it is capped by the route's MaxExtension.
	firstExpiry time.Time
	// extensions counts lease renewals; leaseLost is when a renewal found
	// the lease gone. Both are recorded with the settling write.
	extensions int
	leaseLost  *time.Time
	// claimed is set once this delivery's claim committed, so its next
	// write is a settlement.
	claimed bool
	// finished is how this delivery's attempt ended, for the settling write.
	finished *Attempt
	// looked is a lookup this owner made that its next write records.
	looked *Attempt
}

func (o *owned) route() *Route { return o.d.route }

// evidence is what this owner knows now, for the next row of the table.
func (o *owned) evidence() Evidence {
	return Evidence{Route: o.route(), Op: o.op, Fingerprint: o.d.id.Fingerprint, Held: o.claimed,
		PublishTime: o.d.msg.PublishTime, Now: o.g.Now()}
}

// claim offers the ledger the operation as fresh, the plan for a new one,
// would create it: created, this owner holds it under fence 1, as next (the
// ledger returns no operation then); otherwise the operation comes back as
// found.
func (o *owned) claim(ctx context.Context, fresh Plan, now time.Time) (*Operation, bool, error) {
	c, next, err := o.creating(fresh, now)
	if err != nil {
		return nil, false, err
	}
	cctx, s := o.g.startSpan(ctx, "ledger claim")
	if s.IsRecording() {
		s.SetAttributes(attribute.String("ackgate.operation.id", next.ID), attribute.String("ackgate.change", string(c.Kind)))
	}
	op, created, err := o.g.Ledger.Claim(cctx, c)
	if s.IsRecording() && err == nil {
		s.SetAttributes(attribute.Bool("ackgate.created", created))
	}
	endSpan(s, err)
	if err != nil || !created {
		return op, false, err
	}
	o.g.recorder().Transitioned(ctx, o.route(), c.Steps)
	o.op, o.claimed = next, true
	return next, true, nil
}

// creating is the claim that would create the operation as fresh plans
// it, and the operation as it would then be. Should it find the operation
// acknowledged, it records the answer the table gives such a redelivery.
func (o *owned) creating(fresh Plan, now time.Time) (*Change, *Operation, error) {
	c, next, err := o.change(fresh, now)
	if err != nil {
		return nil, nil, err
	}
	acked := RedeliveredAfterAck()
	c.Claim.AckedAnswer = &Answer{Decision: acked.Answer, Reason: bound(acked.Reason), Anomaly: acked.Anomaly}
	return c, next, nil
}

// createLocal runs fresh, a new local operation's statement, with the
// operation's creating claim in the statement's transaction. It returns
// either the operation that claim found (the delivery goes on as one that
// found it) or the delivery's result.
func (o *owned) createLocal(ctx context.Context, fresh Plan) (*Operation, *Result, error) {
	settled, err := o.applyLocal(ctx, fresh)
	var found *Found
	if errors.As(err, &found) {
		return found.Op, nil, nil
	}
	if err != nil {
		res, err := o.refused(err)
		return nil, res, err
	}
	return nil, o.answered(settled), nil
}

// created carries out the rest of fresh, whose first write was the
// operation's creation: the call, or nothing when the creation was all
// (a handoff, a message older than the evidence horizon).
func (o *owned) created(ctx context.Context, fresh Plan) (*Result, error) {
	switch fresh.Action {
	case ActAttempt:
		if err := o.take(ctx); err != nil {
			return o.run(ctx, AfterAttempt(o.evidence(), o.notCalled(err)))
		}
		return o.run(ctx, AfterAttempt(o.evidence(), o.attempt(ctx)))
	case ActApplyLocal:
		// The statement commits with its evidence or not at all, inside
		// the ledger's own transaction: the lease the ledger records is
		// the only one it needs.
		settled, err := o.applyLocal(ctx, fresh)
		if err != nil {
			return o.refused(err)
		}
		return o.answered(settled), nil
	}
	return o.answered(fresh), nil
}

// take puts the lease of a delivery that created its operation into the
// reservation store, under the fence the ledger gave it. No call is made
// without it: the store's lease is what renewals extend and what another
// delivery's takeover meets, and a store that cannot be reached (the
// gateway answers /readyz 503 meanwhile) is a nack, as it is for a
// delivery that finds its operation.
func (o *owned) take(ctx context.Context) error {
	rctx, s := o.g.startSpan(ctx, "reserve")
	if s.IsRecording() {
		s.SetAttributes(attribute.String("ackgate.operation.id", o.op.ID), attribute.Int64("ackgate.fence", o.lease.Fence))
	}
	l, err := o.g.Reservations.Take(rctx, o.lease, leaseTTL(o.route()))
	endSpan(s, err)
	if err != nil {
		return err
	}
	o.lease, o.taken = l, true
	return nil
}

// notCalled ends the attempt the creating claim recorded without a call,
// for take's failure err: as a retryable result, so that a later delivery
// may make it, and an unsafe route's operation knows none was made.
func (o *owned) notCalled(err error) EffectResult {
	er := EffectResult{Outcome: OutcomeRetryable, Reason: "not called: the reservation store did not take the lease: " + err.Error()}
	now := o.g.Now()
	o.finished = &Attempt{
		N: o.op.AttemptCount, Kind: AttemptEffect, IdempotencyKey: o.op.IdempotencyKey,
		Fence: o.lease.Fence, ContractVersion: o.route().ContractVersion, StartedAt: o.op.LastAttempt.StartedAt,
		FinishedAt: &now, Outcome: er.Outcome, Reason: bound(er.Reason),
	}
	return er
}

// run executes plans until one has an answer: it looks up, writes and calls
// as each plan says, and asks the decision table what the result allows.
func (o *owned) run(ctx context.Context, p Plan) (*Result, error) {
	for {
		switch p.Action {
		case ActLookupFirst:
			p = AfterLookup(o.evidence(), o.lookup(ctx))
			continue
		case ActAttempt:
			if o.claimed {
				// The table never plans a second call in one delivery.
				return o.refused(fmt.Errorf("gate: a second attempt planned within one delivery: %s", p.Reason))
			}
			if err := o.write(ctx, p); err != nil {
				return o.refused(err)
			}
			p = AfterAttempt(o.evidence(), o.attempt(ctx))
			continue
		case ActApplyLocal:
			if o.claimed {
				return o.refused(fmt.Errorf("gate: a second attempt planned within one delivery: %s", p.Reason))
			}
			settled, err := o.applyLocal(ctx, p)
			if err != nil {
				return o.refused(err)
			}
			return o.answered(settled), nil
		}
		if err := o.write(ctx, p); err != nil {
			return o.refused(err)
		}
		return o.answered(p), nil
	}
}

// write commits the plan's path as the named change its action records: a
// claim when this delivery has not written yet, a settlement of its attempt
// afterwards. Every write carries the lease's fencing token.
func (o *owned) write(ctx context.Context, p Plan) error {
	c, next, err := o.change(p, o.g.Now())
	if err != nil {
		return err
	}
	return o.commit(ctx, c, next)
}

// change builds the named change that records p, and the row as it will be
// once that change commits.
func (o *owned) change(p Plan, now time.Time) (*Change, *Operation, error) {
	reason := p.Reason
	if o.claimed && o.leaseLost != nil {
		reason += " (lease lost during the call)"
	}
	var from State
	if o.op != nil {
		from = o.op.State
	}
	steps, err := stepsAlong(from, p.Path, reason)
	if err != nil {
		return nil, nil, err
	}
	next, w := o.writer(p, reason, now)
	var lookup *Attempt
	if o.looked != nil {
		l := *o.looked
		l.N = next.AttemptCount + 1
		next.AttemptCount, lookup = l.N, &l
	}
	var c *Change
	switch p.Action {
	case ActHandOff:
		at := now
		next.HandedOffAt = &at
		c = HandoffChange(w, steps, o.outboxEntry(now), reason, now)
	case ActAttempt, ActApplyLocal:
		a := &Attempt{N: next.AttemptCount + 1, Kind: AttemptEffect, IdempotencyKey: next.IdempotencyKey,
			Fence: o.lease.Fence, ContractVersion: o.route().ContractVersion, StartedAt: now}
		next.AttemptCount, next.LastAttempt = a.N, a
		if next.FirstAttemptAt == nil {
			next.FirstAttemptAt = &now
		}
		c = StartChange(w, steps, a, reason, now)
	case ActConfirm:
		next.ResultID, next.EvidenceAt = p.ResultID, &now
		c = ConfirmChange(w, steps, p.ResultID, reason, now)
	case ActMarkIndeterminate:
		next.Lane = LaneOperator
		c = IndeterminateChange(w, steps, LaneOperator, reason, now)
	case ActExhaust, ActRetentionGap:
		var dl *DeadLetter
		if p.DeadLetter {
			dl = &DeadLetter{OperationID: next.ID, Reason: bound(reason), At: now}
		}
		c = TerminalChange(w, steps, dl, reason, now)
	case ActRetryLater:
		c = RetryLaterChange(w, reason, now)
	default:
		return nil, nil, fmt.Errorf("gate: no ledger change records %s", p.Action)
	}
	c.Lookup = lookup
	if t := p.Target(); t != "" {
		next.State = t
	}
	next.Reason = c.Reason
	return c, next, nil
}

// commit writes c, after which next is the row as this owner knows it.
func (o *owned) commit(ctx context.Context, c *Change, next *Operation) error {
	name := "ledger claim"
	if o.claimed {
		name = "ledger settle"
	}
	cctx, s := o.g.startSpan(ctx, name)
	if s.IsRecording() {
		s.SetAttributes(attribute.String("ackgate.operation.id", next.ID), attribute.String("ackgate.change", string(c.Kind)),
			attribute.Int64("ackgate.fence", o.lease.Fence), attribute.String("ackgate.state", string(next.State)))
	}
	err := o.g.Ledger.Write(cctx, c)
	endSpan(s, err)
	if err != nil {
		return err
	}
	o.g.recorder().Transitioned(ctx, o.route(), c.Steps)
	o.op, o.claimed, o.looked = next, true, nil
	return nil
}

// applyLocal records the attempt p plans (unless the operation's creation
// recorded it), runs the route's statement and records what the table
// makes of its result, in one transaction. Until that commits, this
// owner's view of the row stays as it was: if it does not, nothing
// happened.
func (o *owned) applyLocal(ctx context.Context, p Plan) (Plan, error) {
	if o.g.Local == nil {
		return Plan{}, fmt.Errorf("gate: route %s is local and this gateway runs no local statements", o.route().Name)
	}
	before, wasClaimed := o.op, o.claimed
	started, startedAt := o.op, o.g.Now()
	var start *Change
	switch {
	case o.op == nil:
		c, next, err := o.creating(p, startedAt)
		if err != nil {
			return Plan{}, err
		}
		start, started = c, next
	case !o.claimed:
		c, next, err := o.change(p, startedAt)
		if err != nil {
			return Plan{}, err
		}
		start, started = c, next
	}
	if o.claimed {
		if a := o.op.LastAttempt; a != nil {
			startedAt = a.StartedAt
		}
	}
	var (
		settled Plan
		after   *Operation
		settle  *Change
	)
	req := &EffectRequest{Route: o.route(), Message: o.d.msg, OperationID: started.ID,
		IdempotencyKey: started.IdempotencyKey, Fence: o.lease.Fence}
	cctx, end := o.g.span(ctx, "local effect", attribute.String("ackgate.operation.id", started.ID),
		attribute.Int64("ackgate.fence", o.lease.Fence))
	began := time.Now()
	err := o.g.Local.Apply(cctx, start, req, func(er EffectResult) (*Change, error) {
		// Decide as if the start had committed, which inside this
		// transaction it has.
		o.op, o.claimed = started, true
		done := o.g.Now()
		o.finished = &Attempt{N: started.AttemptCount, Kind: AttemptEffect, IdempotencyKey: started.IdempotencyKey,
			Fence: o.lease.Fence, ContractVersion: o.route().ContractVersion, StartedAt: startedAt, FinishedAt: &done,
			Outcome: er.Outcome, StatusCode: er.StatusCode, ResultID: er.ResultID, Reason: bound(er.Reason)}
		settled = AfterAttempt(o.evidence(), er)
		var err error
		settle, after, err = o.change(settled, done)
		o.op, o.claimed = before, wasClaimed
		return settle, err
	})
	took := time.Since(began)
	end(err)
	o.d.downstream += took
	if err != nil {
		return Plan{}, err
	}
	if settle == nil {
		return Plan{}, fmt.Errorf("gate: the local statement of %s was never settled", started.ID)
	}
	o.g.recorder().Downstream(ctx, o.route(), AttemptEffect, o.finished.Outcome, took)
	if start != nil {
		o.g.recorder().Transitioned(ctx, o.route(), append(slices.Clone(start.Steps), settle.Steps...))
	} else {
		o.g.recorder().Transitioned(ctx, o.route(), settle.Steps)
	}
	o.op, o.claimed = after, true
	return settled, nil
}

// outboxEntry is the message as a handoff route's relay needs it, without
// the route's private attributes: the outbox keeps only what the effect
// may see, and the private values of its data sealed (Private).
func (o *owned) outboxEntry(now time.Time) *OutboxEntry {
	m := *o.d.msg
	m.Attributes = make(map[string]string, len(o.d.msg.Attributes))
	for k, v := range o.d.msg.Attributes {
		if !slices.Contains(o.route().Private, k) {
			m.Attributes[k] = v
		}
	}
	m.Envelope, m.TraceParent, m.TraceState = nil, "", ""
	var pointers []string
	for _, p := range o.route().Private {
		if strings.HasPrefix(p, "/") {
			pointers = append(pointers, p)
		}
	}
	return &OutboxEntry{OperationID: o.d.id.OperationID, Route: o.route().Name,
		PublicationID: o.d.id.IdempotencyKey, Message: &m, CreatedAt: now, NextAttemptAt: now, Private: pointers}
}

// writer is who writes p: on the first write, this delivery claiming the
// operation (creating it, or taking it under a higher fence); later, the
// holder settling its attempt. next is the row as it will be.
func (o *owned) writer(p Plan, reason string, now time.Time) (*Operation, Writer) {
	if o.claimed {
		next := *o.op
		fin := o.finished
		if fin != nil {
			next.LastAttempt = fin
		}
		var answer *Answer
		if o.d.rec != nil { // the relay answers no broker
			answer = &Answer{N: o.d.rec.N, Decision: p.Answer, Reason: bound(reason)}
		}
		facts := LeaseFacts{Extensions: o.extensions, Deadline: o.lease.Expires, LostAt: o.leaseLost}
		next.LeaseExtensions, next.LeaseDeadline, next.LeaseLostAt = facts.Extensions, &facts.Deadline, facts.LostAt
		return &next, Settling(o.op, o.lease.Fence, fin, answer, facts)
	}
	var rec *Delivery
	if o.d.rec != nil { // the relay claims without a delivery
		r := *o.d.rec
		r.Reason, r.Fence = bound(reason), o.lease.Fence
		if p.Action != ActAttempt && p.Action != ActApplyLocal {
			r.Decision = p.Answer // nothing follows this commit
		}
		rec = &r
	}
	var next Operation
	if o.op == nil {
		next = *o.newOperation()
	} else {
		next = *o.op
	}
	w := Claiming(o.op, &next, o.lease, rec)
	next.Fence, next.Owner = o.lease.Fence, o.lease.Owner
	// A copy: the renewer replaces o.lease while the call runs, and the row
	// as written must keep the deadline this claim recorded.
	deadline := o.lease.Expires
	next.LeaseStart, next.LeaseDeadline, next.LeaseExtensions, next.LeaseLostAt = &now, &deadline, 0, nil
	return &next, w
}

func (o *owned) newOperation() *Operation {
	r, id, now := o.route(), o.d.id, o.d.now
	return &Operation{
		ID: id.OperationID, ScopeKey: id.ScopeKey, Tenant: r.Tenant, Route: r.Name,
		KeySource: r.Key.Kind, Key: id.Key, Fingerprint: id.Fingerprint,
		FingerprintVersion: r.Fingerprint.Version, Shape: r.Shape, DeadLetterPolicy: r.DeadLetter,
		ContractVersion: r.ContractVersion, IdempotencyKey: id.IdempotencyKey,
		TraceID: o.d.rec.TraceID, SpanID: o.d.spanID, DeliveryCount: 1,
		CreatedAt: now, UpdatedAt: now, RetainUntil: now.Add(r.Retention),
	}
}

// attempt calls the downstream once, under renewal, and keeps how the
// attempt ended for the settling write.
func (o *owned) attempt(ctx context.Context) EffectResult {
	req := &EffectRequest{
		Route: o.route(), Message: o.d.msg, OperationID: o.op.ID,
		IdempotencyKey: o.op.IdempotencyKey, Fence: o.lease.Fence,
	}
	callCtx, cancel := context.WithDeadline(ctx, o.callDeadline())
	callCtx, s := o.g.startSpan(callCtx, "downstream effect")
	if s.IsRecording() {
		s.SetAttributes(attribute.String("ackgate.operation.id", req.OperationID),
			attribute.Int("ackgate.attempt", o.op.AttemptCount), attribute.Int64("ackgate.fence", req.Fence))
	}
	stop := o.renew(callCtx)
	began := time.Now()
	er := o.g.Effects.Execute(callCtx, req)
	took := time.Since(began)
	stop()
	if s.IsRecording() {
		s.SetAttributes(attribute.String("ackgate.outcome", string(er.Outcome)),
			attribute.Int("ackgate.lease.extensions", o.extensions))
	}
	endSpan(s, nil)
	cancel()
	o.d.downstream += took
	o.g.recorder().Downstream(ctx, o.route(), AttemptEffect, er.Outcome, took)
	now := o.g.Now()
	o.finished = &Attempt{
		N: o.op.AttemptCount, Kind: AttemptEffect, IdempotencyKey: o.op.IdempotencyKey,
		Fence: o.lease.Fence, ContractVersion: o.route().ContractVersion, StartedAt: o.op.LastAttempt.StartedAt,
		FinishedAt: &now, Outcome: er.Outcome, StatusCode: er.StatusCode, ResultID: er.ResultID, Reason: bound(er.Reason),
	}
	return er
}

// refused turns a ledger refusal into a nack. A fence or state mismatch means
// another owner moved on: this owner committed nothing and must not ack.
// The delivery's answer follows the response (unfenced): a superseded
// owner's lease loss is kept in the evidence, apart from the effect's state.
func (o *owned) refused(err error) (*Result, error) {
	var res *Result
	var ierr error
	switch {
	case errors.Is(err, ErrFenced):
		res = o.g.nack(o.d, "fenced: a newer owner holds the operation; nothing committed")
	case errors.Is(err, ErrStateChanged), errors.Is(err, ErrExists):
		res = o.g.nack(o.d, "operation changed underneath; the broker will redeliver")
	case errors.Is(err, ErrLocalConfig):
		res, ierr = o.g.nack(o.d, "the route's local statement cannot run as configured; nothing recorded"),
			&InfraError{"run local statement", err}
	default:
		res, ierr = o.g.nack(o.d, "evidence store unavailable"), &InfraError{"record evidence", err}
	}
	if o.d.rec != nil && o.op != nil {
		// The delivery is on record: the claim that created or found the
		// operation wrote it.
		a := &Answer{N: o.d.rec.N, Decision: Nack, Reason: res.Reason}
		id, ledger := o.op.ID, o.g.Ledger
		res.then(func(ctx context.Context) error { return ledger.AnswerDelivery(ctx, id, a) })
	}
	return res, ierr
}

// answered is the result of a committed plan; an ack also marks the
// operation acknowledged once the response is out. The post-response work
// keeps only the values it needs, not the delivery, so a result waiting in
// the after-answer queue does not hold the message and its decoded body.
func (o *owned) answered(p Plan) *Result {
	res := &Result{Decision: p.Answer, Reason: o.op.Reason, OperationID: o.op.ID, State: o.op.State}
	if len(p.AfterSent) > 0 {
		g, id, from, fence, route, path, reason := o.g, o.op.ID, o.op.State, o.lease.Fence, o.route(), p.AfterSent, ackReason(o.d)
		res.whenSent(func(ctx context.Context) error {
			return g.markAcknowledged(ctx, route, id, from, fence, path, reason)
		})
	}
	return res
}

// lookup asks the provider whether the effect exists and keeps the
// question as an attempt of its own, which this owner's next write records.
func (o *owned) lookup(ctx context.Context) LookupResult {
	lctx, cancel := context.WithDeadline(ctx, o.callDeadline())
	defer cancel()
	lctx, s := o.g.startSpan(lctx, "downstream lookup")
	if s.IsRecording() {
		s.SetAttributes(attribute.String("ackgate.operation.id", o.d.id.OperationID))
	}
	started := o.g.Now()
	began := time.Now()
	lr := o.g.Effects.Lookup(lctx, &EffectRequest{
		Route: o.route(), Message: o.d.msg, OperationID: o.d.id.OperationID,
		IdempotencyKey: o.d.id.IdempotencyKey, Fence: o.lease.Fence,
	})
	took := time.Since(began)
	if s.IsRecording() {
		s.SetAttributes(attribute.String("ackgate.outcome", string(lr.Outcome)))
	}
	endSpan(s, nil)
	o.d.downstream += took
	o.g.recorder().Downstream(ctx, o.route(), AttemptLookup, lr.Outcome, took)
	done := o.g.Now()
	o.looked = &Attempt{Kind: AttemptLookup, IdempotencyKey: o.d.id.IdempotencyKey, Fence: o.lease.Fence,
		ContractVersion: o.route().ContractVersion, StartedAt: started, FinishedAt: &done,
		Outcome: lr.Outcome, StatusCode: lr.StatusCode, ResultID: lr.ResultID, Reason: bound(lr.Reason)}
	return lr
}

// callDeadline leaves room, before the broker gives up on us, to commit the
// result and answer. Without a lease in the reservation store (take
// failed), the lease the ledger records is all that keeps other owners
// off, so the call ends with it.
func (o *owned) callDeadline() time.Time {
	margin := min(2*time.Second, o.route().AckDeadline/5)
	end := o.d.deadline.Add(-margin)
	if !o.taken && o.lease.Expires.Before(end) {
		end = o.lease.Expires
	}
	return end
}

// renew keeps the lease while the call runs: every Renewal.Interval, only
// while this owner still holds it, and never more than MaxExtension past the
// lease as first taken, so stalled work cannot hide the operation for long
// (and OwnerBound holds). It runs on the runtime's timers, not a goroutine
// of its own: a delivery waiting on its call holds one goroutine, and each
// renewal borrows another only for its round trip. The stop function it
// returns waits for a renewal under way, after which the lease and its
// facts are the caller's again.
func (o *owned) renew(ctx context.Context) (stop func()) {
	r := o.route()
	if r.Renewal.Interval <= 0 || !o.taken {
		return noRenewal
	}
	rn := &renewal{o: o, limit: o.firstExpiry.Add(r.Renewal.MaxExtension)}
	rn.ctx, rn.cancel = context.WithCancel(ctx)
	rn.mu.Lock()
	rn.pending.Add(1)
	rn.timer = time.AfterFunc(r.Renewal.Interval, rn.tick)
	rn.mu.Unlock()
	return rn.stop
}

func noRenewal() {}

// renewal is one call's lease renewal (owned.renew), its state in one
// allocation rather than a closure and a heap cell per variable.
type renewal struct {
	o      *owned
	limit  time.Time
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	stopped bool
	pending sync.WaitGroup // a renewal scheduled or under way
	timer   *time.Timer
}

func (rn *renewal) tick() {
	defer rn.pending.Done()
	o, r := rn.o, rn.o.route()
	ttl := min(leaseTTL(r), rn.limit.Sub(o.g.Now()))
	if ttl <= 0 {
		return // the cap is reached: the lease lapses as it stands
	}
	l, err := o.g.Reservations.Renew(rn.ctx, o.lease, ttl)
	if errors.Is(err, ErrLeaseLost) {
		lost := o.g.Now()
		o.leaseLost = &lost
		return
	}
	if err == nil {
		o.lease = l
		o.extensions++
	}
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if !rn.stopped {
		rn.pending.Add(1)
		rn.timer.Reset(r.Renewal.Interval)
	}
}

func (rn *renewal) stop() {
	rn.mu.Lock()
	rn.stopped = true
	if rn.timer.Stop() {
		rn.pending.Done() // it never ran
	}
	rn.mu.Unlock()
	rn.cancel()
	rn.pending.Wait()
}
