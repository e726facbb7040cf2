package recovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/recovery"
)

// sink is a handoff route's downstream: it applies each effect once per
// idempotency key and counts every call and how many calls of one key run
// at the same time. Its answer can be a failure, or held until released.
type sink struct {
	srv *httptest.Server
	// status, when set, is what every call answers, applying nothing.
	status atomic.Int32
	// hold, when set, keeps each call (after applying its effect) until it
	// is closed; arrived gets the key of every call that arrives.
	hold    chan struct{}
	arrived chan string
	// minHold is how long each call takes at least.
	minHold time.Duration
	// lose: apply the effect, then close the connection unanswered.
	lose atomic.Bool

	mu          sync.Mutex
	effects     map[string]string
	calls       map[string]int
	inflight    map[string]int
	maxInflight int
	answered    []string
}

func newSink(t *testing.T) *sink {
	s := &sink{effects: map[string]string{}, calls: map[string]int{}, inflight: map[string]int{},
		arrived: make(chan string, 1000)}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		start := time.Now()
		s.mu.Lock()
		s.calls[key]++
		s.inflight[key]++
		s.maxInflight = max(s.maxInflight, s.inflight[key])
		code := int(s.status.Load())
		if code == 0 && s.effects[key] == "" {
			s.effects[key] = fmt.Sprintf("res-%d", len(s.effects)+1)
		}
		id := s.effects[key]
		s.mu.Unlock()
		s.arrived <- key
		if s.hold != nil {
			<-s.hold
		}
		if d := s.minHold - time.Since(start); d > 0 {
			time.Sleep(d)
		}
		s.mu.Lock()
		s.inflight[key]--
		s.answered = append(s.answered, key)
		s.mu.Unlock()
		if code != 0 {
			w.WriteHeader(code)
			return
		}
		if s.lose.Load() {
			cut(w)
			return
		}
		w.Header().Set("X-Result-Id", id)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *sink) effect(key string) (calls int, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[key], s.effects[key]
}

// handoffRoutes is one handoff route, ship, on s: an idempotent downstream
// (a dedupe window), dead letters kept by the gateway.
func handoffRoutes(s *sink, extra string) string {
	return fmt.Sprintf(`routes:
  - name: ship
    broker: pubsub
    auth: none
    shape: handoff
    dedupe_window: 1h
    dead_letter: gateway
    effect:
      url: %s/ship
      timeout: 3s
      result_id_header: X-Result-Id
%s`, s.srv.URL, extra)
}

