// Package recovery is the background work every replica runs beside the
// push path: the reconciler that settles indeterminate operations of lookup
// routes by asking their lookup, the purge that removes evidence whose
// retention has run out (and the Redis keys of the operations it removes),
// and the lane gauges' snapshot.
//
// It earns a package of its own because none of it answers a delivery:
// each worker runs on a timer, on every replica at once and without a
// leader, and must keep running through the failures the push path answers
// with a nack. Rows are shared out by the ledger (FOR UPDATE SKIP LOCKED),
// writes are fenced like any delivery's (gate.Reconcile takes the
// operation's lease), and a tick that fails is logged and tried again on
// the next one; nothing here can stop the gateway.
//
// What it needs from storage, the gate and telemetry is declared here as
// small interfaces; internal/wiring joins them.
package recovery
