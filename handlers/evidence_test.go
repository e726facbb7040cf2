package handlers_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

// A route that takes a bare 2xx as its evidence says so in its contract, and
// the completion statement of its operations says that a status code is all
// the evidence there is, never that there is a result.
func TestStatusOnlyEvidenceIsStatedAsSuch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, `
  - name: pings
    broker: pubsub
    auth: none
    shape: repeatable
    effect:
      url: {{DOWN}}/effects
      evidence: status_only
`)
	m := msg{ID: "p-1", Data: `{"ping":1}`}
	wantStatus(t, e.push("pings", m), http.StatusNoContent)
	id := e.opID("pings", m)
	e.waitState(id, gate.StateAcknowledged)

	var rec adminapi.EvidenceRecord
	if code := e.adminGet("/v1/operations/"+id, &rec); code != http.StatusOK {
		t.Fatalf("GET operation: %d", code)
	}
	if rec.Operation.ResultID != "" {
		t.Fatalf("a status-only route recorded result id %q", rec.Operation.ResultID)
	}
	for _, want := range []string{"status code only", "HTTP 201"} {
		if !strings.Contains(rec.Statement, want) {
			t.Errorf("completion statement %q does not say %q", rec.Statement, want)
		}
	}
	if strings.Contains(rec.Statement, "result \"") {
		t.Errorf("completion statement claims a result: %q", rec.Statement)
	}
	var contract struct {
		Effect struct {
			Evidence string `json:"evidence"`
		} `json:"effect"`
	}
	if code := e.adminGet("/v1/routes/pings", &contract); code != http.StatusOK || contract.Effect.Evidence != "status_only" {
		t.Fatalf("GET route: %d, effect.evidence %q; want status_only", code, contract.Effect.Evidence)
	}
}
