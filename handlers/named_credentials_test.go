package handlers_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

// A resolution is recorded under the name of the credential that made it,
// never a name the caller writes: "actor": "console:alice" from the API was
// recorded as such, so nobody was accountable. The caller may add a note,
// kept with the reason; an actor field is accepted only when it names the
// caller's own credential.
func TestResolutionsRecordTheCredentialsName(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("mail", "unsafe", "broker", ""))
	id := e.indeterminate("mail", msg{ID: "m-1", Data: "x"})
	before := e.snapshot(id)
	for _, actor := range []string{"console:alice", "api:bob", "bob", "admin"} {
		a := e.adminPostAs("alice", "/v1/operations/"+id+"/resolve",
			adminapi.ResolveRequest{Kind: gate.ResolveAbandon, Reason: "refunded", Actor: actor})
		if a.Status != http.StatusBadRequest || !strings.Contains(a.Problem, "api:alice") {
			t.Errorf("alice claiming to be %q: %d %q", actor, a.Status, a.Problem)
		}
	}
	if e.snapshot(id) != before {
		t.Fatal("a refused actor changed the record")
	}

	a := e.adminPostAs("alice", "/v1/operations/"+id+"/resolve",
		adminapi.ResolveRequest{Kind: gate.ResolveNotHappened, Reason: "not in the provider's log", Note: "ticket OPS-12, for bob"})
	wantAnswer(t, a, http.StatusOK)
	iv := a.Record.ManualInterventions
	if len(iv) != 1 || iv[0].Actor != "api:alice" || iv[0].Reason != "not in the provider's log (note: ticket OPS-12, for bob)" {
		t.Fatalf("intervention %+v", iv)
	}
	if logs := e.logs.String(); !strings.Contains(logs, `"actor":"api:alice"`) {
		t.Error("the log line of the resolution does not name the credential")
	}

	// The same operator's own name in the actor field is accepted (older
	// clients), and a replay is recorded the same way.
	e.down.set(status(http.StatusUnprocessableEntity))
	m := msg{ID: "m-2", Data: "y"}
	wantStatus(t, e.push("mail", m), http.StatusServiceUnavailable)
	dead := e.opID("mail", m)
	for range 10 {
		if e.record(dead).Operation.State == gate.StateTerminalFailure {
			break
		}
		e.push("mail", m)
	}
	r := e.adminPostAs("carol", "/v1/operations/"+dead+"/replay", adminapi.ReplayRequest{Reason: "schema fixed", Actor: "api:carol"})
	wantAnswer(t, r, http.StatusOK)
	if iv := r.Record.ManualInterventions; len(iv) != 1 || iv[0].Actor != "api:carol" || iv[0].Kind != gate.ResolveReplay {
		t.Fatalf("replay intervention %+v", iv)
	}
}
