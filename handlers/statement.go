package handlers

import (
	"fmt"
	"strings"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// statement is the completion statement of an operation with its operators'
// interventions (oldest first). gate.Statement reads the operation alone, so
// it would present a result id an operator typed in as the downstream's
// evidence; an effect confirmed on an operator's word is said to be exactly
// that, and an attempt an operator granted is named as theirs.
func statement(op *gate.Operation, ivs []gate.Intervention) string {
	if op.State.Confirmed() && op.ResultID != "" {
		// A confirmed operation takes no further attempt, so a "happened"
		// carrying its result id is what confirmed it.
		for i := len(ivs) - 1; i >= 0; i-- {
			if iv := &ivs[i]; iv.Kind == gate.ResolveHappened && iv.ResultID == op.ResultID {
				return operatorConfirmed(op, iv)
			}
		}
	}
	s := gate.Statement(op)
	n := len(ivs)
	if n == 0 || op.State != gate.StatePendingEffect || op.Grant <= op.AttemptCount {
		return s
	}
	// The grant is the latest intervention's only while nothing (a
	// delivery's claim, the reconciler) has taken the operation since.
	if iv := &ivs[n-1]; iv.To == op.State && iv.Fence == op.Fence {
		what := "replayed it"
		if iv.Kind == gate.ResolveNotHappened {
			what = "said the effect did not happen"
		}
		s += fmt.Sprintf(" Operator %s %s at %s (%q): the next delivery of the message makes exactly one more attempt, under the same idempotency key.",
			iv.Actor, what, stamp(iv.At), iv.Reason)
	}
	return s
}

func operatorConfirmed(op *gate.Operation, iv *gate.Intervention) string {
	var b strings.Builder
	// The contract named is the newest attempt's, as in gate.Statement and
	// the evidence's contract_version: the operator vouches for what that
	// attempt did, which may have run under a newer contract than the
	// operation began with.
	fmt.Fprintf(&b, "Operation %s (route %s, key %q) under contract %s: ", op.ID, op.Route, op.Key, gate.Contract(op))
	fmt.Fprintf(&b, "the effect was confirmed by operator %s at %s, not by the downstream: %q (result id %q). ",
		iv.Actor, stamp(iv.At), iv.Reason, iv.ResultID)
	fmt.Fprintf(&b, "The ledger holds no downstream evidence of it; %d attempt(s) were recorded before. ", op.AttemptCount)
	if op.State == gate.StateAcknowledged {
		fmt.Fprintf(&b, "The acknowledging response was written to the broker at %s; a push broker gives no further confirmation.", stampPtr(op.AckedAt))
	} else {
		b.WriteString("The ack has not been confirmed as sent; a redelivery will be acked without a new effect.")
	}
	return b.String()
}

// interventionSummary is the evidence record's manual_intervention: who
// did what, when, why, and what it changed.
func interventionSummary(iv *gate.Intervention) string {
	s := fmt.Sprintf("%s by %s at %s: %q (%s → %s", iv.Kind, iv.Actor, stamp(iv.At), iv.Reason, iv.From, iv.To)
	if iv.ResultID != "" {
		s += fmt.Sprintf(", result id %q", iv.ResultID)
	}
	return s + ")"
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func stampPtr(t *time.Time) string {
	if t == nil {
		return "an unrecorded time"
	}
	return stamp(*t)
}
