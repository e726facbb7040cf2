package handlers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	valerrors "github.com/pb33f/libopenapi-validator/errors"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/handlers"
	"github.com/ackgate/ackgate/internal/authtest"
)

// openapi.yaml describes both listeners. These tests hold the routers to it
// (every route described, nothing described that is not served) and hold a
// running gateway's answers to it, validated by libopenapi-validator, which
// implements OpenAPI 3.1 with JSON Schema 2020-12.

// specFile is openapi.yaml at the repository root; go test runs in handlers/.
const specFile = "../openapi.yaml"

// adminScheme is the security scheme every admin operation must require.
const adminScheme = "adminBearer"

func loadSpec(t *testing.T) libopenapi.Document {
	t.Helper()
	raw, err := os.ReadFile(specFile)
	if err != nil {
		t.Fatalf("read %s: %v", specFile, err)
	}
	doc, err := libopenapi.NewDocument(raw)
	if err != nil {
		t.Fatalf("parse %s: %v", specFile, err)
	}
	return doc
}

func specModel(t *testing.T) *v3.Document {
	t.Helper()
	m, err := loadSpec(t).BuildV3Model()
	if err != nil {
		t.Fatalf("build the model of %s: %v", specFile, err)
	}
	return &m.Model
}

// newSpecValidator validates formats (date-time), content encodings (base64)
// and, in strict mode, reports any property or response header that a
// response carries and openapi.yaml does not declare, so a field added to a
// handler's JSON fails here until the spec names it.
//
// Strict mode counts the keys of a map (additionalProperties with a schema) as
// undeclared; message attributes and effect headers are such maps, whose
// values the schema still checks.
func newSpecValidator(t *testing.T) validator.Validator {
	t.Helper()
	v, errs := validator.NewValidator(loadSpec(t),
		config.WithFormatAssertions(), config.WithContentAssertions(), config.WithStrictMode(),
		config.WithStrictIgnorePaths("$.body.message.attributes.*", "$.body.effect.headers.*", "$.body.routes[*].effect.headers.*", "$.body.contract.effect.headers.*"))
	if len(errs) > 0 {
		t.Fatalf("validator for %s: %v", specFile, errs)
	}
	return v
}

func TestOpenAPIDocumentIsValid(t *testing.T) {
	t.Parallel()
	doc := loadSpec(t)
	if v := doc.GetVersion(); v != "3.1.0" {
		t.Fatalf("openapi.yaml declares OpenAPI %q, want 3.1.0", v)
	}
	v := newSpecValidator(t)
	if ok, errs := v.ValidateDocument(); !ok {
		t.Fatalf("openapi.yaml is not a valid OpenAPI 3.1 document:\n%s", describe(errs))
	}
}

// ---- routes --------------------------------------------------------------

// listener is one HTTP listener: its tag in openapi.yaml and its router.
type listener struct {
	tag    string
	router http.Handler
}

func gatewayListeners() []listener {
	return []listener{
		{"ingest", handlers.NewIngest(handlers.IngestOptions{})},
		{"admin", handlers.NewAdmin(handlers.AdminOptions{})},
	}
}

// chiParam matches a chi parameter with a regexp, {id:[0-9]+}, which
// OpenAPI spells {id}.
var chiParam = regexp.MustCompile(`\{([^{}:]+):[^{}]*\}`)

// servedOperations walks each listener's chi routes: "GET /v1/routes" -> tag.
func servedOperations(t *testing.T, ls []listener) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, l := range ls {
		routes, ok := l.router.(chi.Routes)
		if !ok {
			t.Fatalf("the %s listener's handler is a %T, not a chi router: the route check cannot walk it", l.tag, l.router)
		}
		err := chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
			key := method + " " + chiParam.ReplaceAllString(route, "{$1}")
			out[key] = append(out[key], l.tag)
			return nil
		})
		if err != nil {
			t.Fatalf("walk the %s listener's routes: %v", l.tag, err)
		}
	}
	return out
}

// specOperation is what openapi.yaml says about one path and method.
type specOperation struct {
	tags     []string
	security []string
}

func describedOperations(m *v3.Document) map[string]specOperation {
	out := map[string]specOperation{}
	if m.Paths == nil {
		return out
	}
	for path, item := range m.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			so := specOperation{tags: op.Tags}
			for _, req := range op.Security {
				for name := range req.Requirements.FromOldest() {
					so.security = append(so.security, name)
				}
			}
			out[strings.ToUpper(method)+" "+path] = so
		}
	}
	return out
}

