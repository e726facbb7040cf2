package handlers_test

import (
	"bufio"
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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/handlers"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/internal/wiring"
	"github.com/ackgate/ackgate/storage"
	"github.com/ackgate/ackgate/telemetry"
)

// clock is the gate's injected clock; tests move it to cross a dedupe window
// without waiting.
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off += d
}

// effectServer is a real downstream over HTTP whose behaviour each test
// programs. It keeps what a provider would: the effects it applied, by key.
type effectServer struct {
	t   testing.TB
	srv *httptest.Server

	mu sync.Mutex
	// dedupe makes it honour Idempotency-Key like a well-behaved provider;
	// without it every call applies a new effect (an unsafe downstream).
	dedupe  bool
	effects map[string]string // idempotency key -> result id
	applied int               // effects actually applied
	keys    []string          // Idempotency-Key of every effect call, in order
	fences  []string
	// next decides what the next effect calls do; nil means apply and answer 201.
	behave      func(w http.ResponseWriter, r *http.Request, apply func() string)
	lookupDown  bool
	lookupCalls atomic.Int64
	effectCalls atomic.Int64
	// spans are the downstream's own server spans.
	spans *tracetest.InMemoryExporter
}

func newEffectServer(t testing.TB, dedupe bool) *effectServer {
	e := &effectServer{t: t, dedupe: dedupe, effects: map[string]string{}, spans: tracetest.NewInMemoryExporter()}
	r := chi.NewRouter()
	r.Post("/effects", e.handleEffect)
	r.Get("/effects/{key}", e.handleLookup)
	// The downstream is instrumented on its own, as a real service would be:
	// its spans join the gateway's trace only through the traceparent header.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(e.spans))
	e.srv = httptest.NewServer(otelhttp.NewHandler(r, "downstream",
		otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagation.TraceContext{})))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *effectServer) URL() string { return e.srv.URL }

func (e *effectServer) handleEffect(w http.ResponseWriter, r *http.Request) {
	e.effectCalls.Add(1)
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	e.mu.Lock()
	e.keys = append(e.keys, key)
	e.fences = append(e.fences, r.Header.Get("X-Ackgate-Fence"))
	behave := e.behave
	e.mu.Unlock()
	apply := func() string {
		e.mu.Lock()
		defer e.mu.Unlock()
		if id, ok := e.effects[key]; ok && e.dedupe {
			return id
		}
		e.applied++
		id := fmt.Sprintf("res-%d", e.applied)
		e.effects[key] = id
		return id
	}
	if behave != nil {
		behave(w, r, apply)
		return
	}
	answer(w, apply())
}

