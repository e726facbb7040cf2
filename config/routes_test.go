package config_test

import (
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/gate"
)

// baseRoute is a valid pubsub route as a YAML map; cases mutate a copy.
func baseRoute() map[string]any {
	return map[string]any{
		"name":   "r",
		"broker": "pubsub",
		"auth":   "none",
		"shape":  "repeatable",
		"effect": map[string]any{"url": "http://127.0.0.1:9090/effects", "evidence": "status_only"},
	}
}

func routesYAML(t *testing.T, routes ...map[string]any) []byte {
	t.Helper()
	b, err := yaml.Marshal(map[string]any{"routes": routes})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func effect(m map[string]any) map[string]any { return m["effect"].(map[string]any) }

func TestExampleRoutesFileLoads(t *testing.T) {
	t.Parallel()
	routes, err := config.LoadRoutes("../examples/routes.yaml")
	if err != nil {
		t.Fatalf("LoadRoutes: %v", err)
	}
	if len(routes) != 6 {
		t.Fatalf("got %d routes, want 6", len(routes))
	}
	if l, h := routes[2], routes[3]; l.Name != "orders-local" || l.Shape != gate.ShapeLocal || l.Local == nil || len(l.Local.Params) != 3 ||
		h.Name != "orders-handoff" || h.Shape != gate.ShapeHandoff || h.RelayShape() != gate.ShapeLookup {
		t.Errorf("orders-local = %+v, orders-handoff = %+v", l, h)
	}
	orders, payments := routes[0], routes[1]
	if orders.Name != "orders" || orders.Broker != gate.BrokerPubSub || orders.Shape != gate.ShapeIdempotent ||
		orders.DedupeWindow != 24*time.Hour || orders.Effect.ResultIDHeader != "X-Result-Id" ||
		orders.Effect.URL != "http://127.0.0.1:9090/effects" {
		t.Errorf("orders = %+v", orders)
	}
	if payments.Name != "payments" || payments.Shape != gate.ShapeLookup ||
		payments.Effect.LookupURL != "http://127.0.0.1:9090/effects/{key}" ||
		payments.Broker != gate.BrokerPubSub || payments.DeadLetter != gate.DeadLetterGateway ||
		payments.Reconcile != (gate.ReconcilePolicy{Interval: 30 * time.Second, MaxInterval: 15 * time.Minute, RatePerSecond: 5}) {
		t.Errorf("payments = %+v", payments)
	}
	// The two that show the lanes: every new effect's answer is lost.
	if u, rf := routes[4], routes[5]; u.Name != "orders-unsafe" || u.Shape != gate.ShapeUnsafe || !strings.HasSuffix(u.Effect.URL, "?drop=1") ||
		rf.Name != "refunds" || rf.Shape != gate.ShapeLookup || !strings.HasSuffix(rf.Effect.URL, "?drop=1") || rf.Effect.LookupURL == "" {
		t.Errorf("orders-unsafe = %+v, refunds = %+v", u, rf)
	}
	for _, r := range routes {
		if len(r.ContractVersion) != 16 {
			t.Errorf("route %s: contract version %q", r.Name, r.ContractVersion)
		}
	}
	warnings := config.AuthNoneWarnings(routes)
	if len(warnings) != 6 || !strings.Contains(warnings[0], `route "orders": auth: none`) {
		t.Errorf("AuthNoneWarnings = %q", warnings)
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	sns := baseRoute()
	sns["name"] = "s"
	sns["broker"] = "sns"
	routes, err := config.ParseRoutes(routesYAML(t, baseRoute(), sns))
	if err != nil {
		t.Fatal(err)
	}
	wantEffect := gate.EffectSpec{
		Method:            "POST",
		URL:               "http://127.0.0.1:9090/effects",
		BodyMode:          gate.BodyRaw,
		Evidence:          gate.EvidenceStatusOnly,
		Timeout:           5 * time.Second,
		TerminalStatuses:  []int{400, 401, 403, 404, 410, 422},
		RetryableStatuses: []int{408, 425, 429, 500, 502, 503, 504},
	}
	want := []*gate.Route{
		{
			Name: "r", Tenant: "default", Broker: gate.BrokerPubSub, Auth: "none", PubSubMode: gate.PubSubWrapped,
			Key:            gate.KeySource{Kind: gate.KeyMessageID},
			Fingerprint:    gate.FingerprintSpec{Version: 1, Data: true},
			Effect:         wantEffect,
			Shape:          gate.ShapeRepeatable,
			CommitBoundary: "the downstream's evidence of the effect",
			MaxAttempts:    5,
			DeadLetter:     gate.DeadLetterBroker,
			AckDeadline:    10 * time.Second,
			Renewal:        gate.Renewal{Interval: 10 * time.Second / 3, MaxExtension: 10 * time.Second},
			Retention:      8 * 24 * time.Hour,
		},
		{
			Name: "s", Tenant: "default", Broker: gate.BrokerSNS, Auth: "none",
			Key:            gate.KeySource{Kind: gate.KeyMessageID},
			Fingerprint:    gate.FingerprintSpec{Version: 1, Data: true},
			Effect:         wantEffect,
			Shape:          gate.ShapeRepeatable,
			CommitBoundary: "the downstream's evidence of the effect",
			MaxAttempts:    5,
			DeadLetter:     gate.DeadLetterBroker,
			AckDeadline:    15 * time.Second,
			Renewal:        gate.Renewal{Interval: 5 * time.Second, MaxExtension: 0},
			Retention:      2 * time.Hour,
		},
	}
	for i, got := range routes {
		if got.ContractVersion != config.ContractVersion(got) {
			t.Errorf("route %s: ContractVersion %q, recomputed %q", got.Name, got.ContractVersion, config.ContractVersion(got))
		}
		g := *got
		g.ContractVersion = ""
		if !reflect.DeepEqual(&g, want[i]) {
			t.Errorf("route %s after defaults:\n got %+v\nwant %+v", got.Name, &g, want[i])
		}
	}
}

// A lookup route gets the reconciler's defaults, may set its own, and its
// contract shows them; no other shape has a reconcile policy.
func TestReconcilePolicy(t *testing.T) {
	t.Parallel()
	lookup := func(name string, rec map[string]any) map[string]any {
		m := baseRoute()
		m["name"], m["shape"] = name, "lookup"
		effect(m)["lookup_url"] = "http://127.0.0.1:9090/effects/{key}"
		if rec != nil {
			m["reconcile"] = rec
		}
		return m
	}
	routes, err := config.ParseRoutes(routesYAML(t, lookup("d", nil),
		lookup("c", map[string]any{"interval": "2m", "rate_per_second": 0.5}), baseRoute()))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []gate.ReconcilePolicy{
		{Interval: 30 * time.Second, MaxInterval: 15 * time.Minute, RatePerSecond: 5},
		{Interval: 2 * time.Minute, MaxInterval: 15 * time.Minute, RatePerSecond: 0.5},
		{},
	} {
		if routes[i].Reconcile != want {
			t.Errorf("route %s: reconcile %+v, want %+v", routes[i].Name, routes[i].Reconcile, want)
		}
	}
	// An interval above the default cap raises the cap with it.
	routes, err = config.ParseRoutes(routesYAML(t, lookup("long", map[string]any{"interval": "1h"})))
	if err != nil || routes[0].Reconcile.MaxInterval != time.Hour {
		t.Fatalf("interval 1h: %+v, %v", routes, err)
	}
	b, err := json.Marshal(routes[0])
	if err != nil || !strings.Contains(string(b), `"reconcile":{"interval":"1h0m0s","max_interval":"1h0m0s","rate_per_second":5}`) {
		t.Errorf("contract: %s, %v", b, err)
	}
	var back gate.Route
	if err := json.Unmarshal(b, &back); err != nil || back.Reconcile != routes[0].Reconcile {
		t.Errorf("contract round trip: %+v, %v", back.Reconcile, err)
	}
}

func TestDefaultRetentionFollowsBrokerRetention(t *testing.T) {
	t.Parallel()
	m := baseRoute()
	m["broker_retention"] = "720h"
	routes, err := config.ParseRoutes(routesYAML(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := routes[0].Retention, 31*24*time.Hour; got != want {
		t.Errorf("retention = %s, want %s", got, want)
	}
}

func TestExplicitStatusListWinsOverOtherDefault(t *testing.T) {
	t.Parallel()
	m := baseRoute()
	effect(m)["retryable_statuses"] = []int{409, 404, 503}
	routes, err := config.ParseRoutes(routesYAML(t, m))
	if err != nil {
		t.Fatal(err)
	}
	e := routes[0].Effect
	if !reflect.DeepEqual(e.RetryableStatuses, []int{404, 409, 503}) {
		t.Errorf("retryable = %v", e.RetryableStatuses)
	}
	if !reflect.DeepEqual(e.TerminalStatuses, []int{400, 401, 403, 410, 422}) {
		t.Errorf("terminal = %v, want the default without 404", e.TerminalStatuses)
	}
}

func TestInvalidRoutes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		mutate func(m map[string]any)
		want   string
	}{
		{"name missing", func(m map[string]any) { delete(m, "name") }, `route #1: name: required`},
		{"name pattern", func(m map[string]any) { m["name"] = "Orders!" }, `route "Orders!": name: `},
		{"name too long", func(m map[string]any) { m["name"] = strings.Repeat("a", 64) }, `: name: `},
		{"tenant pattern", func(m map[string]any) { m["tenant"] = "a/b" }, `route "r": tenant: `},
		{"broker missing", func(m map[string]any) { delete(m, "broker") }, `route "r": broker: required`},
		{"broker unknown", func(m map[string]any) { m["broker"] = "kafka" }, `route "r": broker: "kafka"`},
		{"auth missing", func(m map[string]any) { delete(m, "auth") }, `route "r": auth: required`},
		{"auth empty", func(m map[string]any) { m["auth"] = "" }, `route "r": auth: required`},
		{"auth unknown", func(m map[string]any) { m["auth"] = "google-oidc" }, `route "r": auth: "google-oidc" is not an authenticator`},
		{"pubsub source", func(m map[string]any) { m["sources"] = []string{"orders-sub"} }, `route "r": sources: "orders-sub"`},
		{"sns source", func(m map[string]any) {
			m["broker"] = "sns"
			m["sources"] = []string{"projects/p/subscriptions/s"}
		}, `route "r": sources: "projects/p/subscriptions/s" is not a topic ARN`},
		{"sns fifo", func(m map[string]any) {
			m["broker"] = "sns"
			m["sources"] = []string{"arn:aws:sns:eu-west-1:123456789012:orders.fifo"}
		}, `route "r": sources: "arn:aws:sns:eu-west-1:123456789012:orders.fifo" is a FIFO topic`},
		{"effect missing", func(m map[string]any) { delete(m, "effect") }, `route "r": effect: required`},
		{"effect url missing", func(m map[string]any) { delete(effect(m), "url") }, `route "r": effect.url: required`},
		{"effect url relative", func(m map[string]any) { effect(m)["url"] = "/effects" }, `route "r": effect.url: "/effects" must be an absolute http(s) URL`},
		{"effect url scheme", func(m map[string]any) { effect(m)["url"] = "ftp://h/x" }, `route "r": effect.url: "ftp://h/x" must be an absolute http(s) URL`},
		{"effect url credentials", func(m map[string]any) { effect(m)["url"] = "http://u:secret@h/x" }, `route "r": effect.url: "http://u:xxxxx@h/x" must not carry credentials`},
		{"effect method", func(m map[string]any) { effect(m)["method"] = "BREW" }, `route "r": effect.method: "BREW" is not DELETE, GET, PATCH, POST or PUT`},
		{"body mode", func(m map[string]any) { effect(m)["body_mode"] = "json" }, `route "r": effect.body_mode: "json"`},
		{"reserved header", func(m map[string]any) { effect(m)["headers"] = map[string]string{"idempotency-key": "x"} }, `route "r": effect.headers: Idempotency-Key is set by the gateway`},
		{"bad header name", func(m map[string]any) { effect(m)["headers"] = map[string]string{"a b": "x"} }, `route "r": effect.headers: "a b" is not a valid header name`},
		{"duplicate header", func(m map[string]any) { effect(m)["headers"] = map[string]string{"X-A": "1", "x-a": "2"} }, `route "r": effect.headers: X-A is given twice`},
		{"effect timeout syntax", func(m map[string]any) { effect(m)["timeout"] = "5" }, `route "r": effect.timeout: "5" is not a duration`},
		{"effect timeout negative", func(m map[string]any) { effect(m)["timeout"] = "-1s" }, `route "r": effect.timeout: must be positive`},
		{"effect timeout beyond lease", func(m map[string]any) { effect(m)["timeout"] = "21s" }, `route "r": effect.timeout: 21s is longer than ack_deadline + renewal.max_extension (20s)`},
		{"result pointer", func(m map[string]any) { effect(m)["result_id_pointer"] = "id" }, `route "r": effect.result_id_pointer: JSON pointer "id" must start with /`},
		{"status in both lists", func(m map[string]any) {
			effect(m)["terminal_statuses"] = []int{409}
			effect(m)["retryable_statuses"] = []int{409}
		}, `route "r": effect.retryable_statuses: 409 is also in terminal_statuses`},
		{"status out of range", func(m map[string]any) { effect(m)["terminal_statuses"] = []int{99, 600} }, `route "r": effect.terminal_statuses: 99 is not an HTTP status`},
		{"status 2xx", func(m map[string]any) { effect(m)["retryable_statuses"] = []int{202} }, `route "r": effect.retryable_statuses: 202 is a success`},
		{"shape missing", func(m map[string]any) { delete(m, "shape") }, `route "r": shape: required`},
		{"shape unknown", func(m map[string]any) { m["shape"] = "outbox" }, `route "r": shape: "outbox" is not`},
		{"lookup without url", func(m map[string]any) { m["shape"] = "lookup" }, `route "r": effect.lookup_url: required for shape lookup`},
		{"lookup url without key", func(m map[string]any) {
			m["shape"] = "lookup"
			effect(m)["lookup_url"] = "http://h/effects"
		}, `route "r": effect.lookup_url: must contain {key}`},
		{"lookup url relative", func(m map[string]any) {
			m["shape"] = "lookup"
			effect(m)["lookup_url"] = "/effects/{key}"
		}, `route "r": effect.lookup_url: `},
		{"lookup url on other shape", func(m map[string]any) { effect(m)["lookup_url"] = "http://h/{key}" }, `route "r": effect.lookup_url: only applies to shapes lookup and handoff`},
		{"idempotent without window", func(m map[string]any) { m["shape"] = "idempotent" }, `route "r": dedupe_window: required for shape idempotent`},
		{"idempotent zero window", func(m map[string]any) {
			m["shape"] = "idempotent"
			m["dedupe_window"] = "0s"
		}, `route "r": dedupe_window: must be positive`},
		{"window on other shape", func(m map[string]any) { m["dedupe_window"] = "24h" }, `route "r": dedupe_window: only applies to shapes idempotent and handoff`},
		{"max attempts zero", func(m map[string]any) { m["max_attempts"] = 0 }, `route "r": max_attempts: must be from 1 to 100, got 0`},
		{"max attempts large", func(m map[string]any) { m["max_attempts"] = 101 }, `route "r": max_attempts: must be from 1 to 100, got 101`},
		{"dead letter", func(m map[string]any) { m["dead_letter"] = "drop" }, `route "r": dead_letter: "drop" is not gateway or broker`},
		{"ack deadline short", func(m map[string]any) { m["ack_deadline"] = "5s" }, `route "r": ack_deadline: 5s is outside Pub/Sub's range`},
		{"ack deadline long", func(m map[string]any) { m["ack_deadline"] = "601s" }, `route "r": ack_deadline: 10m1s is outside`},
		{"sns ack deadline", func(m map[string]any) {
			m["broker"] = "sns"
			m["ack_deadline"] = "30s"
		}, `route "r": ack_deadline: 30s: SNS always waits 15s`},
		{"renewal interval not below deadline", func(m map[string]any) { m["renewal"] = map[string]any{"interval": "10s"} }, `route "r": renewal.interval: 10s must be shorter than ack_deadline (10s)`},
		{"renewal interval zero", func(m map[string]any) { m["renewal"] = map[string]any{"interval": "0s"} }, `route "r": renewal.interval: must be positive`},
		{"renewal extension negative", func(m map[string]any) { m["renewal"] = map[string]any{"max_extension": "-1s"} }, `route "r": renewal.max_extension: must not be negative`},
		{"retention below pubsub default horizon", func(m map[string]any) { m["retention"] = "72h" }, `route "r": retention: 72h0m0s does not cover the broker's redelivery horizon (168h0m0s)`},
		{"retention below configured horizon", func(m map[string]any) {
			m["broker_retention"] = "240h"
			m["retention"] = "192h"
		}, `route "r": retention: 192h0m0s does not cover the broker's redelivery horizon (240h0m0s)`},
		{"retention below sns horizon", func(m map[string]any) {
			m["broker"] = "sns"
			m["retention"] = "30m"
		}, `route "r": retention: 30m0s does not cover the broker's redelivery horizon (1h0m15s)`},
		{"retention of exactly sns's retry time", func(m map[string]any) {
			m["broker"] = "sns"
			m["retention"] = "1h"
		}, `route "r": retention: 1h0m0s does not cover the broker's redelivery horizon (1h0m15s)`},
		{"reconcile on an unsafe route", func(m map[string]any) {
			m["shape"] = "unsafe"
			m["reconcile"] = map[string]any{"interval": "1m"}
		}, `route "r": reconcile: only applies to shape lookup (or handoff with a lookup_url), not unsafe`},
		{"reconcile interval too short", func(m map[string]any) {
			m["shape"] = "lookup"
			effect(m)["lookup_url"] = "http://h/effects/{key}"
			m["reconcile"] = map[string]any{"interval": "100ms"}
		}, `route "r": reconcile.interval: must be from 1s to 24h0m0s, got 100ms`},
		{"reconcile max below interval", func(m map[string]any) {
			m["shape"] = "lookup"
			effect(m)["lookup_url"] = "http://h/effects/{key}"
			m["reconcile"] = map[string]any{"interval": "1m", "max_interval": "30s"}
		}, `route "r": reconcile.max_interval: must be from reconcile.interval (1m0s) to 24h0m0s, got 30s`},
		{"reconcile rate zero", func(m map[string]any) {
			m["shape"] = "lookup"
			effect(m)["lookup_url"] = "http://h/effects/{key}"
			m["reconcile"] = map[string]any{"rate_per_second": 0}
		}, `route "r": reconcile.rate_per_second: must be above 0 and at most 1000, got 0`},
		{"reconcile field unknown", func(m map[string]any) {
			m["shape"] = "lookup"
			effect(m)["lookup_url"] = "http://h/effects/{key}"
			m["reconcile"] = map[string]any{"every": "1m"}
		}, `unknown field "every"`},
		{"broker retention too long", func(m map[string]any) { m["broker_retention"] = "745h" }, `route "r": broker_retention: 745h0m0s is outside`},
		{"broker retention on sns", func(m map[string]any) {
			m["broker"] = "sns"
			m["broker_retention"] = "1h"
		}, `route "r": broker_retention: only applies to pubsub`},
		{"retention syntax", func(m map[string]any) { m["retention"] = "8 days" }, `route "r": retention: "8 days" is not a duration`},
		{"key kind unknown", func(m map[string]any) { m["operation_key"] = map[string]any{"kind": "uuid"} }, `route "r": operation_key.kind: "uuid" is not message_id, attribute or json_pointer`},
		{"key name without kind", func(m map[string]any) { m["operation_key"] = map[string]any{"name": "order_id"} }, `route "r": operation_key.kind: required when a name is given`},
		{"attribute key without name", func(m map[string]any) { m["operation_key"] = map[string]any{"kind": "attribute"} }, `route "r": operation_key.name: required for kind attribute`},
		{"pointer key without name", func(m map[string]any) { m["operation_key"] = map[string]any{"kind": "json_pointer"} }, `route "r": operation_key.name: required for kind json_pointer`},
		{"pointer key without slash", func(m map[string]any) {
			m["operation_key"] = map[string]any{"kind": "json_pointer", "name": "order/id"}
		}, `route "r": operation_key.name: JSON pointer "order/id" must start with /`},
		{"message id key with name", func(m map[string]any) {
			m["operation_key"] = map[string]any{"kind": "message_id", "name": "x"}
		}, `route "r": operation_key.name: must be empty for kind message_id`},
		{"empty private entry", func(m map[string]any) { m["private"] = []string{" "} }, `route "r": private: attribute names and JSON pointers must not be empty`},
		{"fingerprint pointer", func(m map[string]any) { m["fingerprint"] = map[string]any{"pointers": []string{"amount"}} }, `route "r": fingerprint.pointers: JSON pointer "amount" must start with /`},
		{"fingerprint version", func(m map[string]any) { m["fingerprint"] = map[string]any{"version": 0} }, `route "r": fingerprint.version: must be 1 or more`},
		{"fingerprint empty", func(m map[string]any) { m["fingerprint"] = map[string]any{"data": false} }, `route "r": fingerprint: covers nothing`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := baseRoute()
			tc.mutate(m)
			_, err := config.ParseRoutes(routesYAML(t, m))
			if err == nil {
				t.Fatalf("no error, want one containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error:\n%v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

// A key drawn from a field listed as private, an attribute or a JSON
// pointer, is marked hashed in the contract (and so changes its version);
// any other key is not.
func TestPrivateKeyIsHashed(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		kind, name string
		private    []string
		hashed     bool
	}{
		{"attribute", "email", []string{"email"}, true},
		{"json_pointer", "/payment/id", []string{"/payment/id", "email"}, true},
		{"attribute", "order_id", []string{"email"}, false},
		{"json_pointer", "/payment/id", []string{"/payment"}, false},
		{"message_id", "", []string{"email"}, false},
	} {
		m := baseRoute()
		m["operation_key"] = map[string]any{"kind": c.kind, "name": c.name}
		m["private"] = c.private
		routes, err := config.ParseRoutes(routesYAML(t, m))
		if err != nil {
			t.Fatalf("%s %s: %v", c.kind, c.name, err)
		}
		r := routes[0]
		if r.Key.Hashed != c.hashed || r.HashKey != nil {
			t.Errorf("%s %s private %v: hashed %v, want %v (and no hash before wiring)", c.kind, c.name, c.private, r.Key.Hashed, c.hashed)
		}
		if c.hashed {
			plain := *r
			plain.Key.Hashed = false
			if config.ContractVersion(&plain) == r.ContractVersion {
				t.Errorf("%s %s: hashing the key leaves the contract version unchanged", c.kind, c.name)
			}
		}
	}
}

func TestPrivateAttributeMayBeFingerprinted(t *testing.T) {
	t.Parallel()
	m := baseRoute()
	m["private"] = []string{"email"}
	m["fingerprint"] = map[string]any{"attributes": []string{"email"}}
	if _, err := config.ParseRoutes(routesYAML(t, m)); err != nil {
		t.Fatal(err)
	}
}

func TestAllErrorsAreReported(t *testing.T) {
	t.Parallel()
	a := baseRoute()
	a["name"] = "a"
	a["max_attempts"] = 0
	effect(a)["url"] = "nope"
	b := baseRoute()
	b["name"] = "b"
	b["auth"] = "sigv4"
	dup := baseRoute()
	dup["name"] = "a"
	_, err := config.ParseRoutes(routesYAML(t, a, b, dup))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		`route "a": max_attempts:`,
		`route "a": effect.url:`,
		`route "b": auth: "sigv4" is not an authenticator`,
		`route "a": name: already used by route #1`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error:\n%v\nmissing %q", err, want)
		}
	}
}

func TestUnknownFieldsAreRejected(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, doc, want string
	}{
		{"route field", `
routes:
  - name: orders
    broker: pubsub
    auth: none
    shape: repeatable
    retries: 3
    effect: {url: "http://h/x"}
`, `route "orders": line 7: unknown field "retries"`},
		{"nested field", `
routes:
  - name: ok
    broker: pubsub
    auth: none
    shape: repeatable
    effect: {url: "http://h/x"}
  - name: orders
    broker: pubsub
    auth: none
    shape: repeatable
    effect:
      url: "http://h/x"
      timout: 5s
`, `route "orders": line 14: unknown field "timout"`},
		{"top level", `
route:
  - name: orders
`, `line 2: unknown field "route"`},
		{"wrong type", `
routes:
  - name: orders
    max_attempts: many
`, `route "orders": line 4: cannot unmarshal`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := config.ParseRoutes([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestEmptyAndMalformedFiles(t *testing.T) {
	t.Parallel()
	for name, doc := range map[string]string{
		"empty":          "",
		"no routes":      "routes: []\n",
		"two documents":  "routes:\n  - name: a\n---\nroutes: []\n",
		"not yaml":       "routes: [\n",
		"duplicate keys": "routes:\n  - name: a\n    name: b\n",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := config.ParseRoutes([]byte(doc)); err == nil {
				t.Fatal("no error")
			}
		})
	}
	if _, err := config.LoadRoutes("testdata/does-not-exist.yaml"); err == nil {
		t.Error("LoadRoutes of a missing file: no error")
	}
}

var hex16 = regexp.MustCompile(`^[0-9a-f]{16}$`)

func TestContractVersion(t *testing.T) {
	t.Parallel()
	version := func(mutate func(m map[string]any)) string {
		t.Helper()
		m := baseRoute()
		m["sources"] = []string{"projects/p/subscriptions/a", "projects/p/subscriptions/b"}
		m["fingerprint"] = map[string]any{"attributes": []string{"x", "y"}}
		effect(m)["headers"] = map[string]string{"X-Team": "payments"}
		if mutate != nil {
			mutate(m)
		}
		routes, err := config.ParseRoutes(routesYAML(t, m))
		if err != nil {
			t.Fatal(err)
		}
		return routes[0].ContractVersion
	}
	base := version(nil)
	if !hex16.MatchString(base) {
		t.Fatalf("contract version %q is not 16 hex digits", base)
	}
	if again := version(nil); again != base {
		t.Errorf("not stable: %s then %s", base, again)
	}
	same := map[string]func(m map[string]any){
		"sources reordered": func(m map[string]any) {
			m["sources"] = []string{"projects/p/subscriptions/b", "projects/p/subscriptions/a"}
		},
		"attributes reordered":   func(m map[string]any) { m["fingerprint"] = map[string]any{"attributes": []string{"y", "x"}} },
		"header case":            func(m map[string]any) { effect(m)["headers"] = map[string]string{"x-team": "payments"} },
		"defaults written out":   func(m map[string]any) { m["tenant"] = "default"; m["max_attempts"] = 5; effect(m)["method"] = "post" },
		"broker retention check": func(m map[string]any) { m["broker_retention"] = "24h"; m["retention"] = "192h" },
	}
	for name, mutate := range same {
		if got := version(mutate); got != base {
			t.Errorf("%s changed the contract version: %s -> %s", name, base, got)
		}
	}
	changed := map[string]func(m map[string]any){
		"effect timeout": func(m map[string]any) { effect(m)["timeout"] = "6s" },
		"effect url":     func(m map[string]any) { effect(m)["url"] = "http://127.0.0.1:9091/effects" },
		"header value":   func(m map[string]any) { effect(m)["headers"] = map[string]string{"X-Team": "orders"} },
		"shape":          func(m map[string]any) { m["shape"] = "unsafe" },
		"max attempts":   func(m map[string]any) { m["max_attempts"] = 6 },
		"tenant":         func(m map[string]any) { m["tenant"] = "acme" },
		"fingerprint ver": func(m map[string]any) {
			m["fingerprint"] = map[string]any{"version": 2, "attributes": []string{"x", "y"}}
		},
		"private":   func(m map[string]any) { m["private"] = []string{"email"} },
		"retention": func(m map[string]any) { m["retention"] = "200h" },
	}
	for name, mutate := range changed {
		if got := version(mutate); got == base {
			t.Errorf("%s did not change the contract version %s", name, base)
		}
	}
}