// routeMismatches compares the routers with the spec and says, for each
// difference, exactly what to change.
func routeMismatches(served map[string][]string, described map[string]specOperation) []string {
	var out []string
	for _, key := range sortedKeys(served) {
		tags := served[key]
		method, path, _ := strings.Cut(key, " ")
		yamlKey := fmt.Sprintf("paths.%q.%s", path, strings.ToLower(method))
		if strings.Contains(path, "*") {
			out = append(out, fmt.Sprintf("%s is served by the %s listener with a wildcard, which openapi.yaml cannot describe: give it explicit paths", key, strings.Join(tags, " and ")))
			continue
		}
		if len(tags) > 1 {
			out = append(out, fmt.Sprintf("%s is served by both the %s listeners: every path belongs to one listener", key, strings.Join(tags, " and ")))
			continue
		}
		tag := tags[0]
		op, ok := described[key]
		if !ok {
			hint := ""
			if tag == "admin" {
				hint = " and security: [{" + adminScheme + ": []}]"
			}
			out = append(out, fmt.Sprintf("%s is served by the %s listener but missing from openapi.yaml: add %s with tags: [%s]%s, its parameters and every response status it can return",
				key, tag, yamlKey, tag, hint))
			continue
		}
		if !slices.Equal(op.tags, []string{tag}) {
			out = append(out, fmt.Sprintf("%s is served by the %s listener but openapi.yaml tags it %v: set %s.tags to [%s]", key, tag, op.tags, yamlKey, tag))
		}
		admin := slices.Contains(op.security, adminScheme)
		switch {
		case tag == "admin" && !admin:
			out = append(out, fmt.Sprintf("%s is behind the admin token but openapi.yaml does not say so: set %s.security to [{%s: []}]", key, yamlKey, adminScheme))
		case tag != "admin" && admin:
			out = append(out, fmt.Sprintf("%s is on the %s listener, which does not take the admin token: remove %s from %s.security", key, tag, adminScheme, yamlKey))
		}
	}
	for _, key := range sortedKeys(described) {
		if _, ok := served[key]; !ok {
			method, path, _ := strings.Cut(key, " ")
			out = append(out, fmt.Sprintf("openapi.yaml describes %s but no listener serves it: remove paths.%q.%s from openapi.yaml or register the route in handlers/routes.go",
				key, path, strings.ToLower(method)))
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Every route of both listeners is in openapi.yaml, on the right listener and
// with the right security, and openapi.yaml describes nothing else.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	t.Parallel()
	served := servedOperations(t, gatewayListeners())
	described := describedOperations(specModel(t))
	if len(served) == 0 || len(described) == 0 {
		t.Fatalf("nothing to compare: %d routes served, %d operations described", len(served), len(described))
	}
	for _, m := range routeMismatches(served, described) {
		t.Error(m)
	}
}

// The check above fails, naming the path and method to add, as soon as a
// listener gains a route the spec does not describe; and names what to remove
// when the spec describes a route no listener serves.
func TestOpenAPIRouteCheckNamesWhatToChange(t *testing.T) {
	t.Parallel()
	described := describedOperations(specModel(t))

	before := routeMismatches(servedOperations(t, gatewayListeners()), described)

	grown := chi.NewRouter()
	grown.Mount("/", handlers.NewAdmin(handlers.AdminOptions{}))
	grown.Post("/v1/operations/{id:[a-z0-9_]+}/annotate", func(http.ResponseWriter, *http.Request) {})
	ls := append(gatewayListeners()[:1], listener{"admin", grown})
	got := slices.DeleteFunc(routeMismatches(servedOperations(t, ls), described), func(m string) bool { return slices.Contains(before, m) })
	want := `POST /v1/operations/{id}/annotate is served by the admin listener but missing from openapi.yaml: add paths."/v1/operations/{id}/annotate".post with tags: [admin] and security: [{adminBearer: []}], its parameters and every response status it can return`
	if !slices.Equal(got, []string{want}) {
		t.Fatalf("new mismatches for a router with an extra route:\n%s\nwant exactly:\n%s", strings.Join(got, "\n"), want)
	}

	var admin []string
	for _, key := range sortedKeys(described) {
		if slices.Contains(described[key].tags, "admin") {
			admin = append(admin, key)
		}
	}
	got = slices.DeleteFunc(routeMismatches(servedOperations(t, gatewayListeners()[:1]), described), func(m string) bool { return slices.Contains(before, m) })
	if len(admin) == 0 || len(got) != len(admin) {
		t.Fatalf("without the admin listener, want the %d admin operations %v reported, got:\n%s", len(admin), admin, strings.Join(got, "\n"))
	}
	for i, m := range got {
		if !strings.HasPrefix(m, "openapi.yaml describes "+admin[i]+" but no listener serves it") {
			t.Errorf("mismatch %q, want one for %s", m, admin[i])
		}
	}
}

// ---- answers of a running gateway --------------------------------------------

// request validation expectations.
type reqCheck int

const (
	// requestConforms: the request itself must satisfy openapi.yaml.
	requestConforms reqCheck = iota
	// requestViolates: the request is deliberately outside openapi.yaml; the
	// spec must refuse it as the handler does.
	requestViolates
)

// specClient sends requests to a listener and validates each exchange.
type specClient struct {
	t *testing.T
	v validator.Validator
}

type exchange struct {
	method, url string
	body        []byte
	token       string // sent as a bearer token when not empty
	header      map[string]string
	want        int
	request     reqCheck
}

func (x exchange) newRequest(t *testing.T) *http.Request {
	t.Helper()
	var body io.Reader
	if x.body != nil {
		body = bytes.NewReader(x.body)
	}
	req, err := http.NewRequest(x.method, x.url, body)
	if err != nil {
		t.Fatalf("request %s %s: %v", x.method, x.url, err)
	}
	if x.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if x.token != "" {
		req.Header.Set("Authorization", "Bearer "+x.token)
	}
	for k, v := range x.header {
		req.Header.Set(k, v)
	}
	return req
}

// do sends x, checks its status, validates the answer (status, headers, body)
// against openapi.yaml, and the request as x.request says. It returns the body.
func (c *specClient) do(x exchange) []byte {
	t := c.t
	t.Helper()
	resp, err := http.DefaultClient.Do(x.newRequest(t))
	if err != nil {
		t.Fatalf("%s %s: %v", x.method, x.url, err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("%s %s: read answer: %v", x.method, x.url, err)
	}
	what := fmt.Sprintf("%s %s -> %d", x.method, pathOf(x.url), resp.StatusCode)
	if resp.StatusCode != x.want {
		t.Fatalf("%s, want %d: %s", what, x.want, raw)
	}
	if resp.StatusCode == http.StatusNoContent && len(raw) != 0 {
		t.Errorf("%s carries a body, but openapi.yaml says 204 has none: %s", what, raw)
	}
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	if ok, errs := c.v.ValidateHttpResponse(x.newRequest(t), resp); !ok {
		t.Errorf("%s: the answer does not match openapi.yaml:\n%s\nbody: %s", what, describe(errs), raw)
	}
	ok, errs := c.v.ValidateHttpRequest(x.newRequest(t))
	switch {
	case x.request == requestConforms && !ok:
		t.Errorf("%s: the request does not match openapi.yaml:\n%s", what, describe(errs))
	case x.request == requestViolates && ok:
		t.Errorf("%s: openapi.yaml accepts a request the handler refused", what)
	}
	return raw
}

func pathOf(u string) string {
	if i := strings.Index(u, "/v1/"); i >= 0 {
		return u[i:]
	}
	if i := strings.LastIndex(u, "/"); i >= 0 {
		return u[i:]
	}
	return u
}

func describe(errs []*valerrors.ValidationError) string {
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "  - %s: %s", e.Message, e.Reason)
		if e.SpecLine > 0 {
			fmt.Fprintf(&b, " (openapi.yaml line %d)", e.SpecLine)
		}
		b.WriteString("\n")
		for _, f := range e.SchemaValidationErrors {
			fmt.Fprintf(&b, "      %s at %s (%s)\n", f.Reason, f.FieldPath, f.KeywordLocation)
		}
	}
	return b.String()
}

func decode[T any](t *testing.T, raw []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("decode %T: %v: %s", v, err, raw)
	}
	return v
}

