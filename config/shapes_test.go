package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/gate"
)

func localRoute() map[string]any {
	m := baseRoute()
	delete(m, "effect")
	m["shape"] = "local"
	m["local"] = map[string]any{
		"sql":     "INSERT INTO orders (idem, body, region) VALUES ($1, $2::jsonb, $3) RETURNING id",
		"params":  []string{"idempotency_key", "data_json", "attribute:region"},
		"role":    "orders_writer",
		"timeout": "2s",
	}
	return m
}

func handoffRoute() map[string]any {
	m := baseRoute()
	m["shape"] = "handoff"
	m["dead_letter"] = "gateway"
	effect(m)["timeout"] = "5m"
	effect(m)["lookup_url"] = "http://127.0.0.1:9090/effects/{key}"
	m["handoff"] = map[string]any{"retry_min": "2s", "retry_max": "10m"}
	return m
}

func TestCommitShapeRoutes(t *testing.T) {
	t.Parallel()
	routes, err := config.ParseRoutes(routesYAML(t, localRoute()))
	if err != nil {
		t.Fatal(err)
	}
	l := routes[0]
	want := []gate.LocalParam{{Kind: gate.ParamIdempotencyKey}, {Kind: gate.ParamDataJSON}, {Kind: gate.ParamAttribute, Name: "region"}}
	if l.Shape != gate.ShapeLocal || l.Local == nil || l.Local.Role != "orders_writer" || l.Local.Timeout != 2*time.Second ||
		len(l.Local.Params) != 3 || l.Local.Params[2] != want[2] || l.Effect.URL != "" || !strings.Contains(l.CommitBoundary, "one transaction") {
		t.Fatalf("local route %+v / %+v", l, l.Local)
	}
	routes, err = config.ParseRoutes(routesYAML(t, handoffRoute()))
	if err != nil {
		t.Fatal(err)
	}
	h := routes[0]
	if h.Shape != gate.ShapeHandoff || h.Handoff == nil || h.Handoff.RetryMin != 2*time.Second || h.Handoff.RetryMax != 10*time.Minute ||
		h.Effect.Timeout != 5*time.Minute || h.RelayShape() != gate.ShapeLookup || !strings.Contains(h.CommitBoundary, "outbox") {
		t.Fatalf("handoff route %+v / %+v", h, h.Handoff)
	}
}

func TestInvalidCommitShapeRoutes(t *testing.T) {
	t.Parallel()
	local := func(m map[string]any) map[string]any { return m["local"].(map[string]any) }
	cases := []struct {
		name   string
		base   func() map[string]any
		mutate func(m map[string]any)
		want   string
	}{
		{"local without statement", localRoute, func(m map[string]any) { delete(m, "local") }, `route "r": local: required for shape local`},
		{"local with an effect call", localRoute, func(m map[string]any) { m["effect"] = map[string]any{"url": "http://h/x"} }, `route "r": effect: shape local has no downstream call`},
		{"local params fewer than placeholders", localRoute, func(m map[string]any) { local(m)["params"] = []string{"idempotency_key"} },
			`route "r": local.params: the statement uses $1 to $3, and 1 parameters are listed`},
		{"local unknown param", localRoute, func(m map[string]any) { local(m)["params"] = []string{"idempotency_key", "data", "attribute:region"} },
			`route "r": local.params: $2: "data" is not data_json`},
		{"local attribute without name", localRoute, func(m map[string]any) {
			local(m)["params"] = []string{"idempotency_key", "data_json", "attribute:"}
		}, `route "r": local.params: $3: attribute needs a name`},
		{"local role injection", localRoute, func(m map[string]any) { local(m)["role"] = "x; DROP TABLE orders" }, `route "r": local.role: "x; DROP TABLE orders" is not a plain SQL role name`},
		{"local timeout beyond the deadline", localRoute, func(m map[string]any) { local(m)["timeout"] = "30s" }, `route "r": local.timeout: 30s is longer than ack_deadline`},
		{"local block on another shape", baseRoute, func(m map[string]any) { m["local"] = map[string]any{"sql": "SELECT 1"} }, `route "r": local: only applies to shape local`},
		{"handoff dead-lettered by the broker", handoffRoute, func(m map[string]any) { m["dead_letter"] = "broker" }, `route "r": dead_letter: must be gateway for shape handoff`},
		{"handoff envelope", handoffRoute, func(m map[string]any) { effect(m)["body_mode"] = "envelope" }, `route "r": effect.body_mode: envelope is not kept by the outbox`},
		{"handoff retry bounds", handoffRoute, func(m map[string]any) { m["handoff"] = map[string]any{"retry_min": "1m", "retry_max": "1s"} }, `route "r": handoff: retry_min must be positive`},
		{"handoff call longer than a pass", handoffRoute, func(m map[string]any) { effect(m)["timeout"] = "2h" }, `route "r": effect.timeout: 2h0m0s is longer than a relay pass may take`},
		{"handoff block on another shape", baseRoute, func(m map[string]any) { m["handoff"] = map[string]any{"retry_min": "1s"} }, `route "r": handoff: only applies to shape handoff`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := tc.base()
			tc.mutate(m)
			_, err := config.ParseRoutes(routesYAML(t, m))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error:\n%v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}
