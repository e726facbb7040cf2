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
type Action string

const (
	// ActAttempt: reserve, record intent (with the operation's idempotency
	// key), then call the downstream.
	ActAttempt Action = "attempt"
	// ActLookupFirst: an earlier attempt's result was lost and the provider can
	// be asked; ask before anything else.
	ActLookupFirst Action = "lookup_first"
	// ActMarkIndeterminate: an attempt may have taken effect and nothing can
	// tell; block automatic re-execution.
	ActMarkIndeterminate Action = "mark_indeterminate"
	// ActExhaust: the attempt limit is reached after documented failures.
	ActExhaust Action = "exhaust"
	// ActRetentionGap: the message is older than the evidence we keep, so a
	// missing record does not prove the work was never done.
	ActRetentionGap Action = "retention_gap"
	// ActAckExisting: the effect is confirmed; ack without a new effect.
	ActAckExisting Action = "ack_existing"
	// ActHoldTerminal: policy forbids another attempt.
	ActHoldTerminal Action = "hold_terminal"
	// ActHoldIndeterminate: awaiting reconciliation; never re-executed here.
	ActHoldIndeterminate Action = "hold_indeterminate"
)

// Evidence is what the gate knows when a delivery arrives.
type Evidence struct {
	Route *Route
	// Op is the ledger's operation for the delivery's key; nil when new.
	Op *Operation
	// PublishTime is when the broker accepted the message (zero if unknown).
	PublishTime time.Time
	Now         time.Time
}

// Plan is the decision function's answer.
type Plan struct {
	Action Action
	// Reason is recorded with the resulting transition or delivery.
	Reason string
}

// Decide is the acknowledgment decision table. It reads only the evidence and
// the route's contract, so every row can be tested without a database:
//
//	evidence                                   -> plan
//	new operation, older than retention        -> ActRetentionGap
//	new operation / intent but no attempt      -> ActAttempt
//	last attempt failed, documented, no effect -> ActAttempt, or ActExhaust at the limit
//	last attempt's result lost                 -> by shape: retry with the same key (inside the
//	                                              dedupe window), look up first, or indeterminate
//	effect confirmed, ack sent or not          -> ActAckExisting (never a second effect)
//	effect indeterminate                       -> ActHoldIndeterminate
//	terminal failure                           -> ActHoldTerminal
//
// A delivery without a usable identity never reaches Decide: Identify refuses
// it first. "Evidence durable but not committed" is not a row here because
// the gate commits evidence before it asks for an ack, in Deliver.
func Decide(ev Evidence) Plan {
	r, op := ev.Route, ev.Op
	if op == nil {
		if r.Retention > 0 && !ev.PublishTime.IsZero() && ev.Now.Sub(ev.PublishTime) > r.Retention {
			return Plan{ActRetentionGap, fmt.Sprintf("published %s ago, before the %s evidence horizon: a missing record proves nothing", ev.Now.Sub(ev.PublishTime).Round(time.Second), r.Retention)}
		}
		return Plan{ActAttempt, "new operation"}
	}
	switch op.State {
	case StateEffectConfirmed, StateAckPending:
		return Plan{ActAckExisting, "effect already confirmed"}
	case StateAcknowledged:
		return Plan{ActAckExisting, "redelivered after the ack was sent"}
	case StateEffectIndeterminate:
		return Plan{ActHoldIndeterminate, "effect indeterminate: awaiting reconciliation"}
	case StateTerminalFailure, StateConflicting:
		return Plan{ActHoldTerminal, "terminal: " + op.Reason}
	}
	// received, reserved or pending_effect: the effect question is open.
	last := op.LastAttempt
	if last == nil {
		return Plan{ActAttempt, "intent recorded, no attempt yet"}
	}
	switch last.Outcome {
	case OutcomeRetryable:
		if op.AttemptCount >= r.MaxAttempts {
			return Plan{ActExhaust, fmt.Sprintf("attempt limit %d reached; last: %s", r.MaxAttempts, last.Reason)}
		}
		return Plan{ActAttempt, "retry after a documented failure"}
	case OutcomeUnknown, "":
		return afterLostResponse(ev)
	}
	// A confirmed or terminal attempt outcome is always committed together with
	// its state, so an open state with one means the ledger was edited by hand.
	return Plan{ActMarkIndeterminate, fmt.Sprintf("inconsistent evidence: state %s with last attempt %s", op.State, last.Outcome)}
}

// afterLostResponse applies the route's shape when the last attempt may or
// may not have taken effect: sent with no answer, or started by an owner that
// never recorded a result.
func afterLostResponse(ev Evidence) Plan {
	r, op := ev.Route, ev.Op
	exhausted := op.AttemptCount >= r.MaxAttempts
	switch r.Shape {
	case ShapeLookup:
		return Plan{ActLookupFirst, "earlier result lost: look up before retrying"}
	case ShapeIdempotent:
		if !insideDedupeWindow(ev) {
			return Plan{ActMarkIndeterminate, fmt.Sprintf("earlier result lost and the provider's %s dedupe window no longer covers the first attempt", r.DedupeWindow)}
		}
		if exhausted {
			return Plan{ActMarkIndeterminate, fmt.Sprintf("earlier result lost and attempt limit %d reached", r.MaxAttempts)}
		}
		return Plan{ActAttempt, "earlier result lost: retry with the same idempotency key inside the dedupe window"}
	case ShapeRepeatable:
		if exhausted {
			return Plan{ActExhaust, fmt.Sprintf("attempt limit %d reached; last result unknown on a repeatable effect", r.MaxAttempts)}
		}
		return Plan{ActAttempt, "earlier result lost: repeatable effect, repeat it"}
	default: // ShapeUnsafe and anything unrecognised: never re-execute on a guess.
		return Plan{ActMarkIndeterminate, "earlier result lost on an unsafe effect: operator must settle it"}
	}
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

// Terminal returns the decision for a message the gateway will never process:
// acked once it is dead-lettered in the ledger, nacked when the broker's own
// dead-letter policy is meant to take it.
func Terminal(p DeadLetterPolicy) Decision {
	if p == DeadLetterGateway {
		return Ack
	}
	return Nack
}