// Every status the Pub/Sub push endpoint answers, from a gateway on real
// Postgres, Redis and a real downstream, validated against openapi.yaml.
func TestOpenAPIPushAnswers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true,
		routeYAML("orders", "idempotent", "broker", "")+
			routeYAML("ledgered", "idempotent", "gateway", "")+
			routeYAML("guarded", "idempotent", "broker", "    sources: [projects/p/subscriptions/allowed]\n")+
			routeYAML("keyed", "idempotent", "broker", "    operation_key:\n      kind: attribute\n      name: order_id\n"))
	c := &specClient{t: t, v: newSpecValidator(t)}
	push := func(route string, body []byte, want int, rc reqCheck) handlers.AnswerBody {
		t.Helper()
		raw := c.do(exchange{method: http.MethodPost, url: e.ingest.URL + "/v1/push/pubsub/" + route, body: body, want: want, request: rc})
		if want == http.StatusNoContent {
			return handlers.AnswerBody{}
		}
		return decode[handlers.AnswerBody](t, raw)
	}
	wantAnswer := func(got handlers.AnswerBody, dec gate.Decision, state gate.State) {
		t.Helper()
		if got.Decision != dec || got.State != state || got.Reason == "" {
			t.Errorf("answer = %+v, want decision %s, state %q and a reason", got, dec, state)
		}
	}

	// 204: the effect is confirmed, and again for a redelivery.
	m := msg{ID: "m-ack", Data: `{"order":1}`, Attrs: map[string]string{"event_type": "created"}}
	push("orders", envelope(m), http.StatusNoContent, requestConforms)
	e.waitState(e.opID("orders", m), gate.StateAcknowledged)
	push("orders", envelope(m), http.StatusNoContent, requestConforms)

	// 503: a retryable downstream failure, with Retry-After.
	e.down.set(status(http.StatusServiceUnavailable))
	failing := msg{ID: "m-503", Data: "x"}
	a := push("orders", envelope(failing), http.StatusServiceUnavailable, requestConforms)
	wantAnswer(a, gate.Nack, gate.StatePendingEffect)
	if a.OperationID != e.opID("orders", failing) {
		t.Errorf("nack names operation %q, want %q", a.OperationID, e.opID("orders", failing))
	}
	e.down.set(nil)

	// 503: the same key with another payload under dead_letter: broker.
	a = push("orders", envelope(msg{ID: "m-ack", Data: `{"order":2}`}), http.StatusServiceUnavailable, requestConforms)
	wantAnswer(a, gate.Nack, gate.StateConflicting)
	if !strings.HasPrefix(a.OperationID, "cf_") {
		t.Errorf("conflict nack names %q, want a conflict record id", a.OperationID)
	}

	// 204: the same under dead_letter: gateway, dead-lettered and acked.
	push("ledgered", envelope(msg{ID: "m-dl", Data: "1"}), http.StatusNoContent, requestConforms)
	push("ledgered", envelope(msg{ID: "m-dl", Data: "2"}), http.StatusNoContent, requestConforms)
	// 204: poison under dead_letter: gateway, recorded and acked: a body
	// that is no envelope, an id the ledger cannot hold.
	push("ledgered", []byte(`{"message":`), http.StatusNoContent, requestViolates)
	push("ledgered", []byte(`{"message":{"data":"eA==","messageId":"m\u0000"},"subscription":"projects/p/subscriptions/s"}`), http.StatusNoContent, requestConforms)

	// 400: not a push envelope; the spec refuses these bodies too.
	for _, body := range []string{
		`{"message":`,
		`{"subscription":"projects/p/subscriptions/s"}`,
		`{"message":{"messageId":"m-1"},"subscription":"projects/p/subscriptions/s"}`,
		`{"message":{"data":"eA==","messageId":""},"subscription":"projects/p/subscriptions/s"}`,
		`{"message":{"data":"not base64!","messageId":"m-1"},"subscription":"projects/p/subscriptions/s"}`,
		`{"message":{"data":"eA==","messageId":"m-1","publishTime":"yesterday"},"subscription":"projects/p/subscriptions/s"}`,
		`{"message":{"data":"eA==","messageId":"m-1"},"subscription":"projects/p/subscriptions/s","deliveryAttempt":-1}`,
	} {
		wantAnswer(push("orders", []byte(body), http.StatusBadRequest, requestViolates), gate.Reject, "")
	}
	// 400: a well-formed envelope without the attribute the route's key needs.
	wantAnswer(push("keyed", envelope(msg{ID: "m-nokey", Data: "x"}), http.StatusBadRequest, requestConforms), gate.Reject, "")

	// 403: a subscription the route does not allow.
	wantAnswer(push("guarded", envelope(msg{ID: "m-403", Data: "x", Sub: "projects/p/subscriptions/other"}), http.StatusForbidden, requestConforms), gate.Reject, "")

	// 404: no such route (and no Pub/Sub route of that name).
	wantAnswer(push("no-such-route", envelope(msg{ID: "m-404", Data: "x"}), http.StatusNotFound, requestConforms), gate.Nack, "")

	// 413: larger than the configured body limit.
	big := envelope(msg{ID: "m-413", Data: strings.Repeat("a", 70<<10)})
	wantAnswer(push("orders", big, http.StatusRequestEntityTooLarge, requestConforms), gate.Reject, "")

	// The probes on the same listener.
	c.do(exchange{method: http.MethodGet, url: e.ingest.URL + "/healthz", want: http.StatusOK})
	c.do(exchange{method: http.MethodGet, url: e.ingest.URL + "/readyz", want: http.StatusOK})
}

