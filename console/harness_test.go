package console_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/internal/wiring"
	"github.com/ackgate/ackgate/storage"
	"github.com/ackgate/ackgate/telemetry"
)

const (
	adminToken   = "console-test-admin-token-0123"
	metricsToken = "console-test-metrics-token-456"
	traceURL     = "https://traces.example/trace/{trace_id}"
	// operatorTokens are the named credentials of the test gateway; each
	// operator logs in with tokenOf(name).
	operatorTokens = "alice=alice-console-token-0123,bob=bob-console-token-0123,carol=carol-console-token-0123"
)

func tokenOf(name string) string { return name + "-console-token-0123" }

// downstream is a real effect server: the "orders" route's effects succeed
// with a result id; the "payments" route's are applied and then the
// connection is cut, so their result is lost and, the route being unsafe,
// the operation is indeterminate at once.
type downstream struct {
	srv *httptest.Server
	mu  sync.Mutex
	n   int
}

func newDownstream(t testing.TB) *downstream {
	d := &downstream{}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		d.mu.Lock()
		d.n++
		id := fmt.Sprintf("res-%d", d.n)
		d.mu.Unlock()
		if strings.HasSuffix(r.URL.Path, "/lost") {
			hj, ok := w.(http.Hijacker)
			if !ok {
				panic("no hijacker")
			}
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		w.Header().Set("X-Result-Id", id)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(d.srv.Close)
	return d
}

const routesYAML = `routes:
  - name: orders
    broker: pubsub
    auth: none
    shape: idempotent
    dedupe_window: 1h
    dead_letter: gateway
    effect:
      url: {{DOWN}}/effects/ok
      result_id_header: X-Result-Id
  - name: payments
    broker: pubsub
    auth: none
    shape: unsafe
    dead_letter: gateway
    effect:
      url: {{DOWN}}/effects/lost
      result_id_header: X-Result-Id
      headers:
        Authorization: Bearer downstream-credential-never-shown
  - name: shipments
    broker: pubsub
    auth: none
    shape: handoff
    dead_letter: gateway
    handoff:
      retry_min: 1s
      retry_max: 1m
    effect:
      url: {{DOWN}}/effects/ok
      result_id_header: X-Result-Id
  - name: refunds
    broker: pubsub
    auth: none
    shape: unsafe
    dead_letter: gateway
    operation_key: {kind: attribute, name: customer_email}
    private: [customer_email]
    effect:
      url: {{DOWN}}/effects/ok
      result_id_header: X-Result-Id
`

// keyHashSecret keys the hash of the refunds route's private keys.
const keyHashSecret = "console-test-key-hash-secret-0123456789"

// env is a gateway built by package wiring, as `gateway serve` builds it,
// on a fresh database and a private Redis.
type env struct {
	t         testing.TB
	environ   map[string]string
	routeList []*gate.Route
	gw        *wiring.Gateway
	tel       *telemetry.Telemetry
	ledger    *storage.Ledger
	routes    map[string]*gate.Route
	ingest    *httptest.Server
	admin     *httptest.Server
}

func newEnv(t testing.TB, vars map[string]string) *env {
	t.Helper()
	ctx := context.Background()
	tel, err := telemetry.WithPrometheus(sdktrace.NewTracerProvider(), resource.Empty())
	if err != nil {
		t.Fatal(err)
	}
	down := newDownstream(t)
	dbURL := testenv.DatabaseURL(t)
	if err := storage.Migrate(ctx, dbURL); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	environ := map[string]string{
		"GATEWAY_DATABASE_URL":      dbURL,
		"GATEWAY_REDIS_URL":         "redis://" + testenv.Redis(t),
		"GATEWAY_ADMIN_TOKEN":       adminToken,
		"GATEWAY_ADMIN_TOKENS":      operatorTokens,
		"GATEWAY_METRICS_TOKEN":     metricsToken,
		"GATEWAY_INSTANCE_ID":       "console-test",
		"GATEWAY_CONSOLE_TRACE_URL": traceURL,
		"GATEWAY_KEY_HASH_SECRET":   keyHashSecret,
	}
	maps.Copy(environ, vars)
	getenv := func(k string) string { return environ[k] }
	settings, err := config.LoadSettings(getenv)
	if err != nil {
		t.Fatalf("settings: %v", err)
	}
	routes, err := config.ParseRoutes([]byte(strings.ReplaceAll(routesYAML, "{{DOWN}}", down.srv.URL)))
	if err != nil {
		t.Fatalf("routes: %v", err)
	}
	e := &env{t: t, environ: environ, routeList: routes, routes: map[string]*gate.Route{}}
	for _, r := range routes {
		e.routes[r.Name] = r
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	gw, err := wiring.New(ctx, wiring.Options{Settings: settings, Routes: routes, Getenv: getenv, Logger: log, Telemetry: tel})
	if err != nil {
		t.Fatalf("wiring: %v", err)
	}
	t.Cleanup(gw.Close)
	e.gw, e.ledger, e.tel = gw, gw.Ledger, tel
	e.ingest = httptest.NewServer(gw.Ingest)
	t.Cleanup(e.ingest.Close)
	e.admin = httptest.NewServer(gw.Admin)
	t.Cleanup(e.admin.Close)
	return e
}

// metrics is what a scrape of the gateway's metrics reads, taken from the
// handler itself: a scrape over the admin listener is subject to the
// credential limits a test may have spent.
func (e *env) metrics() string {
	e.t.Helper()
	rec := httptest.NewRecorder()
	e.tel.MetricsHandler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}

// replica builds a second gateway on e's database and Redis, with vars
// over e's settings, and serves its admin listener: another replica of the
// same deployment, or the same one after a configuration change.
func (e *env) replica(vars map[string]string) *httptest.Server {
	e.t.Helper()
	environ := maps.Clone(e.environ)
	maps.Copy(environ, vars)
	getenv := func(k string) string { return environ[k] }
	settings, err := config.LoadSettings(getenv)
	if err != nil {
		e.t.Fatalf("settings: %v", err)
	}
	tel, err := telemetry.WithPrometheus(sdktrace.NewTracerProvider(), resource.Empty())
	if err != nil {
		e.t.Fatal(err)
	}
	gw, err := wiring.New(context.Background(), wiring.Options{Settings: settings, Routes: e.routeList, Getenv: getenv,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Telemetry: tel})
	if err != nil {
		e.t.Fatalf("wiring: %v", err)
	}
	e.t.Cleanup(gw.Close)
	srv := httptest.NewServer(gw.Admin)
	e.t.Cleanup(srv.Close)
	return srv
}

// push sends a Pub/Sub push envelope and returns the operation id the
// gateway derives for it, and the status.
func (e *env) push(route, messageID, data string, attrs map[string]string) (string, int) {
	e.t.Helper()
	sub := "projects/p/subscriptions/" + route
	body, _ := json.Marshal(map[string]any{
		"message": map[string]any{
			"data": base64.StdEncoding.EncodeToString([]byte(data)), "attributes": attrs,
			"messageId": messageID, "publishTime": time.Now().UTC().Format(time.RFC3339Nano),
		},
		"subscription": sub,
	})
	resp, err := http.Post(e.ingest.URL+"/v1/push/pubsub/"+route, "application/json", bytes.NewReader(body))
	if err != nil {
		e.t.Fatalf("push: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	r := e.routes[route]
	id, err := gate.Identify(r, &gate.Message{Broker: r.Broker, Source: sub, MessageID: messageID, Data: []byte(data), Attributes: attrs})
	if err != nil {
		e.t.Fatalf("identify: %v", err)
	}
	return id.OperationID, resp.StatusCode
}

func (e *env) record(id string) *adminapi.Record {
	e.t.Helper()
	rec, err := e.ledger.Get(context.Background(), id)
	if err != nil {
		e.t.Fatalf("get %s: %v", id, err)
	}
	return rec
}

// waitState waits for post-ack bookkeeping, which follows the response.
func (e *env) waitState(id string, want gate.State) *adminapi.Record {
	e.t.Helper()
	var rec *adminapi.Record
	testenv.Eventually(e.t, 10*time.Second, func() bool { rec = e.record(id); return rec.Operation.State == want },
		func() string { return fmt.Sprintf("operation %s stayed %s, want %s", id, rec.Operation.State, want) })
	return rec
}

// indeterminate pushes a payments message, whose result is lost.
func (e *env) indeterminate(messageID string) string {
	e.t.Helper()
	id, status := e.push("payments", messageID, `{"amount": 1200, "card": "4111-SECRET"}`, map[string]string{"event_type": "charge"})
	if status != http.StatusServiceUnavailable {
		e.t.Fatalf("lost response answered %d, want 503", status)
	}
	e.waitState(id, gate.StateEffectIndeterminate)
	return id
}

// pushPoison pushes a message with no usable identity to route (a route
// keyed on an attribute it lacks), which the gateway keeps as poison.
func (e *env) pushPoison(route, messageID string) {
	e.t.Helper()
	body, _ := json.Marshal(map[string]any{
		"message":      map[string]any{"data": base64.StdEncoding.EncodeToString([]byte(`{}`)), "messageId": messageID},
		"subscription": "projects/p/subscriptions/" + route,
	})
	resp, err := http.Post(e.ingest.URL+"/v1/push/pubsub/"+route, "application/json", bytes.NewReader(body))
	if err != nil {
		e.t.Fatalf("push: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// handedOff pushes a shipments message: committed with its outbox entry
// and acked. No relay runs in these tests, so the entry waits.
func (e *env) handedOff(messageID string) string {
	e.t.Helper()
	id, status := e.push("shipments", messageID, `{"parcel": 7}`, map[string]string{"event_type": "ship"})
	if status != http.StatusNoContent {
		e.t.Fatalf("shipments push answered %d, want 204", status)
	}
	e.waitState(id, gate.StatePendingEffect)
	return id
}

// confirmed pushes an orders message, which the downstream applies.
func (e *env) confirmed(messageID string) string {
	e.t.Helper()
	id, status := e.push("orders", messageID, `{"order": 42, "note": "SECRET-PAYLOAD-77"}`, map[string]string{"event_type": "created"})
	if status != http.StatusNoContent {
		e.t.Fatalf("orders push answered %d, want 204", status)
	}
	e.waitState(id, gate.StateAcknowledged)
	return id
}
