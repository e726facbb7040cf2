package recovery_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/recovery"
	"github.com/ackgate/ackgate/storage"
)

// statements counts the statements a pool sends, by the first words of
// their SQL.
type statements struct {
	mu     sync.Mutex
	counts map[string]int
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	sql := strings.Join(strings.Fields(d.SQL), " ")
	kind := "other"
	switch {
	case strings.HasPrefix(sql, "UPDATE outbox e SET next_attempt_at"):
		kind = "claim"
	case strings.HasPrefix(sql, "UPDATE outbox SET next_attempt_at"):
		kind = "reschedule"
	case strings.HasPrefix(sql, "UPDATE outbox e SET delivered_at"):
		kind = "sweep"
	}
	s.mu.Lock()
	s.counts[kind]++
	s.mu.Unlock()
	return ctx
}

func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *statements) take() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.counts
	s.counts = map[string]int{}
	return c
}

// countingLedger is a ledger on a pool of its own whose statements are
// counted.
func countingLedger(t *testing.T, dbURL string) (*storage.Ledger, *statements) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	st := &statements{counts: map[string]int{}}
	cfg.ConnConfig.Tracer = st
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return storage.NewLedger(pool), st
}

// heldRelayer acks every entry once released, counting the passes that
// started; it stands for the gate so that only the relay's own statements
// reach the counted pool.
type heldRelayer struct {
	started atomic.Int64
	release chan struct{}
}

func (h *heldRelayer) Relay(ctx context.Context, _ *gate.Route, e *gate.OutboxEntry) (*gate.Result, error) {
	h.started.Add(1)
	if h.release != nil {
		<-h.release
	}
	return &gate.Result{Decision: gate.Ack, OperationID: e.OperationID, State: gate.StateAcknowledged}, nil
}

// twoHandoffRoutes are ship and post, both handoff routes on s.
func twoHandoffRoutes(s *sink) string {
	return handoffRoutes(s, "") + strings.Replace(strings.TrimPrefix(handoffRoutes(s, ""), "routes:\n"), "name: ship", "name: post", 1)
}

// A relay round claims the due entries of every route in one statement,
// each route up to its own limit: a Tick takes 30 entries of ship and 10 of
// post with one claim (and one sweep before it), and a running relay's
// first round, at the limits' start of 4, takes 4 of each with one claim.
func TestRelayClaimsEveryRouteInOneStatement(t *testing.T) {
	t.Parallel()
	s := newSink(t)
	c := newCluster(t, 1, twoHandoffRoutes(s), nil)
	r := c.replicas[0]
	push := func(route string, n int, prefix string) {
		for i := range n {
			if code := r.push(t, route, fmt.Sprintf("%s-%d", prefix, i), `{"n":1}`); code != http.StatusNoContent {
				t.Fatalf("push %s %d: %d", route, i, code)
			}
		}
	}
	push("ship", 30, "a")
	push("post", 10, "b")

	// The lag gauge: post's entries have been due for 90s, ship's just.
	if _, err := c.pool.Exec(context.Background(), `UPDATE outbox SET next_attempt_at = now() - interval '90 seconds' WHERE route = 'post'`); err != nil {
		t.Fatal(err)
	}
	if err := r.gw.Outbox.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	text := r.scrape(t)
	for route, atLeast := range map[string]float64{"post": 90, "ship": 0} {
		v, ok := sample(text, "ackgate_outbox_lag_seconds", map[string]string{"route": route})
		var lag float64
		fmt.Sscan(v, &lag)
		if !ok || lag < atLeast || (route == "ship" && lag >= 90) {
			t.Errorf("ackgate_outbox_lag_seconds{route=%s} = %q, want at least %v (and below 90 for ship)", route, v, atLeast)
		}
	}
	routes := r.gw.Relay.Routes()
	byName := map[string]*gate.Route{}
	for _, name := range routes {
		byName[name] = &gate.Route{Name: name, Shape: gate.ShapeHandoff, Effect: gate.EffectSpec{Timeout: time.Second}}
	}
	ledger, st := countingLedger(t, c.dbURL)
	relayer := &heldRelayer{}
	relay, err := recovery.NewRelay(recovery.RelayOptions{Outbox: ledger, Relayer: relayer, Poll: time.Hour, Concurrency: 64,
		Routes: []*gate.Route{byName["ship"], byName["post"]}})
	if err != nil {
		t.Fatal(err)
	}
	st.take()
	if got, err := relay.Tick(context.Background()); err != nil || got != 40 {
		t.Fatalf("tick took %d entries (%v), want 40", got, err)
	}
	if got := st.take(); got["claim"] != 1 || got["sweep"] != 1 || got["reschedule"] != 0 || got["other"] != 0 {
		t.Fatalf("statements of one tick over 40 entries of two routes: %v; want one claim and one sweep", got)
	}

	// A running relay, its passes held: the first round claims 4 of each
	// route (the limits' start) in one statement, and nothing more while
	// all eight are held.
	push("ship", 20, "c")
	push("post", 20, "d")
	held := &heldRelayer{release: make(chan struct{})}
	running, err := recovery.NewRelay(recovery.RelayOptions{Outbox: ledger, Relayer: held, Poll: time.Hour, Concurrency: 64,
		Routes: []*gate.Route{byName["ship"], byName["post"]}})
	if err != nil {
		t.Fatal(err)
	}
	st.take()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); running.Run(ctx) }()
	testenv.Eventually(t, 10*time.Second, func() bool { return held.started.Load() == 8 },
		func() string { return fmt.Sprintf("%d passes started, want 8", held.started.Load()) })
	cancel()
	close(held.release)
	<-done
	if got := st.take(); got["claim"] != 1 || got["reschedule"] != 0 || got["other"] != 0 {
		t.Fatalf("statements of the first round over two routes: %v; want one claim (and at most a sweep)", got)
	}
	if n := held.started.Load(); n != 8 {
		t.Fatalf("%d passes after the first round, want 8", n)
	}
}
