package recovery_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/internal/wiring"
	"github.com/ackgate/ackgate/storage"
	"github.com/ackgate/ackgate/telemetry"
)

const adminToken = "recovery-test-token-0123"

// provider is the downstream of the tests' routes: it applies effects by
// idempotency key, loses responses on demand, and answers lookups by key,
// counting every lookup and how many of one key run at the same time.
type provider struct {
	srv *httptest.Server

	// drop: 0 answers, 1 applies the effect and then cuts the connection,
	// 2 cuts it without applying anything.
	drop atomic.Int32
	// fail, when set, is the status every effect call answers, applying
	// nothing.
	fail atomic.Int32
	// lookupUp: false answers every lookup 503 (the lookup is down).
	lookupUp    atomic.Bool
	lookupDelay time.Duration
	// stuck keys' lookups stay down whatever lookupUp says.
	stuck sync.Map

	mu          sync.Mutex
	effects     map[string]string // idempotency key -> result id
	calls       map[string]int    // effect calls per key
	lookups     map[string]int    // lookups per key
	inflight    map[string]int
	maxInflight int
}

const (
	answerAll = iota
	dropAfterApply
	dropBeforeApply
)

func newProvider(t *testing.T, lookupDelay time.Duration) *provider {
	p := &provider{effects: map[string]string{}, calls: map[string]int{}, lookups: map[string]int{},
		inflight: map[string]int{}, lookupDelay: lookupDelay}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /effects", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		if code := p.fail.Load(); code != 0 {
			w.WriteHeader(int(code))
			return
		}
		drop := p.drop.Load()
		p.mu.Lock()
		p.calls[key]++
		if drop != dropBeforeApply && p.effects[key] == "" {
			p.effects[key] = fmt.Sprintf("res-%d", len(p.effects)+1)
		}
		id := p.effects[key]
		p.mu.Unlock()
		if drop != answerAll {
			cut(w)
			return
		}
		w.Header().Set("X-Result-Id", id)
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("GET /effects/{key}", func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		p.mu.Lock()
		p.lookups[key]++
		p.inflight[key]++
		p.maxInflight = max(p.maxInflight, p.inflight[key])
		id := p.effects[key]
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			p.inflight[key]--
			p.mu.Unlock()
		}()
		if p.lookupDelay > 0 {
			time.Sleep(p.lookupDelay)
		}
		_, stuck := p.stuck.Load(key)
		switch {
		case !p.lookupUp.Load() || stuck:
			w.WriteHeader(http.StatusServiceUnavailable)
		case id == "":
			w.WriteHeader(http.StatusNotFound)
		default:
			w.Header().Set("X-Result-Id", id)
			w.WriteHeader(http.StatusOK)
		}
	})
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

// cut closes the connection without a response: the caller cannot tell
// whether the effect happened.
func cut(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

func (p *provider) counts(key string) (calls, lookups int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[key], p.lookups[key]
}

// routesFor is a lookup route (pay) and an unsafe one (mail) on p, with
// the shortest reconcile interval and a pace no test waits on.
func routesFor(p *provider) string {
	return fmt.Sprintf(`routes:
  - name: pay
    broker: pubsub
    auth: none
    shape: lookup
    effect:
      url: %[1]s/effects
      timeout: 3s
      result_id_header: X-Result-Id
      lookup_url: %[1]s/effects/{key}
    reconcile:
      interval: 1s
      max_interval: 4s
      rate_per_second: 500
  - name: mail
    broker: pubsub
    auth: none
    shape: unsafe
    effect:
      url: %[1]s/effects
      timeout: 3s
      result_id_header: X-Result-Id
`, p.srv.URL)
}

// replica is one gateway as serve builds it, on a shared ledger and Redis.
type replica struct {
	gw     *wiring.Gateway
	ingest *httptest.Server
	admin  *httptest.Server
}

// cluster is a ledger, a Redis and the replicas that share them.
type cluster struct {
	dbURL, redisAddr string
	pool             *pgxpool.Pool
	rdb              *redis.Client
	replicas         []*replica
}

func newCluster(t *testing.T, n int, routes string, env map[string]string) *cluster {
	t.Helper()
	ctx := context.Background()
	c := &cluster{dbURL: testenv.DatabaseURL(t), redisAddr: testenv.Redis(t)}
	if err := storage.Migrate(ctx, c.dbURL); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		vars := map[string]string{
			"GATEWAY_DATABASE_URL": c.dbURL, "GATEWAY_REDIS_URL": "redis://" + c.redisAddr,
			"GATEWAY_ADMIN_TOKEN": adminToken, "GATEWAY_INSTANCE_ID": fmt.Sprintf("replica-%d", i),
			"GATEWAY_RECONCILE_POLL": "100ms",
		}
		for k, v := range env {
			vars[k] = v
		}
		getenv := func(k string) string { return vars[k] }
		s, err := config.LoadSettings(getenv)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := config.ParseRoutes([]byte(routes))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.CheckRoutes(rs); err != nil {
			t.Fatal(err)
		}
		tel, err := telemetry.WithPrometheus(sdktrace.NewTracerProvider(), resource.Empty())
		if err != nil {
			t.Fatal(err)
		}
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		gw, err := wiring.New(ctx, wiring.Options{Settings: s, Routes: rs, Getenv: getenv, Telemetry: tel, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(gw.Close)
		r := &replica{gw: gw, ingest: httptest.NewServer(gw.Ingest), admin: httptest.NewServer(gw.Admin)}
		t.Cleanup(r.ingest.Close)
		t.Cleanup(r.admin.Close)
		c.replicas = append(c.replicas, r)
	}
	pool, err := pgxpool.New(ctx, c.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c.pool = pool
	c.rdb = redis.NewClient(&redis.Options{Addr: c.redisAddr})
	t.Cleanup(func() { c.rdb.Close() })
	return c
}

// push delivers a Pub/Sub message to route on replica r and returns the
// status.
func (r *replica) push(t *testing.T, route, id, data string) int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"message":      map[string]any{"data": base64.StdEncoding.EncodeToString([]byte(data)), "messageId": id},
		"subscription": "projects/p/subscriptions/s",
	})
	resp, err := http.Post(r.ingest.URL+"/v1/push/pubsub/"+route, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("push %s: %v", id, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// scrape reads /metrics from replica r's admin listener.
func (r *replica) scrape(t *testing.T) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, r.admin.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, b)
	}
	return string(b)
}

