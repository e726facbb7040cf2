package gate

import (
	"fmt"
	"time"
)

// Decision is what the gate tells the broker. Handlers map it to a status code
// per broker; nothing else in the gateway chooses a status.
type Decision string

const (
	// Ack: the effect is confirmed now or earlier, or the message was durably
	// dead-lettered by the gateway.
	Ack Decision = "ack"
	// Nack: send it again later; nothing is lost by answering this.
	Nack Decision = "nack"
	// Reject: a deliberate refusal of a request we never want to see again.
	Reject Decision = "reject"
)

// Action is the next safe step for an operation, chosen from its evidence.
// The executor (owned.go) maps each to the I/O it needs and nothing more.
type Action string

const (
	// ActAttempt: commit the plan's path with a new attempt (and the
	// operation's idempotency key) recorded, then call the downstream.
	ActAttempt Action = "attempt"
	// ActApplyLocal: a local route's ActAttempt. The attempt, the statement
	// and its result are recorded in one transaction (Local.Apply), so the
	// call and its evidence cannot be told apart by a crash.
	ActApplyLocal Action = "apply_local"
	// ActHandOff: commit the operation with an outbox entry, then ack: the
	// relay performs the effect later, under the same rules.
	ActHandOff Action = "hand_off"
	// ActLookupFirst: an earlier attempt's result was lost and the provider can
	// be asked; ask under the lease before writing anything, then AfterLookup.
	ActLookupFirst Action = "lookup_first"
	// ActConfirm: authoritative evidence is in hand; commit it, then ack.
	ActConfirm Action = "confirm"
	// ActRetryLater: the attempt left no effect and may be repeated; commit
	// its outcome and let the broker redeliver.
	ActRetryLater Action = "retry_later"
	// ActMarkIndeterminate: an attempt may have taken effect and nothing can
	// tell; block automatic re-execution.
	ActMarkIndeterminate Action = "mark_indeterminate"
	// ActExhaust: the attempt limit is reached, or the downstream refused for
	// good; the operation becomes terminal.
	ActExhaust Action = "exhaust"
	// ActRetentionGap: the message is older than the evidence we keep, so a
	// missing record does not prove the work was never done.
	ActRetentionGap Action = "retention_gap"
	// ActConflict: the key is taken by an operation with another fingerprint;
	// keep a conflict record, never execute it.
	ActConflict Action = "conflict"
	// ActAckExisting: the effect is confirmed; ack without a new effect.
	ActAckExisting Action = "ack_existing"
	// ActHoldTerminal: policy forbids another attempt.
	ActHoldTerminal Action = "hold_terminal"
	// ActHoldIndeterminate: awaiting reconciliation; never re-executed here.
	ActHoldIndeterminate Action = "hold_indeterminate"
	// ActHoldLease: the reservation store lost its state while an attempt was
	// open, and that attempt's owner may still be calling the downstream.
	// Keep the lease until the owner must have stopped, and nack meanwhile.
	ActHoldLease Action = "hold_lease"
)

// Evidence is what the gate knows at a decision point.
type Evidence struct {
	Route *Route
	// Op is the ledger's operation for the delivery's key; nil when new.
	Op *Operation
	// Fingerprint is the delivery's semantic fingerprint, held against Op's.
	Fingerprint string
	// Held is true once this delivery's own claim committed: its lease's
	// fence is the operation's, and its next write does not re-reserve.
	Held bool
	// PublishTime is when the broker accepted the message (zero if unknown).
	PublishTime time.Time
	Now         time.Time
}

// Plan is a decision: what to do, the states the operation moves through
// when it is done, and what the broker is told afterwards.
type Plan struct {
	Action Action
	// Path lists the states the plan's write enters, in order, starting after
	// the operation's current state; a new operation's path starts at
	// received. Empty when the plan writes no state change.
	Path []State
	// Answer is the broker's answer once the path is committed. For
	// ActAttempt and ActLookupFirst it is only the answer if nothing that
	// follows can be committed: the call's result decides the real one.
	Answer Decision
	// AfterSent is the path recorded once an ack has been written to the
	// broker, and only then: a failed write leaves the operation as it was.
	AfterSent []State
	// ResultID is the authoritative evidence an ActConfirm commits.
	ResultID string
	// DeadLetter is set when the plan takes the message out of circulation
	// in the gateway's own ledger, which is what lets a terminal answer be
	// an ack.
	DeadLetter bool
	// Reason is recorded with the resulting transitions and delivery.
	Reason string
	// Anomaly flags a delivery the broker should not have sent.
	Anomaly string
	// HoldUntil is when an ActHoldLease may let go.
	HoldUntil time.Time
	// Grant is set by ActGrant: the write allows exactly one more attempt.
	Grant bool
}

