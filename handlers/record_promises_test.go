package handlers_test

// Two promises openapi.yaml makes about the evidence record, checked end to
// end: through the push handler, the real ledger and Redis, and the admin
// API's GET /v1/operations/{id}, read as the JSON a client gets.

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
)

// recordJSON is the part of the admin API's evidence record these tests
// read, under the field names openapi.yaml gives them: decoding into the
// server's own types would let a renamed tag pass unnoticed.
type recordJSON struct {
	Operation struct {
		TraceID         string `json:"trace_id"`
		ContractVersion string `json:"contract_version"`
		State           string `json:"state"`
	} `json:"operation"`
	Evidence struct {
		TraceID         string `json:"trace_id"`
		ContractVersion string `json:"contract_version"`
		EffectAttemptID string `json:"effect_attempt_id"`
	} `json:"evidence"`
	Statement  string `json:"completion_statement"`
	Deliveries []struct {
		N        int    `json:"n"`
		TraceID  string `json:"trace_id"`
		Found    string `json:"found"`
		Decision string `json:"decision"`
		Anomaly  string `json:"anomaly"`
	} `json:"deliveries"`
	Attempts []struct {
		N               int    `json:"n"`
		Kind            string `json:"kind"`
		ContractVersion string `json:"contract_version"`
		Outcome         string `json:"outcome"`
	} `json:"attempts"`
	Contract *struct {
		ContractVersion string `json:"contract_version"`
	} `json:"contract"`
}

// adminRecord reads operation id's evidence record from the admin API once
// ready(rec) holds: a delivery's answer is recorded after its response.
func (e *env) adminRecord(id string, ready func(*recordJSON) bool) *recordJSON {
	e.t.Helper()
	var rec *recordJSON
	testenv.Eventually(e.t, testenv.StepTimeout, func() bool {
		rec = &recordJSON{}
		if code := e.adminGet("/v1/operations/"+id, rec); code != http.StatusOK {
			e.t.Fatalf("GET /v1/operations/%s: %d", id, code)
		}
		return ready(rec)
	}, func() string { return fmt.Sprintf("record of %s never ready: %+v", id, rec) })
	return rec
}

// traceparent is a sampled W3C trace context header for trace tid.
func traceparent(tid string) map[string]string {
	return map[string]string{"traceparent": "00-" + tid + "-b7ad6b7169203331-01"}
}

// The operation's trace is its first delivery's, even when a later delivery
// is the one that makes the effect happen and writes the evidence; every
// delivery, the one after the ack included, keeps its own trace.
func TestOperationKeepsTheFirstDeliverysTrace(t *testing.T) {
	t.Parallel()
	const (
		traceA = "0af7651916cd43dd8448eb211c80319c"
		traceB = "4bf92f3577b34da6a3ce929d0e0e4736"
		traceC = "5ce0e9a56015fec5aadfa328ae398115"
	)
	e := newEnv(t, true, routeYAML("orders", "idempotent", "broker", ""))
	m := msg{ID: "m-traces", Data: "x"}
	id := e.opID("orders", m)
	// One envelope for every delivery: a redelivery is the same message.
	body := envelope(m)

	e.down.set(status(http.StatusServiceUnavailable))
	wantStatus(t, e.pushHeaders("orders", body, traceparent(traceA)), http.StatusServiceUnavailable)
	if st := e.record(id).Operation.State; st != gate.StatePendingEffect {
		t.Fatalf("after the failed first attempt: %s, want pending_effect", st)
	}
	e.down.set(nil)
	wantStatus(t, e.pushHeaders("orders", body, traceparent(traceB)), http.StatusNoContent)
	e.waitState(id, gate.StateAcknowledged)
	wantStatus(t, e.pushHeaders("orders", body, traceparent(traceC)), http.StatusNoContent)

	rec := e.adminRecord(id, func(r *recordJSON) bool {
		return len(r.Deliveries) == 3 && r.Deliveries[2].Decision != ""
	})
	if rec.Operation.TraceID != traceA || rec.Evidence.TraceID != traceA {
		t.Errorf("operation trace %q, evidence trace %q; want the first delivery's %s",
			rec.Operation.TraceID, rec.Evidence.TraceID, traceA)
	}
	for i, want := range []string{traceA, traceB, traceC} {
		if d := rec.Deliveries[i]; d.N != i+1 || d.TraceID != want {
			t.Errorf("delivery %d: n %d trace %q, want n %d trace %s", i, d.N, d.TraceID, i+1, want)
		}
	}
	if d := rec.Deliveries[2]; d.Found != string(gate.StateAcknowledged) || d.Anomaly != "redelivered_after_ack" {
		t.Errorf("delivery after the ack: found %q anomaly %q", d.Found, d.Anomaly)
	}
	if n := e.down.effectCalls.Load(); n != 2 {
		t.Errorf("downstream called %d times, want 2 (the failure, then the effect)", n)
	}
}

