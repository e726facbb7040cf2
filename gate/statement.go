package gate

import (
	"fmt"
	"strings"
	"time"
)

// Statement is the evidence record's completion statement: what the ledger
// can prove about an operation, and nothing more. It is generated from the
// record, never stored, so it cannot drift from the evidence.
func Statement(op *Operation) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Operation %s (route %s, key %q) under contract %s: ", op.ID, op.Route, op.Key, Contract(op))
	if op.HandedOffAt != nil && !op.State.Confirmed() && op.State != StateConflicting {
		handedOff(&b, op)
		return b.String()
	}
	switch op.State {
	case StateEffectConfirmed, StateAckPending, StateAcknowledged:
		switch {
		case op.Shape == ShapeLocal && op.ResultID != "":
			fmt.Fprintf(&b, "the local statement's result is %q, committed at %s in the same transaction as this record, after %d attempt(s). ",
				op.ResultID, stamp(op.EvidenceAt), op.AttemptCount)
		case op.ResultID != "":
			fmt.Fprintf(&b, "the downstream's effect evidence is result %q, committed to the ledger at %s after %d attempt(s). ",
				op.ResultID, stamp(op.EvidenceAt), op.AttemptCount)
		default:
			// A status-only route: nothing but the answer's status says the
			// effect happened, and the statement must not suggest more.
			fmt.Fprintf(&b, "the downstream's effect evidence is its status code only (%s, no result id), committed to the ledger at %s after %d attempt(s). ",
				successStatus(op.LastAttempt), stamp(op.EvidenceAt), op.AttemptCount)
		}
		if op.HandedOffAt != nil {
			fmt.Fprintf(&b, "The broker was acknowledged when the operation was handed off at %s, before the effect; the relay then delivered it.", stamp(op.HandedOffAt))
		} else if op.State == StateAcknowledged {
			fmt.Fprintf(&b, "The acknowledging response was written to the broker at %s; a push broker gives no further confirmation.", stamp(op.AckedAt))
		} else {
			b.WriteString("The ack has not been confirmed as sent; a redelivery will be acked without a new effect.")
		}
	case StateEffectIndeterminate:
		fmt.Fprintf(&b, "the effect is indeterminate after %d attempt(s): it may or may not have happened (%s). Automatic re-execution is blocked until the %s lane settles it. Not acknowledged.",
			op.AttemptCount, op.Reason, laneOr(op.Lane))
	case StateTerminalFailure:
		fmt.Fprintf(&b, "will not be attempted again after %d attempt(s): %s. ", op.AttemptCount, op.Reason)
		if op.DeadLetterPolicy == DeadLetterGateway {
			b.WriteString("Dead-lettered by the gateway, then acknowledged without success.")
		} else {
			b.WriteString("Left to the broker's dead-letter policy; never acknowledged.")
		}
	case StateConflicting:
		fmt.Fprintf(&b, "reuses the key of operation %s with a different payload. It was never executed and never acknowledged as success.", op.ConflictOf)
	default:
		fmt.Fprintf(&b, "no effect evidence yet (state %s, %d attempt(s)). Not acknowledged.", op.State, op.AttemptCount)
	}
	return b.String()
}

// Contract is the contract version the operation's newest effect attempt
// ran under, which is what its evidence was produced by; before any
// attempt, the one it began with. A route fixed between attempts is named
// as fixed.
func Contract(op *Operation) string {
	if a := op.LastAttempt; a != nil && a.ContractVersion != "" {
		return a.ContractVersion
	}
	return op.ContractVersion
}

// successStatus names the 2xx that confirmed the effect, when the last attempt
// recorded it.
func successStatus(a *Attempt) string {
	if a != nil && a.Outcome == OutcomeConfirmed && a.StatusCode != 0 {
		return fmt.Sprintf("HTTP %d", a.StatusCode)
	}
	return "a 2xx"
}

func stamp(t *time.Time) string {
	if t == nil {
		return "an unrecorded time"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func laneOr(l string) string {
	if l == "" {
		return "operator"
	}
	return l
}

// handedOff states what a handoff promised before its effect is
// evidenced: the broker's ack covered the outbox entry, not the effect.
func handedOff(b *strings.Builder, op *Operation) {
	fmt.Fprintf(b, "handed off at %s: the operation and its outbox entry were committed, and the broker was acknowledged then, before any effect. ",
		stamp(op.HandedOffAt))
	switch op.State {
	case StateEffectIndeterminate:
		fmt.Fprintf(b, "The relay's effect is indeterminate after %d attempt(s) (%s): it is not resent until the %s lane settles it.",
			op.AttemptCount, op.Reason, laneOr(op.Lane))
	case StateTerminalFailure:
		fmt.Fprintf(b, "The relay will not attempt it again after %d attempt(s): %s. Dead-lettered by the gateway; no effect evidence.",
			op.AttemptCount, op.Reason)
	default:
		fmt.Fprintf(b, "Effect evidence pending: the relay has made %d attempt(s) so far (state %s).", op.AttemptCount, op.State)
	}
}
