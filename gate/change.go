package gate

import "time"

// A ledger write is one of a few named changes. Each constructor below sets
// exactly the fields its step writes, and storage writes exactly the columns
// its kind names, so no field's zero value has to mean "leave it alone".

// ChangeKind names what a change records; storage switches on it.
type ChangeKind string

const (
	// ChangeStart records intent: the operation moves to pending_effect with a
	// new attempt (and its idempotency key) started, before the call.
	ChangeStart ChangeKind = "start"
	// ChangeConfirm records authoritative effect evidence and moves the
	// operation to ack_pending.
	ChangeConfirm ChangeKind = "confirm"
	// ChangeIndeterminate parks the operation in a lane: it may have taken
	// effect and nothing can tell.
	ChangeIndeterminate ChangeKind = "indeterminate"
	// ChangeTerminal ends the operation, dead-lettering it when the gateway
	// owns dead letters.
	ChangeTerminal ChangeKind = "terminal"
	// ChangeRetryLater records a finished attempt that left the operation
	// open for the next delivery.
	ChangeRetryLater ChangeKind = "retry_later"
	// ChangeAcked records that the acknowledging response was written.
	ChangeAcked ChangeKind = "acked"
	// ChangeHandoff records a handoff route's operation with its outbox
	// entry: intent durable (pending_effect), the effect left to the relay.
	ChangeHandoff ChangeKind = "handoff"
	// ChangeResolve records an operator's resolution: the intervention, the
	// path it takes, and what it grants or confirms.
	ChangeResolve ChangeKind = "resolve"
	// ChangeReconcile records one lookup the reconciler made about an
	// indeterminate operation, and what its answer settled.
	ChangeReconcile ChangeKind = "reconcile"
)

// Change is one atomic ledger write, built only by the constructors below.
type Change struct {
	Kind ChangeKind
	// OperationID names the row; for a creating claim it is Claim.Row.ID.
	OperationID string
	// Expect guards the write: the row must still be in this state. Empty
	// only when a claim creates the operation.
	Expect State
	// Fence is the writer's fencing token: a claim's must be strictly greater
	// than the recorded one, any other write's equal to it.
	Fence int64
	Steps []Step
	// Reason becomes the operation's latest reason (every kind but acked).
	Reason string
	At     time.Time

	// Exactly one of Claim and Settle is set, except on ChangeAcked.
	Claim  *Claim
	Settle *Settle

	// Start is the attempt a ChangeStart opens.
	Start *Attempt
	// Lookup is a lookup of the effect the writer made before this change
	// (a delivery's lookup-first, a lookup after its own attempt lost its
	// response, the reconciler's check): an attempt of its own, recorded
	// finished, numbered before any attempt the change starts.
	Lookup *Attempt
	// ResultID is the evidence a ChangeConfirm commits (its time is At).
	ResultID string
	// Lane is who settles a ChangeIndeterminate.
	Lane string
	// DeadLetter is set on a ChangeTerminal (or an abandoning
	// ChangeResolve) when the gateway dead-letters.
	DeadLetter *DeadLetter

	// Outbox is the entry a ChangeHandoff commits with the operation.
	Outbox *OutboxEntry

	// Intervene is set on ChangeResolve and ChangeReconcile: the writer took
	// the lease outside any delivery.
	Intervene *Intervene
}

// Intervene is a write from outside the push path: an operator's
// resolution or the reconciler. It takes the operation's lease like a
// delivery (its fence must be strictly greater than the recorded one, so a
// running owner can no longer write) and records itself as the owner of
// that fence, but no delivery, and it leaves the lease's start, deadline
// and extensions as the last delivery's owner left them.
type Intervene struct {
	Owner string
	// Intervention is the operator's, on ChangeResolve.
	Intervention *Intervention
	// Grant, when not zero, is the new Operation.Grant.
	Grant int
	// NextCheckAt and Checks are the reconciler's schedule after this
	// change (nil and 0 once the operation leaves the lane).
	NextCheckAt *time.Time
	Checks      int
}

// Claim is the first write of a delivery that took the operation's lease:
// it creates the operation (Row set, through Ledger.Claim) or takes it under
// a higher fence (through Ledger.Write).
type Claim struct {
	// Row is the whole new operation when the claim creates it; nil when
	// the operation exists.
	Row           *Operation
	Owner         string
	LeaseDeadline time.Time
	// Delivery is the claiming delivery: recorded as the operation's first
	// when the claim creates it; when it takes an existing operation, the
	// further delivery Ledger.Claim recorded already (its N set), which the
	// claim marks with the fence it took.
	Delivery *Delivery
	// Reset says the lease came from a reservation store that had lost the
	// operation's counter (Lease.Reset).
	Reset bool
	// AckedAnswer is what a creating claim's delivery is told when it finds
	// the operation already acknowledged instead (see Ledger.Claim):
	// RedeliveredAfterAck, recorded with the delivery by the same statement.
	AckedAnswer *Answer
}

// Settle is a write by the delivery that already holds the operation,
// recording how its attempt ended, what the delivery is told, and what
// became of its lease meanwhile.
type Settle struct {
	Finish *Attempt
	Answer *Answer
	Lease  LeaseFacts
}