// sample is the value of the series name{labels...}, and whether it is there.
func sample(text, name string, labels map[string]string) (string, bool) {
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		end := strings.LastIndex(line, "}")
		set := "," + line[len(name)+1:end] + ","
		ok := true
		for k, v := range labels {
			ok = ok && strings.Contains(set, fmt.Sprintf(",%s=%q,", k, v))
		}
		if ok {
			return strings.TrimSpace(line[end+1:]), true
		}
	}
	return "", false
}

// op is what the tests read back about an operation.
type op struct {
	ID, State, Key string
	Fence          int64
	Attempts       int
	Grant, Checks  int
	NextCheck      *time.Time
	Updated        time.Time
}

func (c *cluster) op(t *testing.T, route, messageID string) op {
	t.Helper()
	var o op
	err := c.pool.QueryRow(context.Background(), `
		SELECT o.id, o.state::text, o.idempotency_key, o.fence, o.attempt_count, o.grant_through, o.checks,
			o.next_check_at, o.updated_at
		FROM operations o WHERE o.route = $1 AND o.conflict_of IS NULL AND (o.message_id = $2 OR o.id IN
			(SELECT operation_id FROM deliveries WHERE message_id = $2))`, route, messageID).
		Scan(&o.ID, &o.State, &o.Key, &o.Fence, &o.Attempts, &o.Grant, &o.Checks, &o.NextCheck, &o.Updated)
	if err != nil {
		t.Fatalf("operation of %s/%s: %v", route, messageID, err)
	}
	return o
}

// attempts lists an operation's attempts as kind:outcome:key, as its
// evidence record shows them.
func (c *cluster) attempts(t *testing.T, id string) []string {
	t.Helper()
	rec, err := storage.NewLedger(c.pool).Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range rec.Attempts {
		out = append(out, string(a.Kind)+":"+string(a.Outcome)+":"+a.IdempotencyKey)
	}
	return out
}

func (c *cluster) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := c.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// expire moves the retention of operations ids (with their conflict
// records when conflictsToo) into the past, as time would: retain_until is
// not part of an operation's identity, so the ledger lets it change.
func (c *cluster) expire(t *testing.T, ids []string, conflictsToo bool) {
	t.Helper()
	if _, err := c.pool.Exec(context.Background(), `UPDATE operations SET retain_until = now() - interval '1 day'
		WHERE id = ANY($1) OR ($2 AND conflict_of = ANY($1))`, ids, conflictsToo); err != nil {
		t.Fatal(err)
	}
}

// sampleBare is the value of a series that has only the scope's labels.
func sampleBare(text, name string) (string, bool) {
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
			return strings.TrimSpace(line[strings.LastIndex(line, " "):]), true
		}
	}
	return "", false
}