// Evidence records in the shapes the lifecycle produces, lists with their
// cursors and route contracts, validated against openapi.yaml.
func TestOpenAPIAdminAnswers(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, true,
		routeYAML("orders", "idempotent", "broker", "    sources: [projects/p/subscriptions/s]\n    private: [email]\n    fingerprint:\n      data: true\n      attributes: [event_type]\n")+
			"      headers:\n        Authorization: Bearer downstream-secret\n"+
			routeYAML("ledgered", "idempotent", "gateway", "")+
			routeYAML("fragile", "unsafe", "broker", "")+
			routeYAML("checked", "lookup", "broker", "    operation_key:\n      kind: json_pointer\n      name: /id\n    private: [/id]\n"),
		map[string]string{"GATEWAY_KEY_HASH_SECRET": keyHashSecret})
	c := &specClient{t: t, v: newSpecValidator(t)}
	push := func(route string, m msg) {
		t.Helper()
		e.push(route, m)
	}
	admin := func(path string, want int) []byte {
		t.Helper()
		return c.do(exchange{method: http.MethodGet, url: e.admin.URL + path, token: adminToken, want: want})
	}

	// acknowledged, then redelivered after the ack.
	acked := msg{ID: "m-acked", Data: "1", Attrs: map[string]string{"event_type": "created"}}
	push("orders", acked)
	e.waitState(e.opID("orders", acked), gate.StateAcknowledged)
	push("orders", acked)
	// pending_effect after a retryable failure.
	e.down.set(status(http.StatusServiceUnavailable))
	pending := msg{ID: "m-pending", Data: "2"}
	push("orders", pending)
	// effect_indeterminate: an unsafe effect whose response was lost.
	e.down.set(dropAfterApply)
	lost := msg{ID: "m-lost", Data: "3"}
	push("fragile", lost)
	// a lookup route: the lost response is looked up and found.
	looked := msg{ID: "m-looked", Data: `{"id":"pay-1"}`}
	push("checked", looked)
	e.down.set(nil)
	push("checked", looked)
	// a conflict record, dead-lettered by the gateway.
	push("ledgered", msg{ID: "m-cf", Data: "a"})
	push("ledgered", msg{ID: "m-cf", Data: "b"})
	// poison records, with and without a message id, acked and refused.
	e.pushRaw("ledgered", []byte(`{"message":`))
	e.pushRaw("checked", envelope(msg{ID: "m-nokey", Data: `{"other":1}`}))

	ids := []string{e.opID("orders", acked), e.opID("orders", pending), e.opID("fragile", lost), e.opID("checked", looked)}
	var conflicts adminapi.OperationList
	raw := admin("/v1/operations?state=conflicting&route=ledgered", http.StatusOK)
	conflicts = decode[adminapi.OperationList](t, raw)
	if len(conflicts.Operations) != 1 {
		t.Fatalf("conflict records = %+v", conflicts.Operations)
	}
	ids = append(ids, conflicts.Operations[0].ID)

	seen := map[gate.State]bool{}
	for _, id := range ids {
		rec := decode[adminapi.EvidenceRecord](t, admin("/v1/operations/"+id, http.StatusOK))
		if rec.Operation.ID != id || len(rec.Transitions) == 0 || rec.Statement == "" || rec.Contract == nil {
			t.Errorf("record %s incomplete: %+v", id, rec)
		}
		seen[rec.Operation.State] = true
	}
	for _, s := range []gate.State{gate.StateAcknowledged, gate.StatePendingEffect, gate.StateEffectIndeterminate, gate.StateConflicting} {
		if !seen[s] {
			t.Errorf("no evidence record in state %s was validated; states seen: %v", s, seen)
		}
	}

	// Lists: filters, a full page with its cursor, the page after it.
	first := decode[adminapi.OperationList](t, admin("/v1/operations?limit=2", http.StatusOK))
	if len(first.Operations) != 2 || first.NextCursor == "" {
		t.Fatalf("first page = %d operations, cursor %q", len(first.Operations), first.NextCursor)
	}
	admin("/v1/operations?limit=500&cursor="+first.NextCursor, http.StatusOK)
	list := decode[adminapi.OperationList](t, admin("/v1/operations?message_id=m-acked&route=orders", http.StatusOK))
	if len(list.Operations) != 1 || list.NextCursor != "" {
		t.Errorf("by message id: %+v", list)
	}
	admin("/v1/operations?key=m-acked&state=acknowledged", http.StatusOK)
	// A private key: searched in clear on its route, shown hashed.
	if l := decode[adminapi.OperationList](t, admin("/v1/operations?route=checked&key=pay-1", http.StatusOK)); len(l.Operations) != 1 || l.Operations[0].Key == "pay-1" {
		t.Errorf("by private key: %+v", l)
	}

	// Poison records, a page and the page after it.
	poison := decode[adminapi.PoisonList](t, admin("/v1/poison", http.StatusOK))
	if len(poison.Poison) != 2 {
		t.Errorf("poison records = %+v, want 2", poison.Poison)
	}
	page := decode[adminapi.PoisonList](t, admin("/v1/poison?limit=1", http.StatusOK))
	if len(page.Poison) != 1 || page.NextCursor == "" {
		t.Fatalf("first poison page = %+v", page)
	}
	admin("/v1/poison?route=checked&limit=1&cursor="+page.NextCursor, http.StatusOK)

	// Route contracts.
	routes := decode[adminapi.RouteList](t, admin("/v1/routes", http.StatusOK))
	if len(routes.Routes) != 4 {
		t.Errorf("route list has %d routes, want 4", len(routes.Routes))
	}
	rt := decode[gate.Route](t, admin("/v1/routes/orders", http.StatusOK))
	if rt.Effect.Headers["Authorization"] != "(redacted)" || rt.AckDeadline <= 0 {
		t.Errorf("route contract = %+v", rt)
	}
	if rt := decode[gate.Route](t, admin("/v1/routes/checked", http.StatusOK)); !rt.Key.Hashed {
		t.Errorf("checked's contract %+v does not say its key is hashed", rt.Key)
	}

	// The process's Prometheus exposition, after all of the above.
	if body := admin("/metrics", http.StatusOK); !bytes.Contains(body, []byte("# TYPE ")) {
		t.Errorf("/metrics is not a Prometheus exposition:\n%s", body)
	}
}