// LeaseFacts is what happened to a lease while its owner's call ran: how
// often it was renewed, when it last ran out, and when a renewal found it
// gone. Lease loss is a fact of its own: the effect may still be pending,
// confirmed or indeterminate.
type LeaseFacts struct {
	Extensions int
	Deadline   time.Time
	LostAt     *time.Time
}

// Writer is who makes a change and under what guard: a claiming delivery
// (Claiming) or the current holder settling its attempt (Settling).
type Writer struct {
	opID   string
	expect State
	fence  int64
	claim  *Claim
	settle *Settle
	// owner is set by Intervening only.
	owner string
}

// Claiming is a delivery taking the lease on op (nil: creating row) under
// the lease's fence.
func Claiming(op, row *Operation, lease Lease, d *Delivery) Writer {
	w := Writer{fence: lease.Fence, claim: &Claim{
		Owner: lease.Owner, LeaseDeadline: lease.Expires, Delivery: d, Reset: lease.Reset,
	}}
	if op == nil {
		w.opID, w.claim.Row = row.ID, row
	} else {
		w.opID, w.expect = op.ID, op.State
	}
	return w
}

// Intervening is an operator's resolution or the reconciler taking op's
// lease outside any delivery.
func Intervening(op *Operation, lease Lease) Writer {
	return Writer{opID: op.ID, expect: op.State, fence: lease.Fence, owner: lease.Owner}
}

// Settling is the holder of op's lease recording its attempt's end.
func Settling(op *Operation, fence int64, finish *Attempt, answer *Answer, lease LeaseFacts) Writer {
	return Writer{opID: op.ID, expect: op.State, fence: fence,
		settle: &Settle{Finish: finish, Answer: answer, Lease: lease}}
}

func (w Writer) change(k ChangeKind, steps []Step, reason string, at time.Time) *Change {
	return &Change{Kind: k, OperationID: w.opID, Expect: w.expect, Fence: w.fence,
		Steps: steps, Reason: bound(reason), At: at, Claim: w.claim, Settle: w.settle}
}

// StartChange records intent and attempt a, before the call is made.
func StartChange(w Writer, steps []Step, a *Attempt, reason string, at time.Time) *Change {
	c := w.change(ChangeStart, steps, reason, at)
	c.Start = a
	return c
}

// ConfirmChange commits the effect's evidence, resultID, at at.
func ConfirmChange(w Writer, steps []Step, resultID, reason string, at time.Time) *Change {
	c := w.change(ChangeConfirm, steps, reason, at)
	c.ResultID = resultID
	return c
}

// IndeterminateChange parks the operation in lane.
func IndeterminateChange(w Writer, steps []Step, lane, reason string, at time.Time) *Change {
	c := w.change(ChangeIndeterminate, steps, reason, at)
	c.Lane = lane
	return c
}

// TerminalChange ends the operation; dl is nil unless the gateway
// dead-letters it.
func TerminalChange(w Writer, steps []Step, dl *DeadLetter, reason string, at time.Time) *Change {
	c := w.change(ChangeTerminal, steps, reason, at)
	c.DeadLetter = dl
	return c
}

// HandoffChange commits intent with the outbox entry e, in one write.
func HandoffChange(w Writer, steps []Step, e *OutboxEntry, reason string, at time.Time) *Change {
	c := w.change(ChangeHandoff, steps, reason, at)
	c.Outbox = e
	return c
}

// RetryLaterChange records an attempt's end that leaves the operation open.
func RetryLaterChange(w Writer, reason string, at time.Time) *Change {
	return w.change(ChangeRetryLater, nil, reason, at)
}

// AckedChange records, under the fence that confirmed it, that the ack for
// operation id (now in from) was written at at.
func AckedChange(id string, from State, fence int64, steps []Step, at time.Time) *Change {
	return &Change{Kind: ChangeAcked, OperationID: id, Expect: from, Fence: fence, Steps: steps, At: at}
}

// ResolveChange records iv along steps. grant (0 for none) allows the next
// delivery one attempt; resultID is the evidence of a "happened"; dl is set
// when an abandoned operation is dead-lettered by the gateway.
func ResolveChange(w Writer, steps []Step, iv *Intervention, grant int, resultID string, dl *DeadLetter, reason string, at time.Time) *Change {
	c := w.change(ChangeResolve, steps, reason, at)
	c.Intervene = &Intervene{Owner: w.owner, Intervention: iv, Grant: grant}
	c.ResultID, c.DeadLetter = resultID, dl
	return c
}

// ReconcileChange records the reconciler's finished lookup and what it
// settled: steps to effect_confirmed with resultID, steps back to
// pending_effect with grant, or no steps and the next check.
func ReconcileChange(w Writer, steps []Step, lookup *Attempt, resultID string, grant int, next *time.Time, checks int, reason string, at time.Time) *Change {
	c := w.change(ChangeReconcile, steps, reason, at)
	c.Intervene = &Intervene{Owner: w.owner, Grant: grant, NextCheckAt: next, Checks: checks}
	c.ResultID, c.Lookup = resultID, lookup
	return c
}