func answer(w http.ResponseWriter, id string) {
	w.Header().Set("X-Result-Id", id)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q}`, id)
}

// dropAfterApply applies the effect and then cuts the connection without an
// answer: the response is lost after the effect happened.
func dropAfterApply(w http.ResponseWriter, _ *http.Request, apply func() string) {
	apply()
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("no hijacker")
	}
	conn, _, err := hj.Hijack()
	if err == nil {
		conn.Close()
	}
}

func status(code int) func(http.ResponseWriter, *http.Request, func() string) {
	return func(w http.ResponseWriter, _ *http.Request, _ func() string) {
		w.WriteHeader(code)
	}
}

func (e *effectServer) handleLookup(w http.ResponseWriter, r *http.Request) {
	e.lookupCalls.Add(1)
	e.mu.Lock()
	down := e.lookupDown
	id, ok := e.effects[chi.URLParam(r, "key")]
	e.mu.Unlock()
	switch {
	case down:
		w.WriteHeader(http.StatusServiceUnavailable)
	case ok:
		w.Header().Set("X-Result-Id", id)
		w.WriteHeader(http.StatusOK)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func (e *effectServer) set(f func(http.ResponseWriter, *http.Request, func() string)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.behave = f
}

func (e *effectServer) Applied() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.applied
}

func (e *effectServer) Fences() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.fences...)
}

func (e *effectServer) Keys() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.keys...)
}

// env is one gateway, built by the same constructor as `gateway serve`
// (package wiring), on a fresh Postgres database, a private Redis and a real
// downstream server.
type env struct {
	t      testing.TB
	dbURL  string
	gw     *wiring.Gateway
	pool   *pgxpool.Pool
	ledger *storage.Ledger
	rdb    redis.UniversalClient
	down   *effectServer
	gate   *gate.Gate
	clock  *clock
	routes map[string]*gate.Route
	ingest *httptest.Server
	admin  *httptest.Server
	tel    *telemetry.Telemetry
	spans  *tracetest.InMemoryExporter
	logs   *testenv.SyncBuffer
	// environ, settings and log are what the gateway was built with, so
	// rewire can build its successor on the same database and Redis.
	environ  map[string]string
	settings config.Settings
	log      *slog.Logger
	// returned holds, per request a test numbered (settleHeader), a channel
	// closed when its handler has returned, so settle knows the delivery
	// has handed over its post-response work.
	returned sync.Map
	requests atomic.Int64
}

// settleHeader numbers a test's request for settle.
const settleHeader = "X-Test-Request"

const adminToken = "test-admin-token-0123456789"

// operators have named admin credentials besides admin: what one resolves
// is recorded as "api:" + name (operatorToken gives the token).
var operators = []string{"alice", "bob", "carol", "dave", "erin", "frank", "gina", "hank", "ivy", "jane"}

func operatorToken(name string) string { return name + "-operator-token-0123456789" }

func operatorTokens() string {
	var items []string
	for _, n := range operators {
		items = append(items, n+"="+operatorToken(n))
	}
	return strings.Join(items, ",")
}

// routeYAML renders one route through the real config loader, so tests run
// with the same defaults and validation as the gateway. extra holds more
// route-level lines (four-space indent).
func routeYAML(name, shape, deadLetter, extra string) string {
	if shape == "idempotent" {
		extra += "    dedupe_window: 1h\n"
	}
	s := fmt.Sprintf(`
  - name: %s
    broker: pubsub
    auth: none
    shape: %s
    dead_letter: %s
%s    effect:
      url: {{DOWN}}/effects
      result_id_header: X-Result-Id
