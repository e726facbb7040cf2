// Package gate is the acknowledgment gate: it decides, from the evidence an
// operation has, whether a delivery may be acknowledged, must be retried by the
// broker, or belongs in a terminal or indeterminate lane.
//
// The package does no I/O of its own. It declares the narrow interfaces it needs
// (Ledger, Reservations, Effects) and the storage and downstream packages
// implement them, so the rules here can be read, and tested, as a state machine.
//
// Start with State and its transition table (Transitions, CanTransition),
// then Decide, which maps an operation's evidence to what happens next. gate
// imports no other package of this module; the rest of the gateway depends on
// it, never the other way round.
package gate