// A route's contract changed between two attempts of one operation (a
// deploy with a new max_attempts): each attempt records the contract it ran
// under, and the evidence and the completion statement name the contract
// of the attempt that produced the evidence, while the operation keeps the
// one it began with.
func TestEvidenceNamesTheContractOfTheNewestAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, routeYAML("orders", "idempotent", "broker", ""))
	x := e.routes["orders"].ContractVersion
	m := msg{ID: "m-contract", Data: "x"}
	id := e.opID("orders", m)
	body := envelope(m)

	e.down.set(status(http.StatusServiceUnavailable))
	wantStatus(t, e.pushRaw("orders", body), http.StatusServiceUnavailable)
	if st := e.record(id).Operation.State; st != gate.StatePendingEffect {
		t.Fatalf("after the failed first attempt: %s, want pending_effect", st)
	}

	e.rewire(routeYAML("orders", "idempotent", "broker", "    max_attempts: 6\n"))
	y := e.routes["orders"].ContractVersion
	if x == y {
		t.Fatalf("the changed route kept contract version %s", x)
	}
	e.down.set(nil)
	wantStatus(t, e.pushRaw("orders", body), http.StatusNoContent)
	e.waitState(id, gate.StateAcknowledged)

	rec := e.adminRecord(id, func(r *recordJSON) bool { return len(r.Attempts) == 2 })
	wantContracts(t, rec, x, y)
	if rec.Evidence.EffectAttemptID != id+"/2" {
		t.Errorf("effect attempt %q, want %s/2", rec.Evidence.EffectAttemptID, id)
	}
	if a := rec.Attempts[1]; a.Kind != string(gate.AttemptEffect) || a.Outcome != string(gate.OutcomeConfirmed) {
		t.Errorf("second attempt: kind %q outcome %q, want a confirmed effect", a.Kind, a.Outcome)
	}
	if rec.Contract == nil || rec.Contract.ContractVersion != y {
		t.Errorf("record's route contract %+v, want the loaded one %s", rec.Contract, y)
	}
}

// The same on an effect an operator confirmed: the statement says it was
// confirmed on the operator's word, and names the contract of the newest
// attempt, as the evidence does, not the one the operation began with.
func TestOperatorConfirmedStatementNamesTheNewestAttemptsContract(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("mail", "unsafe", "broker", ""))
	x := e.routes["mail"].ContractVersion
	m := msg{ID: "m-contract-op", Data: "x"}
	id := e.opID("mail", m)
	body := envelope(m)

	e.down.set(status(http.StatusServiceUnavailable))
	wantStatus(t, e.pushRaw("mail", body), http.StatusServiceUnavailable)
	if st := e.record(id).Operation.State; st != gate.StatePendingEffect {
		t.Fatalf("after the refused first attempt: %s, want pending_effect", st)
	}

	e.rewire(routeYAML("mail", "unsafe", "broker", "    max_attempts: 6\n"))
	y := e.routes["mail"].ContractVersion
	e.down.set(dropAfterApply)
	wantStatus(t, e.pushRaw("mail", body), http.StatusServiceUnavailable)
	e.waitState(id, gate.StateEffectIndeterminate)
	wantAnswer(t, e.resolveOp(id, adminapi.ResolveRequest{Kind: gate.ResolveHappened, ResultID: "res-op-1",
		Reason: "found in the provider's log", Actor: "alice"}), http.StatusOK)

	rec := e.adminRecord(id, func(r *recordJSON) bool { return gate.State(r.Operation.State).Confirmed() })
	if !strings.Contains(rec.Statement, "operator") {
		t.Fatalf("statement does not say an operator confirmed it: %s", rec.Statement)
	}
	wantContracts(t, rec, x, y)
}

// wantContracts checks a record whose first attempt ran under contract x and
// whose second, the newest, under y.
func wantContracts(t *testing.T, rec *recordJSON, x, y string) {
	t.Helper()
	if len(rec.Attempts) != 2 {
		t.Fatalf("%d attempts, want 2: %+v", len(rec.Attempts), rec.Attempts)
	}
	if a := rec.Attempts[0]; a.N != 1 || a.ContractVersion != x {
		t.Errorf("attempt 1: n %d contract %q, want %s", a.N, a.ContractVersion, x)
	}
	if a := rec.Attempts[1]; a.N != 2 || a.ContractVersion != y {
		t.Errorf("attempt 2: n %d contract %q, want %s", a.N, a.ContractVersion, y)
	}
	if rec.Operation.ContractVersion != x {
		t.Errorf("operation contract %q, want the one it began with, %s", rec.Operation.ContractVersion, x)
	}
	if rec.Evidence.ContractVersion != y {
		t.Errorf("evidence contract %q, want the newest attempt's %s", rec.Evidence.ContractVersion, y)
	}
	if !strings.Contains(rec.Statement, "under contract "+y+":") || strings.Contains(rec.Statement, x) {
		t.Errorf("statement does not name contract %s alone: %s", y, rec.Statement)
	}
}