// Admin refusals: no or a wrong token, bad queries, unknown ids and names.
func TestOpenAPIAdminRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, routeYAML("orders", "idempotent", "broker", ""))
	c := &specClient{t: t, v: newSpecValidator(t)}
	for _, x := range []exchange{
		// 401: the spec's security requirement refuses the same requests.
		{method: http.MethodGet, url: "/v1/operations", want: http.StatusUnauthorized, request: requestViolates},
		{method: http.MethodGet, url: "/v1/routes", want: http.StatusUnauthorized, request: requestViolates},
		{method: http.MethodGet, url: "/v1/routes/orders", token: "not-the-token", want: http.StatusUnauthorized},
		{method: http.MethodGet, url: "/v1/operations/op_x", token: "not-the-token", want: http.StatusUnauthorized},
		// 400: out of range for the handler and for the spec alike.
		{method: http.MethodGet, url: "/v1/operations?state=done", token: adminToken, want: http.StatusBadRequest, request: requestViolates},
		{method: http.MethodGet, url: "/v1/operations?limit=0", token: adminToken, want: http.StatusBadRequest, request: requestViolates},
		{method: http.MethodGet, url: "/v1/operations?limit=501", token: adminToken, want: http.StatusBadRequest, request: requestViolates},
		{method: http.MethodGet, url: "/v1/operations?limit=ten", token: adminToken, want: http.StatusBadRequest, request: requestViolates},
		{method: http.MethodGet, url: "/v1/operations?route=" + strings.Repeat("r", 1025), token: adminToken, want: http.StatusBadRequest, request: requestViolates},
		{method: http.MethodGet, url: "/v1/operations/" + strings.Repeat("x", 65), token: adminToken, want: http.StatusBadRequest, request: requestViolates},
		// 400: a cursor this gateway never issued is well-formed for the spec.
		{method: http.MethodGet, url: "/v1/operations?cursor=bm90IGEgY3Vyc29y", token: adminToken, want: http.StatusBadRequest},
		{method: http.MethodGet, url: "/v1/poison?limit=0", token: adminToken, want: http.StatusBadRequest, request: requestViolates},
		{method: http.MethodGet, url: "/v1/poison?cursor=bm90IGEgY3Vyc29y", token: adminToken, want: http.StatusBadRequest},
		{method: http.MethodGet, url: "/v1/poison", want: http.StatusUnauthorized, request: requestViolates},
		// 404.
		{method: http.MethodGet, url: "/v1/operations/op_aaaaaaaaaaaaaaaaaaaaaaaaaa", token: adminToken, want: http.StatusNotFound},
		{method: http.MethodGet, url: "/v1/routes/no-such-route", token: adminToken, want: http.StatusNotFound},
		{method: http.MethodGet, url: "/metrics", want: http.StatusUnauthorized, request: requestViolates},
	} {
		x.url = e.admin.URL + x.url
		raw := c.do(x)
		if p := decode[map[string]string](t, raw); p["error"] == "" {
			t.Errorf("%s %s: problem without an error: %s", x.method, pathOf(x.url), raw)
		}
	}
}

