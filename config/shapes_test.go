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
		{"local optional data", localRoute, func(m map[string]any) {
			local(m)["params"] = []string{"idempotency_key", "data_json?", "attribute:region"}
		},
			`route "r": local.params: $2: data_json is always there; only an attribute can be optional`},
		{"local SET ROLE", localRoute, func(m map[string]any) { local(m)["sql"] = "SET ROLE postgres"; local(m)["params"] = []string{} },
			`route "r": local.sql: must be one SELECT, INSERT, UPDATE, DELETE or MERGE statement (WITH allowed), not SET`},
		{"local RESET after a comment", localRoute, func(m map[string]any) {
			local(m)["sql"] = "/* a /* nested */ note */ -- x\n RESET ROLE"
			local(m)["params"] = []string{}
		},
			`route "r": local.sql: must be one SELECT, INSERT, UPDATE, DELETE or MERGE statement (WITH allowed), not RESET`},
		{"local SET SESSION AUTHORIZATION", localRoute, func(m map[string]any) {
			local(m)["sql"] = "set session authorization ackgate"
			local(m)["params"] = []string{}
		},
			`not SET:`},
		{"local COMMIT", localRoute, func(m map[string]any) { local(m)["sql"] = "COMMIT"; local(m)["params"] = []string{} }, `not COMMIT:`},
		{"local set_config", localRoute, func(m map[string]any) {
			local(m)["sql"] = "SELECT set_config('role', 'ackgate', true), $1, $2, $3"
		}, `route "r": local.sql: calls set_config`},
		{"local set_config quoted and qualified", localRoute, func(m map[string]any) {
			local(m)["sql"] = `WITH x AS (SELECT pg_catalog."SET_CONFIG" ('role', current_user, true)) SELECT $1, $2, $3 FROM x`
		}, `route "r": local.sql: calls set_config`},
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

// A local statement may mention what it may not call inside literals and
// comments, and an attribute may be optional with attribute?:NAME.
func TestLocalStatementLiteralsAndOptionalParams(t *testing.T) {
	t.Parallel()
	m := localRoute()
	l := m["local"].(map[string]any)
	l["sql"] = `-- set_config( is not called here
		INSERT INTO orders (idem, body, region, note) VALUES ($1, $2::jsonb, $3, 'set_config(' || E'\' set_config(' || $$RESET ROLE; set_config($$) RETURNING id`
	l["params"] = []string{"idempotency_key", "data_json", "attribute?:region"}
	routes, err := config.ParseRoutes(routesYAML(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if p := routes[0].Local.Params[2]; p != (gate.LocalParam{Kind: gate.ParamAttribute, Name: "region", Optional: true}) {
		t.Fatalf("param %+v", p)
	}
	// A required attribute keeps the route's contract version; marking it
	// optional changes it.
	plain, err := config.ParseRoutes(routesYAML(t, localRoute()))
	if err != nil {
		t.Fatal(err)
	}
	if plain[0].Local.Params[2].Optional || plain[0].ContractVersion == routes[0].ContractVersion {
		t.Fatalf("contract versions %s and %s", plain[0].ContractVersion, routes[0].ContractVersion)
	}
}