// Target is the state the plan leaves the operation in ("" when it writes no
// state change).
func (p Plan) Target() State {
	if len(p.Path) == 0 {
		return ""
	}
	return p.Path[len(p.Path)-1]
}

// The decision table, in three pure functions. Each reads only evidence and
// the route's contract, so every row is testable without a database
// (decision_test.go walks them all):
//
//	Decide, when a delivery arrives:
//	evidence                                   path                                answer
//	new, published before the evidence horizon received → terminal_failure         dead-letter policy
//	new                                        received → reserved → pending_effect (after the call)
//	new, handoff route                         received → reserved → pending_effect + outbox entry  ack
//	handed off, effect not yet confirmed       —                                   ack (the relay owns it now)
//	key reused with another fingerprint        (a conflict record: received → conflicting) dead-letter policy
//	confirmed, ack not yet sent                —                                   ack, then [ack_pending →] acknowledged once sent
//	acknowledged (a redelivery: an anomaly)    —                                   ack
//	indeterminate                              —                                   nack
//	terminal or conflicting                    —                                   dead-letter policy
//	open, one attempt granted (operator, lookup) [reserved →] pending_effect       (after the call)
//	open, no attempt yet                       [reserved →] pending_effect         (after the call)
//	  (on a local route every attempt is the statement run in the ledger's own transaction)
//	open, last attempt failed, documented      [reserved →] pending_effect, or → terminal_failure at the limit
//	open, last attempt's result lost           by shape: see afterLostResponse
//
//	AfterAttempt, when the call returned:
//	confirmed with a result id                 → effect_confirmed → ack_pending    ack, then → acknowledged once sent
//	refused for good                           → terminal_failure                  dead-letter policy
//	documented failure / result lost           the Decide row for the new evidence, without re-reserving
//
//	AfterLookup, when the provider was asked:
//	found                                      [reserved →] effect_confirmed → ack_pending  ack
//	absent, before an attempt                  [reserved →] pending_effect         (after the call)
//	absent, after this delivery's attempt      —                                   nack (retry allowed)
//	lookup unavailable                         [reserved →] effect_indeterminate   nack
//
// A delivery without a usable identity never gets here: Identify refuses it.
// "Evidence durable but not committed" is not a row, because no plan answers
// ack before its path is committed.
func Decide(ev Evidence) Plan {
	r, op := ev.Route, ev.Op
	if op == nil {
		if r.Retention > 0 && !ev.PublishTime.IsZero() && ev.Now.Sub(ev.PublishTime) > r.Retention {
			return terminal(plan(ActRetentionGap, AnswerFor(StateTerminalFailure, r.DeadLetter),
				fmt.Sprintf("published %s ago, before the %s evidence horizon: a missing record proves nothing", ev.Now.Sub(ev.PublishTime).Round(time.Second), r.Retention),
				StateReceived, StateTerminalFailure))
		}
		if r.Shape == ShapeHandoff {
			return handoff(ev, ReasonNewOperation)
		}
		return plan(attemptAction(r), Nack, ReasonNewOperation, StateReceived, StateReserved, StatePendingEffect)
	}
	if ev.Fingerprint != "" && op.Fingerprint != ev.Fingerprint {
		// The reason names the operation, never the key: a key may be drawn
		// from the publisher's data, which reasons and logs must not carry.
		return plan(ActConflict, AnswerFor(StateConflicting, r.DeadLetter),
			fmt.Sprintf("the operation's key was reused with a different fingerprint than operation %s", op.ID),
			StateReceived, StateConflicting)
	}
	if r.Shape == ShapeHandoff && op.HandedOffAt != nil && !op.State.Confirmed() {
		// The broker was acked when the outbox entry committed; whatever the
		// relay has reached since is its work, not a redelivery's.
		return plan(ActAckExisting, Ack, fmt.Sprintf("handed off at %s; effect evidence pending (%s)",
			op.HandedOffAt.UTC().Format(time.RFC3339Nano), op.State))
	}
	switch op.State {
	case StateEffectConfirmed:
		p := plan(ActAckExisting, Ack, "effect already confirmed")
		p.AfterSent = []State{StateAckPending, StateAcknowledged}
		return p
	case StateAckPending:
		p := plan(ActAckExisting, Ack, "effect already confirmed")
		p.AfterSent = []State{StateAcknowledged}
		return p
	case StateAcknowledged:
		return RedeliveredAfterAck()
	case StateEffectIndeterminate:
		return plan(ActHoldIndeterminate, Nack, "effect indeterminate: awaiting reconciliation")
	case StateTerminalFailure, StateConflicting:
		return plan(ActHoldTerminal, AnswerFor(op.State, op.DeadLetterPolicy), "terminal: "+op.Reason)
	}
	// received, reserved or pending_effect: the effect question is open.
	if r.Shape == ShapeHandoff {
		return handoff(ev, "intent recorded, not yet handed off")
	}
	if op.Grant > op.AttemptCount {
		// Evidence from outside the push path (recovery.go) says the effect
		// did not happen: one attempt, whatever the last one's outcome.
		return attempt(ev, "an attempt was granted: "+op.Reason)
	}
	last := op.LastAttempt
	if last == nil {
		return attempt(ev, "intent recorded, no attempt yet")
	}
	switch last.Outcome {
	case OutcomeRetryable, OutcomeAbsent:
		if op.AttemptCount >= r.MaxAttempts {
			return exhaust(ev, fmt.Sprintf("attempt limit %d reached; last: %s", r.MaxAttempts, last.Reason))
		}
		return attempt(ev, "retry after a documented failure")
	case OutcomeUnknown, "":
		return afterLostResponse(ev)
	}
	// A confirmed or terminal attempt outcome is always committed together with
	// its state, so an open state with one means the ledger was edited by hand.
	return indeterminate(ev, fmt.Sprintf("inconsistent evidence: state %s with last attempt %s", op.State, last.Outcome))
}

