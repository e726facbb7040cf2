package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
)

// heldSink is the downstream of the relay tests: it applies each effect
// once per idempotency key, then holds its answer until released, so the
// test can kill the gateway while the effect exists and its answer has not
// reached the gateway. It answers lookups by key.
type heldSink struct {
	srv     *httptest.Server
	arrived chan string
	release chan struct{}
	once    sync.Once

	mu      sync.Mutex
	effects map[string]string
	calls   map[string]int
	lookups map[string]int
}

func newHeldSink(t *testing.T) *heldSink {
	s := &heldSink{arrived: make(chan string, 100), release: make(chan struct{}), effects: map[string]string{},
		calls: map[string]int{}, lookups: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /effects", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		s.mu.Lock()
		s.calls[key]++
		if s.effects[key] == "" {
			s.effects[key] = fmt.Sprintf("res-%d", len(s.effects)+1)
		}
		id := s.effects[key]
		s.mu.Unlock()
		s.arrived <- key
		select {
		case <-s.release:
		case <-r.Context().Done(): // the caller is gone
			return
		}
		w.Header().Set("X-Result-Id", id)
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("GET /effects/{key}", func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		s.mu.Lock()
		s.lookups[key]++
		id := s.effects[key]
		s.mu.Unlock()
		if id == "" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.Header().Set("X-Result-Id", id)
		w.WriteHeader(http.StatusOK)
	})
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	t.Cleanup(s.open)
	return s
}

// open lets every held and later call answer at once.
func (s *heldSink) open() { s.once.Do(func() { close(s.release) }) }

func (s *heldSink) counts(key string) (effects, calls, lookups int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.effects[key] != "" {
		effects = 1
	}
	return effects, s.calls[key], s.lookups[key]
}

// gatewayProc is a `gateway serve` process the test may SIGKILL.
type gatewayProc struct {
	cmd  *exec.Cmd
	logs *testenv.SyncBuffer
	done chan struct{}
}

func startProc(t *testing.T, bin string, env gatewayEnv, name string) *gatewayProc {
	t.Helper()
	p := &gatewayProc{cmd: exec.Command(bin, "serve"), logs: &testenv.SyncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = env.list()
	p.cmd.Stderr = p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		<-p.done
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, p.logs.String())
		}
	})
	waitReady(t, env["GATEWAY_LISTEN_ADDR"])
	return p
}

