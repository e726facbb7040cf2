package config_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/config"
)

// A bare 2xx counts as the effect's evidence only when the route says so:
// without a result id header or pointer, effect.evidence: status_only must be
// written out, and the contract shows which evidence the route takes.
func TestEvidenceMustBeNamed(t *testing.T) {
	t.Parallel()
	// The contract's effect.evidence, as GET /v1/routes shows it.
	evidenceOf := func(t *testing.T, m map[string]any) string {
		t.Helper()
		routes, err := config.ParseRoutes(routesYAML(t, m))
		if err != nil {
			t.Fatalf("ParseRoutes: %v", err)
		}
		var contract struct {
			Effect struct {
				Evidence string `json:"evidence"`
			} `json:"effect"`
		}
		b, err := json.Marshal(routes[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &contract); err != nil {
			t.Fatal(err)
		}
		return contract.Effect.Evidence
	}

	unnamed := baseRoute()
	delete(effect(unnamed), "evidence")
	_, err := config.ParseRoutes(routesYAML(t, unnamed))
	if want := `route "r": effect.evidence: required when neither result_id_header nor result_id_pointer is set`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("route naming no evidence: ParseRoutes = %v, want an error containing %q", err, want)
	}

	statusOnly := baseRoute()
	effect(statusOnly)["evidence"] = "status_only"
	if got := evidenceOf(t, statusOnly); got != "status_only" {
		t.Errorf("evidence: status_only route: contract evidence %q", got)
	}
	for _, field := range []string{"result_id_header", "result_id_pointer"} {
		m := baseRoute()
		delete(effect(m), "evidence")
		effect(m)[field] = map[string]string{"result_id_header": "X-Result-Id", "result_id_pointer": "/id"}[field]
		if got := evidenceOf(t, m); got != "result_id" {
			t.Errorf("route with %s: contract evidence %q, want result_id", field, got)
		}
	}

	for _, c := range []struct {
		name   string
		mutate func(e map[string]any)
		want   string
	}{
		{"status_only with a result id", func(e map[string]any) {
			e["evidence"] = "status_only"
			e["result_id_header"] = "X-Result-Id"
		}, `route "r": effect.evidence: status_only, but result_id_header or result_id_pointer names a result id`},
		{"result_id without a place", func(e map[string]any) { e["evidence"] = "result_id" }, `route "r": effect.evidence: result_id needs result_id_header or result_id_pointer`},
		{"unknown", func(e map[string]any) { e["evidence"] = "trust_me" }, `route "r": effect.evidence: "trust_me" is not result_id or status_only`},
	} {
		m := baseRoute()
		delete(effect(m), "evidence")
		c.mutate(effect(m))
		if _, err := config.ParseRoutes(routesYAML(t, m)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: ParseRoutes = %v, want an error containing %q", c.name, err, c.want)
		}
	}
}