// The reasons of the common path's steps, which the ledger keeps as the
// steps themselves rather than as words (storage reads them back so).
const (
	ReasonNewOperation = "new operation"
	ReasonAckWritten   = "acknowledging response written"
)

// RedeliveredAfterAck is the table's row for a delivery that finds its
// operation acknowledged. It reads no evidence but the state, so the ledger
// can record it with the delivery in the statement that finds the
// operation (Claim.AckedAnswer), and such a redelivery costs that one
// statement.
func RedeliveredAfterAck() Plan {
	p := plan(ActAckExisting, Ack, "redelivered after the ack was sent")
	p.Anomaly = "redelivered_after_ack"
	return p
}

// LeaseRecorded is the table's row for a delivery that would take an
// operation's lease while the ledger still records another owner's: an
// attempt is open (started, no outcome) and the lease its owner recorded
// has not run out. That owner may be calling the downstream right now, so
// the delivery nacks without asking the reservation store, which may not
// hold the lease yet (a creating owner records its lease in the ledger
// before it takes it there) or may have lost it.
//
//	evidence                                      plan
//	attempt open, recorded lease not run out       nack
//	anything else                                  p
func LeaseRecorded(ev Evidence, p Plan) Plan {
	op := ev.Op
	if op == nil || op.LeaseDeadline == nil || !ev.Now.Before(*op.LeaseDeadline) ||
		op.LastAttempt == nil || op.LastAttempt.Outcome != "" {
		return p
	}
	switch op.State {
	case StateReserved, StatePendingEffect:
	default:
		return p
	}
	return plan(ActHoldLease, Nack, fmt.Sprintf("the owner of fence %d holds the lease until %s", op.Fence,
		op.LeaseDeadline.UTC().Format(time.RFC3339Nano)))
}