// Every status of the SNS endpoint, from signed messages of a local SNS
// stand-in, validated against openapi.yaml.
func TestOpenAPISNSAnswers(t *testing.T) {
	t.Parallel()
	sns := authtest.NewSNS(t)
	e := newEnvWith(t, false, snsRouteYAML("orders", "sns_signature", "")+
		snsRouteYAML("raw", "basic", "    raw_delivery: true\n    basic_auth:\n      username_env: SNS_USER\n      password_env: SNS_PASSWORD\n"),
		map[string]string{"GATEWAY_SNS_TRUSTED_URL_PREFIXES": sns.Prefix(), "SNS_USER": "sns", "SNS_PASSWORD": "s3cret-pw"})
	c := &specClient{t: t, v: newSpecValidator(t)}
	post := func(route string, m *brokerauth.SNSMessage, body []byte, want int, extra map[string]string) handlers.AnswerBody {
		t.Helper()
		h := map[string]string{
			"Content-Type": "text/plain; charset=UTF-8", "X-Amz-Sns-Message-Type": m.Type,
			"X-Amz-Sns-Message-Id": m.MessageID, "X-Amz-Sns-Topic-Arn": m.TopicArn,
		}
		for k, v := range extra {
			h[k] = v
		}
		raw := c.do(exchange{method: http.MethodPost, url: e.ingest.URL + "/v1/push/sns/" + route, body: body, header: h, want: want})
		if want == http.StatusNoContent {
			return handlers.AnswerBody{}
		}
		return decode[handlers.AnswerBody](t, raw)
	}
	signed := func(m *brokerauth.SNSMessage) (*brokerauth.SNSMessage, []byte) {
		m = sns.Sign(m, "2")
		return m, authtest.Body(m)
	}
	wantDecision := func(a handlers.AnswerBody, d gate.Decision) {
		t.Helper()
		if a.Decision != d || a.Reason == "" {
			t.Errorf("answer = %+v, want %s with a reason", a, d)
		}
	}

	// 204: a notification's effect, and a confirmed subscription.
	m, body := signed(sns.Notification(ordersTopic, "n-1", `{"order":1}`))
	post("orders", m, body, http.StatusNoContent, nil)
	m, body = signed(sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, ordersTopic, "c-1"))
	post("orders", m, body, http.StatusNoContent, nil)
	// 400: not an SNS message; headers that disagree with the body.
	m, body = signed(sns.Notification(ordersTopic, "n-2", "x"))
	wantDecision(post("orders", m, []byte(`{"Type":"Notification"`), http.StatusBadRequest, nil), gate.Reject)
	wantDecision(post("orders", m, body, http.StatusBadRequest, map[string]string{"X-Amz-Sns-Message-Id": "n-other"}), gate.Reject)
	// 401: a signature that does not verify; basic credentials missing.
	forged := *m
	forged.Message = "tampered"
	wantDecision(post("orders", &forged, authtest.Body(&forged), http.StatusUnauthorized, nil), gate.Reject)
	raw := &brokerauth.SNSMessage{Type: brokerauth.SNSNotification, MessageID: "r-1", TopicArn: ordersTopic}
	rawHeaders := map[string]string{"X-Amz-Sns-Rawdelivery": "true"}
	wantDecision(post("raw", raw, []byte(`{"order":7}`), http.StatusUnauthorized, rawHeaders), gate.Reject)
	// 403: a topic the route does not list, for a notification and a subscription.
	m, body = signed(sns.Notification(otherTopic, "n-3", "x"))
	wantDecision(post("orders", m, body, http.StatusForbidden, nil), gate.Reject)
	m, body = signed(sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, otherTopic, "c-2"))
	wantDecision(post("orders", m, body, http.StatusForbidden, nil), gate.Reject)
	// 413: over the body limit.
	m, body = signed(sns.Notification(ordersTopic, "n-4", strings.Repeat("a", 70<<10)))
	wantDecision(post("orders", m, body, http.StatusRequestEntityTooLarge, nil), gate.Reject)
	// 503: an unknown route, a raw delivery where the route takes none, a
	// downstream failure.
	m, body = signed(sns.Notification(ordersTopic, "n-5", "x"))
	wantDecision(post("no-such-route", m, body, http.StatusServiceUnavailable, nil), gate.Nack)
	wantDecision(post("orders", raw, []byte("raw"), http.StatusServiceUnavailable, rawHeaders), gate.Nack)
	e.down.set(status(http.StatusServiceUnavailable))
	wantDecision(post("orders", m, body, http.StatusServiceUnavailable, nil), gate.Nack)
	e.down.set(nil)
	// 204: a raw delivery with credentials.
	rawHeaders["Authorization"] = basic("sns", "s3cret-pw")
	post("raw", raw, []byte(`{"order":7}`), http.StatusNoContent, rawHeaders)
}