`, name, shape, deadLetter, extra)
	if shape == "lookup" {
		s += "      lookup_url: {{DOWN}}/effects/{key}\n"
	}
	return s
}

func newEnv(t testing.TB, dedupe bool, routesYAML string) *env {
	t.Helper()
	return newEnvWith(t, dedupe, routesYAML, nil)
}

// newEnvWith is newEnv with more environment for the gateway: GATEWAY_*
// settings, and the secrets its routes name.
func newEnvWith(t testing.TB, dedupe bool, routesYAML string, vars map[string]string) *env {
	t.Helper()
	return newEnvSampled(t, dedupe, routesYAML, vars, nil)
}

// newEnvSampled is newEnvWith with the tracer provider's sampler; nil keeps
// the SDK's default, which records every delivery.
func newEnvSampled(t testing.TB, dedupe bool, routesYAML string, vars map[string]string, sampler sdktrace.Sampler) *env {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	// Every test gateway is fully instrumented: spans into memory, metrics
	// into a Prometheus registry, JSON logs into a buffer.
	topts := []sdktrace.TracerProviderOption{sdktrace.WithSyncer(spans)}
	if sampler != nil {
		topts = append(topts, sdktrace.WithSampler(sampler))
	}
	return newEnvTraced(t, dedupe, routesYAML, vars, sdktrace.NewTracerProvider(topts...), spans)
}

// newEnvTraced is newEnvSampled with a tracer provider of the caller's;
// spans is where that provider's spans go, if anywhere.
func newEnvTraced(t testing.TB, dedupe bool, routesYAML string, vars map[string]string, tp trace.TracerProvider, spans *tracetest.InMemoryExporter) *env {
	t.Helper()
	ctx := context.Background()
	e := &env{t: t, clock: &clock{}, spans: spans, logs: &testenv.SyncBuffer{}}
	tel, err := telemetry.WithPrometheus(tp, resource.Empty())
	if err != nil {
		t.Fatal(err)
	}
	e.tel = tel
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})))

	e.down = newEffectServer(t, dedupe)
	e.dbURL = testenv.DatabaseURL(t)
	if err := storage.Migrate(ctx, e.dbURL); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	environ := map[string]string{
		"GATEWAY_DATABASE_URL":   e.dbURL,
		"GATEWAY_REDIS_URL":      "redis://" + testenv.Redis(t),
		"GATEWAY_ADMIN_TOKEN":    adminToken,
		"GATEWAY_ADMIN_TOKENS":   operatorTokens(),
		"GATEWAY_MAX_BODY_BYTES": "65536",
		"GATEWAY_INSTANCE_ID":    "test",
	}
	maps.Copy(environ, vars)
	getenv := func(k string) string { return environ[k] }
	settings, err := config.LoadSettings(getenv)
	if err != nil {
		t.Fatalf("settings: %v", err)
	}

	e.environ, e.settings, e.log = environ, settings, log
	e.wire(routesYAML)
	return e
}

// wire builds the gateway for routesYAML, as `gateway serve` would, with
// its ingest and admin listeners.
func (e *env) wire(routesYAML string) {
	t := e.t
	t.Helper()
	ctx := context.Background()
	getenv := func(k string) string { return e.environ[k] }
	yaml := strings.ReplaceAll("routes:\n"+routesYAML, "{{DOWN}}", e.down.URL())
	routes, err := config.ParseRoutes([]byte(yaml))
	if err != nil {
		t.Fatalf("routes: %v\n%s", err, yaml)
	}
	e.routes = map[string]*gate.Route{}
	for _, r := range routes {
		e.routes[r.Name] = r
	}
	gw, err := wiring.New(ctx, wiring.Options{
		Settings: e.settings, Routes: routes, Getenv: getenv, Logger: e.log, Telemetry: e.tel, Now: e.clock.Now,
	})
	if err != nil {
		t.Fatalf("wiring: %v", err)
	}
	t.Cleanup(gw.Close)
	e.gw, e.pool, e.ledger, e.rdb, e.gate = gw, gw.Pool, gw.Ledger, gw.Redis, gw.Gate
	e.ingest = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := r.Header.Get(settleHeader); n != "" {
			done, _ := e.returned.LoadOrStore(n, make(chan struct{}))
			defer close(done.(chan struct{}))
		}
		gw.Ingest.ServeHTTP(w, r)
	}))
	t.Cleanup(e.ingest.Close)
	e.admin = httptest.NewServer(gw.Admin)
	t.Cleanup(e.admin.Close)
}

// rewire stops the gateway and starts its successor on the same database
// and Redis with routesYAML, as a deploy of a changed routes file does:
// operations begun under the old contracts are delivered under the new.
func (e *env) rewire(routesYAML string) {
	e.t.Helper()
	e.ingest.Close()
	e.admin.Close()
	e.gw.Close()
	e.wire(routesYAML)
}

// msg is a Pub/Sub message as a test writes it.
type msg struct {
	ID    string
	Data  string
	Attrs map[string]string
	Sub   string
}

func envelope(m msg) []byte {
	sub := m.Sub
	if sub == "" {
		sub = "projects/p/subscriptions/s"
	}
	b, _ := json.Marshal(map[string]any{
		"message": map[string]any{
			"data": base64.StdEncoding.EncodeToString([]byte(m.Data)), "attributes": m.Attrs,
			"messageId": m.ID, "publishTime": time.Now().UTC().Format(time.RFC3339Nano),
		},
		"subscription": sub,
	})
	return b
}

type reply struct {
	Status int
	Body   handlers.AnswerBody
	Raw    string
}

// settle waits until request n's handler has returned and the work queued
// after the answers so far is done (ack marks, lease releases), which runs
// in the background: a broker's redelivery comes later than a test's next
// line, so a push returns once its delivery's bookkeeping is done.
func (e *env) settle(n string) {
	e.t.Helper()
	done, _ := e.returned.LoadOrStore(n, make(chan struct{}))
	defer e.returned.Delete(n)
	deadline := time.Now().Add(30 * time.Second)
	select {
	case <-done.(chan struct{}):
	case <-time.After(30 * time.Second):
		e.t.Fatalf("request %s's handler has not returned after 30s", n)
	}
	for e.gw.After.Pending() > 0 {
		if time.Now().After(deadline) {
			e.t.Fatalf("post-response work not done after 30s: %d results queued", e.gw.After.Pending())
		}
		time.Sleep(time.Millisecond)
	}
}

func (e *env) pushRaw(route string, body []byte) reply {
	e.t.Helper()
	return e.pushHeaders(route, body, nil)
}

// pushHeaders is pushRaw with more request headers, such as the traceparent
// a broker's push request carries.
func (e *env) pushHeaders(route string, body []byte, headers map[string]string) reply {
	e.t.Helper()
	n := strconv.FormatInt(e.requests.Add(1), 10)
	req, err := http.NewRequest(http.MethodPost, e.ingest.URL+"/v1/push/pubsub/"+route, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	req.Header.Set(settleHeader, n)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("push: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	e.settle(n)
	r := reply{Status: resp.StatusCode, Raw: string(raw)}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.Body); err != nil {
			e.t.Fatalf("answer is not JSON: %q", raw)
		}
	}
	return r
}

func (e *env) push(route string, m msg) reply {
	e.t.Helper()
	return e.pushRaw(route, envelope(m))
}

// opID is the operation id the gateway derives for m on route.
func (e *env) opID(route string, m msg) string {
	e.t.Helper()
	r := e.routes[route]
	id, err := gate.Identify(r, &gate.Message{Broker: r.Broker, Source: m.Sub, MessageID: m.ID, Data: []byte(m.Data), Attributes: m.Attrs})
	if err != nil {
		e.t.Fatalf("identify: %v", err)
	}
	return id.OperationID
}

func (e *env) record(id string) *adminapi.Record {
	e.t.Helper()
	rec, err := e.ledger.Get(context.Background(), id)
	if err != nil {
		e.t.Fatalf("get %s: %v", id, err)
	}
	return rec
}

// waitState polls the ledger until the operation reaches want: post-ack
// bookkeeping runs after the response, so tests wait for it instead of
// assuming it already happened.
func (e *env) waitState(id string, want gate.State) *adminapi.Record {
	e.t.Helper()
	var rec *adminapi.Record
	testenv.Eventually(e.t, 10*time.Second, func() bool { rec = e.record(id); return rec.Operation.State == want },
		func() string { return fmt.Sprintf("operation %s stayed %s, want %s", id, rec.Operation.State, want) })
	return rec
}

func (e *env) adminGet(path string, v any) int {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.admin.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("admin get: %v", err)
	}
	defer resp.Body.Close()
	if v != nil {
		if err := json.NewDecoder(bufio.NewReader(resp.Body)).Decode(v); err != nil {
			e.t.Fatalf("admin %s: decode: %v", path, err)
		}
	}
	return resp.StatusCode
}

func states(rec *adminapi.Record) []gate.State {
	var out []gate.State
	for _, ev := range rec.Events {
		out = append(out, ev.To)
	}
	return out
}

func wantStatus(t *testing.T, r reply, want int) {
	t.Helper()
	if r.Status != want {
		t.Fatalf("status = %d (%s), want %d", r.Status, r.Raw, want)
	}
}