// afterLostResponse applies the route's shape when the last attempt may or
// may not have taken effect: sent with no answer, or started by an owner that
// never recorded a result.
func afterLostResponse(ev Evidence) Plan {
	r, op := ev.Route, ev.Op
	exhausted := op.AttemptCount >= r.MaxAttempts
	switch r.Shape {
	case ShapeLookup:
		return plan(ActLookupFirst, Nack, "earlier result lost: look up before retrying")
	case ShapeIdempotent:
		if !insideDedupeWindow(ev) {
			return indeterminate(ev, fmt.Sprintf("earlier result lost and the provider's %s dedupe window no longer covers the first attempt", r.DedupeWindow))
		}
		if exhausted {
			return indeterminate(ev, fmt.Sprintf("earlier result lost and attempt limit %d reached", r.MaxAttempts))
		}
		return attempt(ev, "earlier result lost: retry with the same idempotency key inside the dedupe window")
	case ShapeRepeatable:
		if exhausted {
			return exhaust(ev, fmt.Sprintf("attempt limit %d reached; last result unknown on a repeatable effect", r.MaxAttempts))
		}
		return attempt(ev, "earlier result lost: repeatable effect, repeat it")
	case ShapeLocal:
		// A local attempt commits with its statement or not at all, so an
		// attempt recorded without its end applied nothing.
		if exhausted {
			return exhaust(ev, fmt.Sprintf("attempt limit %d reached", r.MaxAttempts))
		}
		return attempt(ev, "an unfinished local attempt applied nothing: run the statement again")
	default: // ShapeUnsafe and anything unrecognised: never re-execute on a guess.
		return indeterminate(ev, "earlier result lost on an unsafe effect: operator must settle it")
	}
}

// AfterAttempt is the table's row for an attempt this delivery just made;
// ev.Op is the operation with that attempt started (and ev.Held set).
func AfterAttempt(ev Evidence, res EffectResult) Plan {
	switch res.Outcome {
	case OutcomeConfirmed:
		return confirm(ev, res.ResultID, "downstream confirmed the effect")
	case OutcomeTerminal:
		return exhaust(ev, "downstream refused for good: "+res.Reason)
	}
	// Retryable or unknown: the evidence now has this attempt's outcome, and
	// the arrival table says what it allows. Only a fresh delivery may start
	// another attempt, so "attempt" here means "let the broker redeliver".
	after := *ev.Op
	last := Attempt{N: after.AttemptCount}
	if ev.Op.LastAttempt != nil {
		last = *ev.Op.LastAttempt
	}
	last.Outcome, last.Reason = res.Outcome, res.Reason
	after.LastAttempt = &last
	ev.Op = &after
	p := Decide(ev)
	switch p.Action {
	case ActAttempt, ActApplyLocal:
		return plan(ActRetryLater, Nack, "attempt failed, the broker will redeliver: "+p.Reason)
	case ActLookupFirst:
		p.Reason = "response lost: " + p.Reason
	}
	return p
}

// AfterLookup is the table's row for a lookup of the effect: made before any
// write when an earlier result was lost (ev.Held false), or right after this
// delivery's own attempt lost its response (ev.Held true).
func AfterLookup(ev Evidence, res LookupResult) Plan {
	switch res.Outcome {
	case OutcomeConfirmed:
		return confirm(ev, res.ResultID, "lookup found the effect: "+res.ResultID)
	case OutcomeAbsent:
		if ev.Held {
			return plan(ActRetryLater, Nack, "response lost; lookup says absent, a retry is allowed")
		}
		return attempt(ev, "lookup says the effect is absent: retry allowed")
	}
	return indeterminate(ev, "earlier result lost and the lookup is unavailable: "+res.Reason)
}

