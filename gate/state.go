package gate

import (
	"fmt"
	"slices"
)

// State is an operation's evidence state. A single "processed" flag would
// collapse the difference between "we called the downstream" and "we know the
// effect happened", which is exactly the difference that decides an ack.
type State string

const (
	// StateReceived: the delivery is recorded; its intent is not admitted yet.
	StateReceived State = "received"
	// StateConflicting: the operation key was reused with a different
	// fingerprint. Kept as its own record, never executed, never acked as success.
	StateConflicting State = "conflicting"
	// StateReserved: one owner, holding a fencing token, controls the operation.
	StateReserved State = "reserved"
	// StatePendingEffect: durable intent (with its idempotency key) exists, but
	// no authoritative evidence of the effect does.
	StatePendingEffect State = "pending_effect"
	// StateEffectIndeterminate: an attempt may have taken effect and nothing
	// authoritative can tell; automatic re-execution is blocked.
	StateEffectIndeterminate State = "effect_indeterminate"
	// StateEffectConfirmed: the downstream's evidence (result id) is durable.
	StateEffectConfirmed State = "effect_confirmed"
	// StateAckPending: the effect is confirmed and the ack may be sent, but the
	// gateway has not yet seen it go out.
	StateAckPending State = "ack_pending"
	// StateAcknowledged: the acknowledging response was written to the broker.
	StateAcknowledged State = "acknowledged"
	// StateTerminalFailure: policy forbids another attempt; the reason is kept
	// and any dead-letter handling is recorded separately.
	StateTerminalFailure State = "terminal_failure"
)

// States lists every state in lifecycle order.
var States = []State{
	StateReceived, StateConflicting, StateReserved, StatePendingEffect,
	StateEffectIndeterminate, StateEffectConfirmed, StateAckPending,
	StateAcknowledged, StateTerminalFailure,
}

// transitions is the whole lifecycle. The ledger holds the same table in SQL and
// refuses any other change; a storage test keeps the two equal.
//
// pending_effect -> reserved is the retry path: a later delivery takes a new,
// higher fencing token before it starts another attempt. effect_indeterminate
// is left only by evidence from outside the push path: a reconciling lookup
// (found: confirmed; definitely absent: back to pending_effect) or an
// operator (happened, did not happen, abandon). terminal_failure is left only
// by an operator: a replay back to pending_effect, or "it happened after all".
// Both ways back to pending_effect carry a grant of exactly one attempt
// (Operation.Grant), so neither can turn into a loop of effects.
var transitions = map[State][]State{
	StateReceived:            {StateReserved, StateConflicting, StateTerminalFailure},
	StateConflicting:         {},
	StateReserved:            {StatePendingEffect, StateEffectConfirmed, StateEffectIndeterminate, StateTerminalFailure},
	StatePendingEffect:       {StateReserved, StateEffectConfirmed, StateEffectIndeterminate, StateTerminalFailure},
	StateEffectIndeterminate: {StatePendingEffect, StateEffectConfirmed, StateTerminalFailure},
	StateEffectConfirmed:     {StateAckPending},
	StateAckPending:          {StateAcknowledged},
	StateAcknowledged:        {},
	StateTerminalFailure:     {StatePendingEffect, StateEffectConfirmed},
}

// Transition is one allowed edge of the lifecycle.
type Transition struct {
	From, To State
}

// Transitions returns every allowed edge, in a stable order.
func Transitions() []Transition {
	var out []Transition
	for _, from := range States {
		for _, to := range transitions[from] {
			out = append(out, Transition{From: from, To: to})
		}
	}
	return out
}

// CanTransition reports whether from -> to is in the table.
func CanTransition(from, to State) bool {
	return slices.Contains(transitions[from], to)
}

// Valid reports whether s is one of the nine states.
func (s State) Valid() bool { return slices.Contains(States, s) }

// Confirmed reports whether the effect's evidence is durable.
func (s State) Confirmed() bool {
	return s == StateEffectConfirmed || s == StateAckPending || s == StateAcknowledged
}

// Path checks that from -> steps[0] -> steps[1] ... is allowed and returns the
// edges, so callers hand the ledger only sequences the table permits.
func Path(from State, steps ...State) ([]Transition, error) {
	out := make([]Transition, 0, len(steps))
	cur := from
	for _, to := range steps {
		if cur != "" && !CanTransition(cur, to) {
			return nil, fmt.Errorf("gate: transition %s -> %s is not allowed", cur, to)
		}
		out = append(out, Transition{From: cur, To: to})
		cur = to
	}
	return out, nil
}