func (p *gatewayProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

// The failure-matrix row "publish an outbox item, then crash before
// marking it sent", on a real `gateway serve`. The relay sends each entry;
// the downstream applies the effect and holds its answer; the gateway is
// SIGKILLed then, with the operations' evidence not yet recorded. After a
// restart the relay reconciles before it sends again: the lookup route
// asks its lookup and is confirmed by its answer (the transition's reason
// says so; no second call), the idempotent route
// retries under the same key inside its dedupe window. The downstream
// holds one effect of each, and the record shows the reconciliation.
func TestPublishOutboxItemThenCrashBeforeMarkingSent(t *testing.T) {
	t.Parallel()
	bin := buildGateway(t)
	s := newHeldSink(t)
	dbURL, redisAddr := testenv.DatabaseURL(t), testenv.Redis(t)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	yaml := fmt.Sprintf(`routes:
  - name: ship
    broker: pubsub
    auth: none
    shape: handoff
    dedupe_window: 1h
    dead_letter: gateway
    effect:
      url: %[1]s/effects
      timeout: 2s
      result_id_header: X-Result-Id
  - name: post
    broker: pubsub
    auth: none
    shape: handoff
    dead_letter: gateway
    effect:
      url: %[1]s/effects
      timeout: 2s
      result_id_header: X-Result-Id
      lookup_url: %[1]s/effects/{key}
`, s.srv.URL)
	if err := os.WriteFile(routes, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	env := newGatewayEnv(t, dbURL, redisAddr, routes)
	env["GATEWAY_RELAY_POLL"] = "50ms"
	mig := exec.Command(bin, "migrate")
	mig.Env = env.list()
	if out, err := mig.CombinedOutput(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	proc := startProc(t, bin, env, "first gateway")
	addr := env["GATEWAY_LISTEN_ADDR"]

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	type opRow struct{ id, state, key string }
	opOf := func(route string) opRow {
		t.Helper()
		var o opRow
		if err := pool.QueryRow(ctx, `SELECT id, state::text, idempotency_key FROM operations WHERE route = $1`, route).
			Scan(&o.id, &o.state, &o.key); err != nil {
			t.Fatalf("operation of %s: %v", route, err)
		}
		return o
	}
	attempts := func(id string) []string {
		t.Helper()
		rec, err := storage.NewLedger(pool).Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, a := range rec.Attempts {
			out = append(out, string(a.Kind)+":"+string(a.Outcome)+":"+a.IdempotencyKey)
		}
		return out
	}

	for _, route := range []string{"ship", "post"} {
		if code := pushRoute(addr, route, "m-"+route); code != http.StatusNoContent {
			t.Fatalf("push to %s: %d, want 204 once handed off", route, code)
		}
	}
	ship, post := opOf("ship"), opOf("post")
	arrived := map[string]bool{}
	for len(arrived) < 2 {
		arrived[<-s.arrived] = true
	}
	if !arrived[ship.key] || !arrived[post.key] {
		t.Fatalf("the relay called with keys %v, want %s and %s", arrived, ship.key, post.key)
	}
	// Both effects applied, their answers held: nothing is recorded yet.
	for _, o := range []opRow{opOf("ship"), opOf("post")} {
		if o.state != "pending_effect" {
			t.Fatalf("%s is %s before the kill, want pending_effect", o.id, o.state)
		}
	}
	proc.kill(t)
	s.open()

	startProc(t, bin, env, "restarted gateway")
	undelivered := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.Eventually(t, 3*time.Minute, func() bool {
		return opOf("ship").state == "acknowledged" && opOf("post").state == "acknowledged" && undelivered() == 0
	}, func() string {
		return fmt.Sprintf("ship %s %v, post %s %v", opOf("ship").state, attempts(ship.id), opOf("post").state, attempts(post.id))
	})

	// The idempotent route: one effect at the downstream, a second attempt
	// under the same key, which the downstream deduplicated.
	if effects, calls, lookups := s.counts(ship.key); effects != 1 || calls != 2 || lookups != 0 {
		t.Errorf("ship: %d effects, %d calls, %d lookups; want 1, 2 (the lost one and its same-key retry), 0", effects, calls, lookups)
	}
	got := attempts(ship.id)
	if len(got) != 2 || got[1] != "effect:confirmed:"+ship.key || !strings.HasSuffix(got[0], ":"+ship.key) {
		t.Errorf("ship attempts %v, want the interrupted one and a confirmed retry, both under %s", got, ship.key)
	}
	// The lookup route: one call, then a lookup that found the effect; no
	// second call.
	if effects, calls, lookups := s.counts(post.key); effects != 1 || calls != 1 || lookups != 1 {
		t.Errorf("post: %d effects, %d calls, %d lookups; want 1, 1, 1", effects, calls, lookups)
	}
	got = attempts(post.id)
	if len(got) != 2 || !strings.HasPrefix(got[0], "effect:") || !strings.HasSuffix(got[0], ":"+post.key) ||
		got[1] != "lookup:confirmed:"+post.key {
		t.Errorf("post attempts %v, want the interrupted effect and the lookup that found it, under %s", got, post.key)
	}
	var result, reason string
	if err := pool.QueryRow(ctx, `SELECT o.result_id, t.reason FROM operations o JOIN transitions t ON t.operation_id = o.id
		WHERE o.id = $1 AND t.to_state = 'effect_confirmed'`, post.id).Scan(&result, &reason); err != nil {
		t.Fatalf("post's confirmation: %v", err)
	}
	s.mu.Lock()
	want := s.effects[post.key]
	s.mu.Unlock()
	if result != want || reason != "lookup found the effect: "+want {
		t.Errorf("post result %q confirmed by %q, downstream %q", result, reason, want)
	}
}

// A local route on a real `gateway serve`: the gateway is SIGKILLed as
// soon as the statement's row is visible (its transaction, with the
// evidence, committed), whether or not the answer went out; after a
// restart the redelivery acks from the record without running the
// statement again. A statement that runs past its timeout is a nack and
// leaves neither a row nor a confirmed record.
func TestKillGatewayAfterLocalCommitBeforeAnswer(t *testing.T) {
	t.Parallel()
	bin := buildGateway(t)
	dbURL, redisAddr := testenv.DatabaseURL(t), testenv.Redis(t)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	// A message with "slow" sleeps past the statement's timeout first.
	yaml := `routes:
  - name: book
    broker: pubsub
    auth: none
    shape: local
    local:
      sql: >-
        WITH pause AS (SELECT pg_sleep(CASE WHEN $3::jsonb ? 'slow' THEN 5 ELSE 0 END))
        INSERT INTO bookings (idempotency_key, operation_id, body)
        SELECT $1, $2, $3::jsonb FROM pause RETURNING id
      params: [idempotency_key, operation_id, data_json]
      timeout: 1s
    max_attempts: 3
    dead_letter: broker
`
	if err := os.WriteFile(routes, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	env := newGatewayEnv(t, dbURL, redisAddr, routes)
	mig := exec.Command(bin, "migrate")
	mig.Env = env.list()
	if out, err := mig.CombinedOutput(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE bookings (id bigserial PRIMARY KEY, idempotency_key text UNIQUE NOT NULL,
		operation_id text NOT NULL, body jsonb NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	proc := startProc(t, bin, env, "first gateway")
	addr := env["GATEWAY_LISTEN_ADDR"]

	answer := make(chan int, 1)
	go func() { answer <- pushJSON(addr, "book", "m-1", `{"seat":"12A"}`) }()
	// Polled without a pause, on one connection: the kill should land as
	// close after the commit as the test can see it.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM bookings`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the statement's row never appeared")
		}
	}
	proc.kill(t)
	conn.Release()
	first := <-answer
	var before string
	if err := pool.QueryRow(ctx, `SELECT state::text FROM operations`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed with the operation %s; the first delivery's answer: %d (0: none)", before, first)
	if before != "effect_confirmed" && before != "ack_pending" && before != "acknowledged" {
		t.Fatalf("the row is committed but its operation is %s", before)
	}
	if first != 0 && first != http.StatusNoContent {
		t.Fatalf("first delivery: %d, want 204 or no answer", first)
	}

	startProc(t, bin, env, "restarted gateway")
	if code := pushJSON(addr, "book", "m-1", `{"seat":"12A"}`); code != http.StatusNoContent {
		t.Fatalf("redelivery after the restart: %d, want 204", code)
	}
	if n := count(`SELECT count(*) FROM bookings`); n != 1 {
		t.Fatalf("%d rows, want 1: the statement ran again", n)
	}
	// The redelivery's ack is marked once its response is out.
	var state, result, rowID string
	testenv.Eventually(t, 30*time.Second, func() bool {
		if err := pool.QueryRow(ctx, `SELECT o.state::text, o.result_id, b.id::text FROM operations o
			JOIN bookings b ON b.operation_id = o.id`).Scan(&state, &result, &rowID); err != nil {
			t.Fatal(err)
		}
		return state == "acknowledged"
	}, func() string { return "the operation stayed " + state })
	if result != rowID {
		t.Errorf("record: %s with result %q, the row is %s", state, result, rowID)
	}
	if n := count(`SELECT sum(attempt_count) FROM operations`); n != 1 {
		t.Errorf("%d attempts recorded, want the one statement", n)
	}

	// Past its timeout: a nack, no row, nothing confirmed.
	if code := pushJSON(addr, "book", "m-slow", `{"seat":"1A","slow":true}`); code != http.StatusServiceUnavailable {
		t.Errorf("a statement past its timeout: %d, want 503", code)
	}
	if n := count(`SELECT count(*) FROM bookings WHERE body ? 'slow'`); n != 0 {
		t.Errorf("%d rows of the timed-out statement", n)
	}
	if n := count(`SELECT count(*) FROM operations o JOIN deliveries d ON d.operation_id = o.id
		WHERE d.message_id = 'm-slow' AND o.state IN ('effect_confirmed', 'ack_pending', 'acknowledged')`); n != 0 {
		t.Errorf("the timed-out statement's operation is recorded as confirmed")
	}
}