// AfterReset is the table's row for a lease whose store had lost its
// fencing counter (Lease.Reset), so the previous owner was never told it
// lost the lease. The ledger still fences that owner's writes, but not its
// downstream call: on a route whose downstream does not check the fence, a
// new attempt (or a lookup answering "absent" before the old call lands)
// could apply the effect twice. So while an attempt is open and its owner
// may still be at work, p gives way to a hold; otherwise p stands.
//
//	evidence                                        plan
//	lease reset, attempt open, owner's bound ahead  hold the lease until the bound, nack
//	anything else                                   p
func AfterReset(ev Evidence, p Plan) Plan {
	op := ev.Op
	if op == nil || op.LeaseStart == nil || op.LastAttempt == nil || op.LastAttempt.Outcome != "" {
		return p
	}
	switch op.State {
	case StateReserved, StatePendingEffect:
	default:
		return p
	}
	bound := OwnerBound(ev.Route, *op.LeaseStart)
	if !ev.Now.Before(bound) {
		return p
	}
	h := plan(ActHoldLease, Nack, fmt.Sprintf("the reservation store lost its state; the owner of fence %d may be at work until %s",
		op.Fence, bound.UTC().Format(time.RFC3339)))
	h.HoldUntil = bound
	return h
}

// OwnerBound is the latest an owner that claimed at start can still be
// calling the downstream: its call ends before the broker's deadline, and
// nothing it does runs past its lease's last renewal (MaxExtension).
func OwnerBound(r *Route, start time.Time) time.Time {
	return start.Add(r.AckDeadline + r.Renewal.MaxExtension)
}

// AnswerFor is the one map from a settled state to what the broker is told.
// A terminal state is acked only when the gateway itself dead-letters
// (having recorded it); otherwise the broker's own dead-letter policy must
// see nacks. Every open state is a nack: its work is not done.
func AnswerFor(s State, p DeadLetterPolicy) Decision {
	switch s {
	case StateEffectConfirmed, StateAckPending, StateAcknowledged:
		return Ack
	case StateTerminalFailure, StateConflicting:
		if p == DeadLetterGateway {
			return Ack
		}
	}
	return Nack
}

func plan(a Action, answer Decision, reason string, path ...State) Plan {
	return Plan{Action: a, Path: path, Answer: answer, Reason: reason}
}

func attempt(ev Evidence, reason string) Plan {
	return plan(attemptAction(ev.Route), Nack, reason, via(ev, StatePendingEffect)...)
}

// attemptAction is how a route's attempt is made: a local statement is run
// in the ledger's transaction, anything else is a call.
func attemptAction(r *Route) Action {
	if r.Shape == ShapeLocal {
		return ActApplyLocal
	}
	return ActAttempt
}

func handoff(ev Evidence, reason string) Plan {
	return plan(ActHandOff, Ack, reason, via(ev, StatePendingEffect)...)
}

func confirm(ev Evidence, resultID, reason string) Plan {
	p := plan(ActConfirm, Ack, reason, via(ev, StateEffectConfirmed, StateAckPending)...)
	p.ResultID, p.AfterSent = resultID, []State{StateAcknowledged}
	return p
}

func exhaust(ev Evidence, reason string) Plan {
	return terminal(plan(ActExhaust, AnswerFor(StateTerminalFailure, ev.Route.DeadLetter), reason, via(ev, StateTerminalFailure)...))
}

// terminal marks a plan that ends the operation: the gateway dead-letters it
// exactly when it answers the broker ack.
func terminal(p Plan) Plan {
	p.DeadLetter = p.Answer == Ack
	return p
}

func indeterminate(ev Evidence, reason string) Plan {
	return plan(ActMarkIndeterminate, Nack, reason, via(ev, StateEffectIndeterminate)...)
}

// via is the path to the given states for a delivery that writes them: one
// that holds the operation goes there directly; one that does not first
// reserves it (a new operation starts at received, and an operation already
// in reserved is not reserved twice).
func via(ev Evidence, to ...State) []State {
	if ev.Held {
		return to
	}
	var path []State
	switch {
	case ev.Op == nil:
		path = []State{StateReceived, StateReserved}
	case ev.Op.State != StateReserved:
		path = []State{StateReserved}
	}
	return append(path, to...)
}

// insideDedupeWindow reports whether a retry started now (and running for up
// to the effect timeout) still falls inside the provider's dedupe window
// measured from the first attempt.
func insideDedupeWindow(ev Evidence) bool {
	first := ev.Op.FirstAttemptAt
	if first == nil || ev.Route.DedupeWindow <= 0 {
		return false
	}
	return ev.Now.Add(ev.Route.Effect.Timeout).Before(first.Add(ev.Route.DedupeWindow))
}
