package handlers_test

import (
	"net/http"
	"testing"

	"github.com/ackgate/ackgate/gate"
)

// A repeatable effect (a rebuildable derivative) may run again when its
// result was lost, under the same key, until the attempt limit; then the
// operation is terminal and the gateway stops calling it.
func TestRepeatableEffectEndToEnd(t *testing.T) {
	t.Parallel()
	t.Run("repeats after a lost response and acks on evidence", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, false, routeYAML("rebuild", "repeatable", "broker", ""))
		e.down.set(dropAfterApply)
		m := msg{ID: "m-rep", Data: "x"}
		wantStatus(t, e.push("rebuild", m), http.StatusServiceUnavailable)
		rec := e.record(e.opID("rebuild", m))
		if rec.Operation.State != gate.StatePendingEffect || rec.Attempts[0].Outcome != gate.OutcomeUnknown {
			t.Fatalf("after the lost response: %s %+v", rec.Operation.State, rec.Attempts)
		}
		e.down.set(nil)
		wantStatus(t, e.push("rebuild", m), http.StatusNoContent)
		rec = e.waitState(e.opID("rebuild", m), gate.StateAcknowledged)
		keys := e.down.Keys()
		if len(keys) != 2 || keys[0] != keys[1] || e.down.Applied() != 2 || rec.ResultID != "res-2" || rec.AttemptCount != 2 {
			t.Fatalf("keys %v, %d applied, result %q after %d attempts", keys, e.down.Applied(), rec.ResultID, rec.AttemptCount)
		}
	})
	t.Run("stops at the attempt limit", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, false, routeYAML("rebuild", "repeatable", "gateway", "    max_attempts: 2\n"))
		e.down.set(dropAfterApply)
		m := msg{ID: "m-rep-limit", Data: "x"}
		wantStatus(t, e.push("rebuild", m), http.StatusServiceUnavailable)
		// The second attempt loses its response too and reaches the limit:
		// terminal, dead-lettered by the gateway, so acked.
		wantStatus(t, e.push("rebuild", m), http.StatusNoContent)
		// A later copy is acked from the ledger without another call.
		wantStatus(t, e.push("rebuild", m), http.StatusNoContent)
		rec := e.record(e.opID("rebuild", m))
		if rec.Operation.State != gate.StateTerminalFailure || len(rec.DeadLetters) != 1 || e.down.effectCalls.Load() != 2 {
			t.Fatalf("state %s, dead letters %+v, %d calls", rec.Operation.State, rec.DeadLetters, e.down.effectCalls.Load())
		}
	})
}