// Pub/Sub push authentication: an OIDC route's 204, 401 and 403, and a
// verification token's 401, validated against openapi.yaml.
func TestOpenAPIPushAuthAnswers(t *testing.T) {
	t.Parallel()
	iss := authtest.NewIssuer(t)
	e := newEnvWith(t, false, oidcRouteYAML(iss.JWKSURL(), "    verification_token_env: ORDERS_PUSH_TOKEN\n"),
		map[string]string{"ORDERS_PUSH_TOKEN": "push-token-0123456789"})
	c := &specClient{t: t, v: newSpecValidator(t)}
	url := e.ingest.URL + "/v1/push/pubsub/orders"
	good := iss.Token(t, iss.Claims(pushAudience, pushAccount))
	other := iss.Claims(pushAudience, pushAccount)
	other["aud"] = "https://gateway.test/v1/push/pubsub/other"
	for _, x := range []exchange{
		// Which credential a push needs depends on its route, so the spec
		// cannot refuse a request without one.
		{url: url + "?token=push-token-0123456789", want: http.StatusUnauthorized},
		{url: url + "?token=push-token-0123456789", header: map[string]string{"Authorization": "Bearer " + iss.Token(t, other)}, want: http.StatusForbidden},
		{url: url + "?token=wrong", header: map[string]string{"Authorization": "Bearer " + good}, want: http.StatusUnauthorized},
		{url: url + "?token=push-token-0123456789", header: map[string]string{"Authorization": "Bearer " + good}, want: http.StatusNoContent},
	} {
		x.method, x.body = http.MethodPost, envelope(msg{ID: "m-auth", Data: "x"})
		raw := c.do(x)
		if x.want != http.StatusNoContent {
			if a := decode[handlers.AnswerBody](t, raw); a.Decision != gate.Reject {
				t.Errorf("%d answer = %+v, want a reject", x.want, a)
			}
		}
	}
}

// brokenStore is an evidence store whose database is down.
type brokenStore struct{}

func (brokenStore) Get(context.Context, string) (*adminapi.Record, error) {
	return nil, errors.New("connection refused")
}

func (brokenStore) List(context.Context, adminapi.ListFilter) ([]gate.Operation, string, error) {
	return nil, "", errors.New("connection refused")
}

// The answers of a gateway whose dependencies are down: readiness and the
// evidence store.
func TestOpenAPIUnavailableAnswers(t *testing.T) {
	t.Parallel()
	c := &specClient{t: t, v: newSpecValidator(t)}
	ingest := httptest.NewServer(handlers.NewIngest(handlers.IngestOptions{
		Ready: func(context.Context) error { return errors.New("postgres: connection refused") },
	}))
	t.Cleanup(ingest.Close)
	admin := httptest.NewServer(handlers.NewAdmin(handlers.AdminOptions{Token: adminToken, Evidence: brokenStore{}}))
	t.Cleanup(admin.Close)

	ready := decode[map[string]string](t, c.do(exchange{method: http.MethodGet, url: ingest.URL + "/readyz", want: http.StatusServiceUnavailable}))
	if ready["status"] != "unavailable" || !strings.Contains(ready["reason"], "postgres") {
		t.Errorf("readyz = %v", ready)
	}
	c.do(exchange{method: http.MethodGet, url: ingest.URL + "/healthz", want: http.StatusOK})
	c.do(exchange{method: http.MethodGet, url: admin.URL + "/v1/operations", token: adminToken, want: http.StatusServiceUnavailable})
	c.do(exchange{method: http.MethodGet, url: admin.URL + "/v1/operations/op_aaaaaaaaaaaaaaaaaaaaaaaaaa", token: adminToken, want: http.StatusServiceUnavailable})
	c.do(exchange{method: http.MethodGet, url: admin.URL + "/v1/routes", token: adminToken, want: http.StatusOK})
	c.do(exchange{method: http.MethodGet, url: admin.URL + "/v1/poison", token: adminToken, want: http.StatusServiceUnavailable})
	// A process built without metrics.
	c.do(exchange{method: http.MethodGet, url: admin.URL + "/metrics", token: adminToken, want: http.StatusNotFound})
}