// record reads an operation's evidence record from replica r's admin API.
func (r *replica) record(t *testing.T, id string) adminapi.EvidenceRecord {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, r.admin.URL+"/v1/operations/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rec adminapi.EvidenceRecord
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("record %s: %d %s", id, resp.StatusCode, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(&rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// Two replicas, each with its own pool, Redis client and gate, run their
// relays on the same outbox from the same instant. Every entry reaches the
// downstream exactly once, never twice at a time, and every operation is
// confirmed with the downstream's own result id and one attempt.
func TestTwoRelaysDeliverEachEntryOnce(t *testing.T) {
	t.Parallel()
	const n = 120
	s := newSink(t)
	c := newCluster(t, 2, handoffRoutes(s, ""), map[string]string{"GATEWAY_RELAY_POLL": "20ms", "GATEWAY_RELAY_CONCURRENCY": "8"})
	for i := range n {
		if code := c.replicas[i%2].push(t, "ship", fmt.Sprintf("m-%d", i), fmt.Sprintf(`{"n":%d}`, i)); code != http.StatusNoContent {
			t.Fatalf("push m-%d: %d, want 204 once handed off", i, code)
		}
	}
	if got := c.count(t, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL`); got != n {
		t.Fatalf("%d outbox entries, want %d", got, n)
	}
	if calls := len(s.arrived); calls != 0 {
		t.Fatalf("%d downstream calls before any relay ran", calls)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, r := range c.replicas {
		wg.Go(func() {
			<-start
			r.gw.Relay.Run(ctx)
		})
	}
	close(start)
	testenv.Eventually(t, 2*time.Minute, func() bool {
		return c.count(t, `SELECT count(*) FROM operations WHERE state = 'acknowledged'`) == n &&
			c.count(t, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL`) == 0
	}, func() string {
		return fmt.Sprintf("%d acknowledged, %d entries left", c.count(t, `SELECT count(*) FROM operations WHERE state = 'acknowledged'`),
			c.count(t, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL`))
	})
	cancel()
	wg.Wait()

	s.mu.Lock()
	for key, calls := range s.calls {
		if calls != 1 {
			t.Errorf("key %s reached the downstream %d times", key, calls)
		}
	}
	if len(s.calls) != n || s.maxInflight != 1 {
		t.Errorf("%d keys at the downstream (want %d), at most %d calls of one key at once (want 1)", len(s.calls), n, s.maxInflight)
	}
	s.mu.Unlock()

	rows, err := c.pool.Query(context.Background(), `SELECT o.id, o.idempotency_key, o.result_id, o.attempt_count, e.publication_id
		FROM operations o JOIN outbox e ON e.operation_id = o.id`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for rows.Next() {
		var id, key, result, pub string
		var attempts int
		if err := rows.Scan(&id, &key, &result, &attempts, &pub); err != nil {
			t.Fatal(err)
		}
		if _, want := s.effect(pub); result != want || attempts != 1 || pub != key {
			t.Errorf("%s: result %q after %d attempt(s) under publication %s; the downstream has %q under key %s", id, result, attempts, pub, want, key)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rec := c.replicas[1].record(t, ids[0])
	if !strings.Contains(rec.Statement, "the relay then delivered it") || rec.Operation.ResultID == "" {
		t.Errorf("record of %s: %q, result %q", ids[0], rec.Statement, rec.Operation.ResultID)
	}
	// Both replicas' relays did their share is not guaranteed, but what
	// they did is counted: one pass per entry, all acked.
	var acked float64
	for _, r := range c.replicas {
		v, _ := sample(r.scrape(t), "ackgate_relay_passes_total", map[string]string{"route": "ship", "outcome": "acked"})
		var got float64
		fmt.Sscan(v, &got)
		acked += got
	}
	if acked != n {
		t.Errorf("ackgate_relay_passes_total{outcome=acked} summed to %v over the replicas, want %d", acked, n)
	}
	// Each replica's limit for ship, as its last round read it: from the
	// start of 4 up to the configured 8, never past it.
	for i, r := range c.replicas {
		v, ok := sample(r.scrape(t), "ackgate_relay_concurrency", map[string]string{"route": "ship"})
		var limit float64
		fmt.Sscan(v, &limit)
		if !ok || limit < 1 || limit > 8 {
			t.Errorf("replica %d: ackgate_relay_concurrency{route=ship} = %q, want 1 to 8", i, v)
		}
	}
}

// A downstream that answers a documented retryable failure is tried again
// after a wait that doubles from retry_min, jittered (no two entries wait
// the same), never past retry_max; the attempt limit then ends each
// operation terminal with a dead letter kept by the gateway. The broker
// answered 204 once and is never asked again.
func TestRelayBacksOffThenDeadLetters(t *testing.T) {
	t.Parallel()
	const n = 12
	s := newSink(t)
	s.status.Store(http.StatusServiceUnavailable)
	c := newCluster(t, 1, handoffRoutes(s, `    max_attempts: 4
    handoff:
      retry_min: 2s
      retry_max: 5s
`), map[string]string{"GATEWAY_RELAY_CONCURRENCY": "16"})
	r := c.replicas[0]
	ctx := context.Background()
	for i := range n {
		if code := r.push(t, "ship", fmt.Sprintf("m-%d", i), `{"n":1}`); code != http.StatusNoContent {
			t.Fatalf("push m-%d: %d", i, code)
		}
	}
	// Each pass's wait, as the reschedule set it: between half the backoff
	// and the whole of it, the backoff being 2s, 4s, then 5s (retry_max).
	for pass, backoff := range []time.Duration{2 * time.Second, 4 * time.Second, 5 * time.Second} {
		before := time.Now()
		if got, err := r.gw.Relay.Tick(ctx); err != nil || got != n {
			t.Fatalf("pass %d took up %d entries (%v), want %d", pass+1, got, err, n)
		}
		after := time.Now()
		rows, err := c.pool.Query(ctx, `SELECT e.next_attempt_at, o.state::text, o.attempt_count FROM outbox e
			JOIN operations o ON o.id = e.operation_id`)
		if err != nil {
			t.Fatal(err)
		}
		var waits []time.Duration
		for rows.Next() {
			var (
				next     time.Time
				state    string
				attempts int
			)
			if err := rows.Scan(&next, &state, &attempts); err != nil {
				t.Fatal(err)
			}
			if state != "pending_effect" || attempts != pass+1 {
				t.Errorf("pass %d: %s after %d attempts, want pending_effect after %d", pass+1, state, attempts, pass+1)
			}
			if next.Before(before.Add(backoff/2)) || next.After(after.Add(backoff)) {
				t.Errorf("pass %d: due again at %s, want from %s to %s", pass+1, next, before.Add(backoff/2), after.Add(backoff))
			}
			waits = append(waits, next.Sub(before))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		slices.Sort(waits)
		if len(slices.Compact(waits)) < 2 {
			t.Errorf("pass %d: every entry waits %s: no jitter", pass+1, waits[0])
		}
		// Nothing is due before its wait: a tick now takes nothing up.
		if got, err := r.gw.Relay.Tick(ctx); err != nil || got != 0 {
			t.Fatalf("after pass %d a tick took up %d entries (%v) before they were due", pass+1, got, err)
		}
		// Time passes: the entries come due.
		if _, err := c.pool.Exec(ctx, `UPDATE outbox SET next_attempt_at = now()`); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := r.gw.Relay.Tick(ctx); err != nil || got != n {
		t.Fatalf("last pass took up %d entries (%v)", got, err)
	}
	if got := c.count(t, `SELECT count(*) FROM operations o JOIN dead_letters d ON d.operation_id = o.id
		WHERE o.state = 'terminal_failure' AND o.attempt_count = 4`); got != n {
		t.Fatalf("%d operations terminal with a dead letter after 4 attempts, want %d", got, n)
	}
	s.mu.Lock()
	for key, calls := range s.calls {
		if calls != 4 {
			t.Errorf("%s: %d calls, want 4", key, calls)
		}
	}
	s.mu.Unlock()
	// Terminal: never taken up again, the message kept for a replay.
	if _, err := c.pool.Exec(ctx, `UPDATE outbox SET next_attempt_at = now()`); err != nil {
		t.Fatal(err)
	}
	if got, err := r.gw.Relay.Tick(ctx); err != nil || got != 0 {
		t.Fatalf("a terminal entry was taken up: %d (%v)", got, err)
	}
	if got := c.count(t, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL AND data IS NOT NULL`); got != n {
		t.Errorf("%d entries keep their message, want %d", got, n)
	}
	// The broker was answered once per message, at the handoff.
	if got := c.count(t, `SELECT (SELECT sum(delivery_count) FROM operations)`); got != n {
		t.Errorf("%d deliveries recorded, want the %d pushes", got, n)
	}
	id := c.op(t, "ship", "m-0").ID
	if rec := r.record(t, id); !strings.Contains(rec.Statement, "Dead-lettered by the gateway") {
		t.Errorf("statement: %q", rec.Statement)
	}
	// The outbox gauges come from the background count, not the scrape:
	// nothing before the first refresh, then the kept entries.
	if _, ok := sample(r.scrape(t), "ackgate_outbox_entries", map[string]string{"route": "ship"}); ok {
		t.Error("outbox gauges before their first count")
	}
	if err := r.gw.Outbox.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	text := r.scrape(t)
	if v, ok := sample(text, "ackgate_outbox_entries", map[string]string{"route": "ship"}); !ok || v != fmt.Sprint(n) {
		t.Errorf("ackgate_outbox_entries = %q, want %d", v, n)
	}
	if v, ok := sample(text, "ackgate_outbox_oldest_age_seconds", map[string]string{"route": "ship"}); !ok || v == "0" {
		t.Errorf("ackgate_outbox_oldest_age_seconds = %q, want the age of the oldest entry", v)
	}
	for outcome, want := range map[string]string{"retry": fmt.Sprint(3 * n), "dead_lettered": fmt.Sprint(n)} {
		if v, ok := sample(text, "ackgate_relay_passes_total", map[string]string{"route": "ship", "outcome": outcome}); !ok || v != want {
			t.Errorf("ackgate_relay_passes_total{outcome=%q} = %q, want %s", outcome, v, want)
		}
	}
}

// A handoff route acks its push once the outbox entry commits, while its
// downstream takes longer than the broker's deadline (10s, the least a
// Pub/Sub subscription allows; the downstream takes 12s, within the 20s
// effect timeout). The push is answered before the downstream answers,
// with the relay running all along; the effect is then confirmed by the relay and the
// record says what was promised at each point.
func TestHandoffAcksBeforeASlowerDownstream(t *testing.T) {
	t.Parallel()
	s := newSink(t)
	s.minHold = 12 * time.Second
	routes := strings.Replace(handoffRoutes(s, "    ack_deadline: 10s\n"), "timeout: 3s", "timeout: 20s", 1)
	c := newCluster(t, 1, routes, map[string]string{"GATEWAY_RELAY_POLL": "20ms"})
	r := c.replicas[0]
	s.hold = make(chan struct{})
	released := false
	release := func() {
		if !released {
			released = true
			close(s.hold)
		}
	}
	t.Cleanup(release)

	// The relay runs from the start: it may take the entry up as soon as
	// it commits, before the push's answer is read here.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.gw.Relay.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	if code := r.push(t, "ship", "m-slow", `{"n":1}`); code != http.StatusNoContent {
		t.Fatalf("push: %d, want 204", code)
	}
	s.mu.Lock()
	answered := len(s.answered)
	s.mu.Unlock()
	if answered != 0 {
		t.Fatal("the downstream answered before the push was acked")
	}
	o := c.op(t, "ship", "m-slow")
	if key := <-s.arrived; key != o.Key {
		t.Fatalf("the relay called with key %q, want %q", key, o.Key)
	}
	// The call is under way and unanswered, the broker long answered: the
	// record promises the handoff and no more.
	if rec := r.record(t, o.ID); rec.Operation.State != "pending_effect" || !strings.Contains(rec.Statement, "handed off at") ||
		!strings.Contains(rec.Statement, "Effect evidence pending") {
		t.Errorf("while the downstream works: %s, %q", rec.Operation.State, rec.Statement)
	}
	release() // the downstream still takes its 12s in all
	testenv.Eventually(t, time.Minute, func() bool { return c.op(t, "ship", "m-slow").State == "acknowledged" },
		func() string { return "never confirmed: " + c.op(t, "ship", "m-slow").State })
	_, want := s.effect(o.Key)
	rec := r.record(t, o.ID)
	if rec.Operation.ResultID != want || !strings.Contains(rec.Statement, want) || !strings.Contains(rec.Statement, "the relay then delivered it") {
		t.Errorf("record after the relay: result %q (downstream %q), statement %q", rec.Operation.ResultID, want, rec.Statement)
	}
	if calls, _ := s.effect(o.Key); calls != 1 {
		t.Errorf("%d calls, want 1", calls)
	}
	// A redelivery of the handed-off message acks from the ledger.
	if code := r.push(t, "ship", "m-slow", `{"n":1}`); code != http.StatusNoContent {
		t.Errorf("redelivery: %d", code)
	}
	if got := c.count(t, `SELECT count(*) FROM outbox`); got != 1 {
		t.Errorf("%d outbox entries after the redelivery, want 1", got)
	}
}

// A handoff committed by this process wakes its relay: with a poll of a
// minute, twice as long as the test waits for each entry, an idle relay
// relays an entry only because the ledger told it of the handoff.
func TestHandoffWakesTheRelay(t *testing.T) {
	t.Parallel()
	s := newSink(t)
	c := newCluster(t, 1, handoffRoutes(s, ""), map[string]string{"GATEWAY_RELAY_POLL": "1m"})
	r := c.replicas[0]
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.gw.Relay.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	for i, m := range []string{"m-first", "m-second"} {
		if code := r.push(t, "ship", m, fmt.Sprintf(`{"n":%d}`, i)); code != http.StatusNoContent {
			t.Fatalf("push %s: %d, want 204", m, code)
		}
		testenv.Eventually(t, 30*time.Second, func() bool { return c.op(t, "ship", m).State == "acknowledged" },
			func() string { return m + " not relayed: " + c.op(t, "ship", m).State })
	}
}

// A route whose downstream neither deduplicates nor can be asked (no
// dedupe window, no lookup) parks an entry whose response was lost: the
// operation goes to the indeterminate lane, is never resent, and the entry
// keeps its message. Entries of a route the relay does not know (renamed,
// or no longer handoff) are never taken up and stay where they are.
func TestRelayParksUnknownOutcomesAndLeavesUnknownRoutes(t *testing.T) {
	t.Parallel()
	s := newSink(t)
	s.lose.Store(true)
	routes := strings.Replace(handoffRoutes(s, ""), "    dedupe_window: 1h\n", "", 1)
	c := newCluster(t, 1, routes, nil)
	r := c.replicas[0]
	ctx := context.Background()
	if code := r.push(t, "ship", "m-lost", `{"n":1}`); code != http.StatusNoContent {
		t.Fatalf("push: %d", code)
	}
	if got, err := r.gw.Relay.Tick(ctx); err != nil || got != 1 {
		t.Fatalf("tick: %d, %v", got, err)
	}
	o := c.op(t, "ship", "m-lost")
	if o.State != "effect_indeterminate" {
		t.Fatalf("after a lost response: %s, want effect_indeterminate", o.State)
	}
	if _, err := c.pool.Exec(ctx, `UPDATE outbox SET next_attempt_at = now()`); err != nil {
		t.Fatal(err)
	}
	if got, err := r.gw.Relay.Tick(ctx); err != nil || got != 0 {
		t.Fatalf("a parked entry was taken up again: %d, %v", got, err)
	}
	if calls, _ := s.effect(o.Key); calls != 1 {
		t.Errorf("%d calls, want 1: never resent blindly", calls)
	}
	if v, ok := sample(r.scrape(t), "ackgate_relay_passes_total", map[string]string{"route": "ship", "outcome": "parked"}); !ok || v != "1" {
		t.Errorf("parked passes %q", v)
	}

	// The same outbox seen by a relay whose routes do not include ship.
	s.lose.Store(false)
	if code := r.push(t, "ship", "m-orphan", `{"n":2}`); code != http.StatusNoContent {
		t.Fatalf("push: %d", code)
	}
	other, err := recovery.NewRelay(recovery.RelayOptions{Outbox: r.gw.Ledger, Relayer: r.gw.Gate, Poll: time.Second, Concurrency: 4,
		Routes: []*gate.Route{{Name: "ship-v2", Shape: gate.ShapeHandoff, Effect: gate.EffectSpec{Timeout: time.Second}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := other.Tick(ctx); err != nil || got != 0 {
		t.Fatalf("a relay without the route took up %d entries (%v)", got, err)
	}
	if n := c.count(t, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL AND data IS NOT NULL`); n != 2 {
		t.Errorf("%d entries kept, want the parked one and the orphan", n)
	}
	if calls, _ := s.effect(c.op(t, "ship", "m-orphan").Key); calls != 0 {
		t.Errorf("the orphan reached the downstream %d times", calls)
	}
}