// The validator must actually refuse answers that break the spec, each
// differing from a valid answer in one point; otherwise the checks above could
// pass vacuously.
func TestOpenAPIValidatorRefusesWrongAnswers(t *testing.T) {
	t.Parallel()
	v := newSpecValidator(t)
	admin := func(path string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "http://localhost:8081"+path, nil)
		r.Header.Set("Authorization", "Bearer "+adminToken)
		return r
	}
	push := func() *http.Request {
		return httptest.NewRequest(http.MethodPost, "http://localhost:8080/v1/push/pubsub/orders", nil)
	}
	answer := func(code int, body string, headers ...string) *http.Response {
		h := http.Header{"Content-Type": {"application/json"}, "X-Content-Type-Options": {"nosniff"}}
		for i := 0; i+1 < len(headers); i += 2 {
			h.Set(headers[i], headers[i+1])
		}
		return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(strings.NewReader(body))}
	}
	const route = `{"name":"orders","tenant":"default","broker":"pubsub","auth":"none","operation_key":{"kind":"message_id"},` +
		`"fingerprint":{"version":1,"data":true},"effect":{"method":"POST","url":"http://d/effects","body_mode":"raw","evidence":"status_only","timeout":"10s",` +
		`"terminal_statuses":[400],"retryable_statuses":[503]},"shape":"idempotent","dedupe_window":"1h0m0s","max_attempts":5,` +
		`"dead_letter":"broker","ack_deadline":"10s","renewal":{"interval":"3s","max_extension":"10s"},"retention":"168h0m0s",` +
		`"contract_version":"0123456789abcdef"}`
	const ops = `{"operations":[{"id":"op_aaaaaaaaaaaaaaaaaaaaaaaaaa","scope_key":"default/orders/message_id:/m-1","tenant":"default",` +
		`"route":"orders","key_source":"message_id","key":"m-1","fingerprint":"v1:aaaaaaaaaaaaaaaaaaaaaaaaaa","fingerprint_version":1,` +
		`"state":"acknowledged","shape":"idempotent","dead_letter_policy":"broker","contract_version":"0123456789abcdef",` +
		`"idempotency_key":"ik_aaaaaaaaaaaaaaaaaaaaaaaaaa","fence":1,"owner":"gw/1","lease_extensions":0,"delivery_count":1,` +
		`"attempt_count":1,"created_at":"2026-01-02T03:04:05.123456Z","updated_at":"2026-01-02T03:04:05.5Z",` +
		`"retain_until":"2026-01-09T03:04:05Z"}],"next_cursor":"abc"}`
	nack := func() *http.Response {
		return answer(503, `{"decision":"nack","reason":"x"}`, "Retry-After", "5")
	}
	for _, tc := range []struct {
		name string
		req  func() *http.Request
		ok   *http.Response
		bad  *http.Response
	}{
		{"route contract: duration as nanoseconds", func() *http.Request { return admin("/v1/routes/orders") },
			answer(200, route), answer(200, strings.Replace(route, `"ack_deadline":"10s"`, `"ack_deadline":10000000000`, 1))},
		{"route contract: unknown shape", func() *http.Request { return admin("/v1/routes/orders") },
			answer(200, route), answer(200, strings.Replace(route, `"shape":"idempotent"`, `"shape":"magic"`, 1))},
		{"route contract: undeclared field", func() *http.Request { return admin("/v1/routes/orders") },
			answer(200, route), answer(200, strings.Replace(route, `"auth":"none"`, `"auth":"none","secret":"x"`, 1))},
		{"route contract: missing required field", func() *http.Request { return admin("/v1/routes/orders") },
			answer(200, route), answer(200, strings.Replace(route, `"max_attempts":5,`, ``, 1))},
		{"operation list: unknown state", func() *http.Request { return admin("/v1/operations") },
			answer(200, ops), answer(200, strings.Replace(ops, `"acknowledged"`, `"done"`, 1))},
		{"operation list: time without a clock", func() *http.Request { return admin("/v1/operations") },
			answer(200, ops), answer(200, strings.Replace(ops, `"2026-01-02T03:04:05.123456Z"`, `"2026-01-02"`, 1))},
		{"operation list: lease_start null", func() *http.Request { return admin("/v1/operations") },
			answer(200, ops), answer(200, strings.Replace(ops, `"fence":1,`, `"fence":1,"lease_start":null,`, 1))},
		{"undocumented status", func() *http.Request { return admin("/v1/routes") },
			answer(401, `{"error":"no"}`, "WWW-Authenticate", `Bearer realm="ackgate-admin"`), answer(500, `{"error":"no"}`)},
		{"401 without its challenge", func() *http.Request { return admin("/v1/routes") },
			answer(401, `{"error":"no"}`, "WWW-Authenticate", `Bearer realm="ackgate-admin"`), answer(401, `{"error":"no"}`)},
		{"problem without error", func() *http.Request { return admin("/v1/routes/x") },
			answer(404, `{"error":"no"}`), answer(404, `{"message":"no"}`)},
		{"nack without Retry-After", push, nack(), answer(503, `{"decision":"nack","reason":"x"}`)},
		{"ack decision in a 503", push, nack(), answer(503, `{"decision":"ack","reason":"x"}`, "Retry-After", "5")},
		{"reject decision in a 404", push, answer(404, `{"decision":"nack"}`), answer(404, `{"decision":"reject"}`)},
		{"readiness with another status word", func() *http.Request { return admin("/readyz") },
			answer(503, `{"status":"unavailable","reason":"x"}`), answer(503, `{"status":"down","reason":"x"}`)},
	} {
		if ok, errs := v.ValidateHttpResponse(tc.req(), tc.ok); !ok {
			t.Errorf("%s: the valid answer is refused:\n%s", tc.name, describe(errs))
		}
		if ok, _ := v.ValidateHttpResponse(tc.req(), tc.bad); ok {
			t.Errorf("%s: accepted, want refused", tc.name)
		}
	}
}
