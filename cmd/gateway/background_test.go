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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/ackgate/ackgate/internal/testenv"
)

// lookupProvider applies effects by idempotency key and answers lookups by
// key. It counts every lookup per key and how many of one key are in
// flight at once, which is what two replicas' reconcilers must keep at one.
type lookupProvider struct {
	srv *httptest.Server
	// lostAfter: lose the response after applying the effect; lostBefore:
	// lose it without applying anything.
	lostAfter, lostBefore atomic.Bool
	lookupUp              atomic.Bool

	mu          sync.Mutex
	effects     map[string]string
	calls       map[string]int
	lookups     map[string]int
	inflight    map[string]int
	maxInflight int
}

func newLookupProvider(t *testing.T) *lookupProvider {
	p := &lookupProvider{effects: map[string]string{}, calls: map[string]int{}, lookups: map[string]int{}, inflight: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /effects", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		p.mu.Lock()
		p.calls[key]++
		if !p.lostBefore.Load() && p.effects[key] == "" {
			p.effects[key] = "res-" + strconv.Itoa(len(p.effects)+1)
		}
		id := p.effects[key]
		p.mu.Unlock()
		if p.lostAfter.Load() || p.lostBefore.Load() {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
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
		// A slow answer widens the window in which a second question
		// about the same key would overlap this one.
		time.Sleep(20 * time.Millisecond)
		p.mu.Lock()
		p.inflight[key]--
		p.mu.Unlock()
		switch {
		case !p.lookupUp.Load():
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

func (p *lookupProvider) lookupsOf(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lookups[key]
}

func writeLookupRoutes(t *testing.T, url string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "routes.yaml")
	yaml := fmt.Sprintf(`routes:
  - name: pay
    broker: pubsub
    auth: none
    shape: lookup
    effect:
      url: %[1]s/effects
      result_id_header: X-Result-Id
      lookup_url: %[1]s/effects/{key}
    reconcile:
      interval: 1s
      max_interval: 2s
      rate_per_second: 200
  - name: orders
    broker: pubsub
    auth: none
    shape: unsafe
    effect:
      url: %[1]s/effects
      result_id_header: X-Result-Id
`, url)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func buildGateway(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gateway")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// startServe runs `gateway serve` with env until the test ends, then stops
// it with SIGINT, as a deployment would.
func startServe(t *testing.T, bin string, env gatewayEnv, name string) {
	t.Helper()
	cmd := exec.Command(bin, "serve")
	cmd.Env = env.list()
	var logs testenv.SyncBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, logs.String())
		}
	})
	waitReady(t, env["GATEWAY_LISTEN_ADDR"])
}

// Two gateway processes run the reconciler on the same indeterminate
// operations of a lookup route. Neither settles one twice, the lookup is
// never asked about one key twice at once, and every lookup they made is in
// the record as an attempt of kind lookup. The unsafe route's operation is
// never looked up.
func TestTwoProcessesReconcileEachOperationOnce(t *testing.T) {
	t.Parallel()
	const found, absent = 120, 40
	bin := buildGateway(t)
	p := newLookupProvider(t)
	dbURL, redisAddr := testenv.DatabaseURL(t), testenv.Redis(t)
	routes := writeLookupRoutes(t, p.srv.URL)
	var addrs []string
	for i := range 2 {
		env := newGatewayEnv(t, dbURL, redisAddr, routes)
		env["GATEWAY_INSTANCE_ID"] = fmt.Sprintf("proc-%d", i)
		env["GATEWAY_RECONCILE_POLL"] = "100ms"
		env["GATEWAY_LANES_REFRESH"] = "1s"
		if i == 0 {
			mig := exec.Command(bin, "migrate")
			mig.Env = env.list()
			if out, err := mig.CombinedOutput(); err != nil {
				t.Fatalf("migrate: %v\n%s", err, out)
			}
		}
		startServe(t, bin, env, fmt.Sprintf("process %d", i))
		addrs = append(addrs, env["GATEWAY_LISTEN_ADDR"])
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx := context.Background()
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}

	// Lost responses while the lookup is down: the effect applied for
	// found-*, not for absent-*; each delivery goes to either process.
	p.lostAfter.Store(true)
	for i := range found {
		if code := pushRoute(addrs[i%2], "pay", "found-"+strconv.Itoa(i)); code != http.StatusServiceUnavailable {
			t.Fatalf("push found-%d: %d", i, code)
		}
	}
	if code := pushRoute(addrs[0], "orders", "unsafe-1"); code != http.StatusServiceUnavailable {
		t.Fatalf("push unsafe-1: %d", code)
	}
	p.lostAfter.Store(false)
	p.lostBefore.Store(true)
	for i := range absent {
		if code := pushRoute(addrs[i%2], "pay", "absent-"+strconv.Itoa(i)); code != http.StatusServiceUnavailable {
			t.Fatalf("push absent-%d: %d", i, code)
		}
	}
	p.lostBefore.Store(false)
	if n := count(`SELECT count(*) FROM operations WHERE state = 'effect_indeterminate'`); n != found+absent+1 {
		t.Fatalf("%d indeterminate operations, want %d", n, found+absent+1)
	}

	// While the lookup is down the reconcilers check, record it, and
	// schedule the next check where an operator can see it.
	testenv.Eventually(t, time.Minute, func() bool {
		return count(`SELECT count(*) FROM operations WHERE route = 'pay' AND checks >= 1 AND next_check_at > updated_at`) == found+absent
	}, func() string { return "the reconcilers did not check every operation while the lookup was down" })

	p.lookupUp.Store(true)
	testenv.Eventually(t, 2*time.Minute, func() bool {
		return count(`SELECT count(*) FROM operations WHERE state = 'effect_confirmed'`) == found &&
			count(`SELECT count(*) FROM operations WHERE state = 'pending_effect'`) == absent
	}, func() string {
		return fmt.Sprintf("%d confirmed, %d pending", count(`SELECT count(*) FROM operations WHERE state = 'effect_confirmed'`),
			count(`SELECT count(*) FROM operations WHERE state = 'pending_effect'`))
	})

	p.mu.Lock()
	maxInflight := p.maxInflight
	p.mu.Unlock()
	if maxInflight != 1 {
		t.Errorf("the lookup was asked about one key %d times at once", maxInflight)
	}
	if n := count(`SELECT count(*) FROM (SELECT operation_id FROM transitions
		WHERE from_state = 'effect_indeterminate' GROUP BY operation_id HAVING count(*) > 1) twice`); n != 0 {
		t.Errorf("%d operations left the indeterminate lane more than once", n)
	}
	rows, err := pool.Query(ctx, `SELECT o.idempotency_key, o.route, o.owner,
		(SELECT count(*) FROM attempts a WHERE a.operation_id = o.id AND a.kind = 'lookup')
		FROM operations o`)
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]int{}
	for rows.Next() {
		var (
			key, route, owner string
			recorded          int
		)
		if err := rows.Scan(&key, &route, &owner, &recorded); err != nil {
			t.Fatal(err)
		}
		lookups := p.lookupsOf(key)
		switch route {
		case "orders":
			if lookups != 0 || recorded != 0 {
				t.Errorf("the unsafe operation was looked up %d times (%d recorded)", lookups, recorded)
			}
		default:
			// Every lookup is recorded: the delivery's own and the
			// reconcilers'.
			if recorded < 2 || recorded != lookups {
				t.Errorf("%s: %d lookups at the provider, %d recorded", key, lookups, recorded)
			}
			owners[strings.SplitN(owner, "/", 2)[0]]++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("operations settled by each process: %v", owners)

	// The settled operations act on the next delivery: found ones ack
	// without a new effect, absent ones make their one granted attempt.
	for _, id := range []string{"found-0", "absent-0"} {
		if code := pushRoute(addrs[1], "pay", id); code != http.StatusNoContent {
			t.Errorf("redelivery of %s: %d, want 204", id, code)
		}
	}
	var effectsBefore int
	p.mu.Lock()
	for _, n := range p.calls {
		effectsBefore += n
	}
	p.mu.Unlock()
	if want := found + absent + 1 + 1; effectsBefore != want {
		t.Errorf("%d effect calls in all, want %d (one per delivery, one granted retry)", effectsBefore, want)
	}
}

// After a run of 10,000 operations through a gateway process and the purge
// of their evidence by its background purge, Redis holds no key for them.
func TestPurgeAfterTenThousandLeavesNoRedisKeys(t *testing.T) {
	t.Parallel()
	const n = 10000
	bin := buildGateway(t)
	down := newDownstream(t)
	dbURL, redisAddr := testenv.DatabaseURL(t), testenv.Redis(t)
	env := newGatewayEnv(t, dbURL, redisAddr, writeRoutes(t, down.srv.URL))
	env["GATEWAY_PURGE_INTERVAL"] = "1s"
	mig := exec.Command(bin, "migrate")
	mig.Env = env.list()
	if out, err := mig.CombinedOutput(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	startServe(t, bin, env, "gateway")
	addr := env["GATEWAY_LISTEN_ADDR"]

	began := time.Now()
	ids := make(chan int)
	var (
		wg     sync.WaitGroup
		failed atomic.Int64
	)
	for range 16 {
		wg.Go(func() {
			for i := range ids {
				if pushQuiet(addr, "bulk-"+strconv.Itoa(i)) != http.StatusNoContent {
					failed.Add(1)
				}
			}
		})
	}
	for i := range n {
		ids <- i
	}
	close(ids)
	wg.Wait()
	if f := failed.Load(); f != 0 {
		t.Fatalf("%d of %d deliveries not acked", f, n)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { rdb.Close() })
	count := func() int {
		var c int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM operations WHERE state = 'acknowledged'`).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	testenv.Eventually(t, time.Minute, func() bool { return count() == n },
		func() string { return fmt.Sprintf("%d of %d operations acknowledged", count(), n) })
	if keys := rdb.DBSize(ctx).Val(); keys < n {
		t.Fatalf("Redis holds %d keys after the run, want a fencing counter per operation", keys)
	}

	t.Logf("run of %d operations: %s", n, time.Since(began).Round(time.Millisecond))
	purge := time.Now()
	// Their retention runs out; the gateway's own purge takes it from here.
	if _, err := pool.Exec(ctx, `UPDATE operations SET retain_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	var left int
	testenv.Eventually(t, 2*time.Minute, func() bool {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM operations`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	}, func() string { return fmt.Sprintf("%d operations left after the purge", left) })
	// The purge drops a batch's Redis keys right after that batch's DELETE
	// commits, so the last batch's keys may outlive the rows by a moment.
	var keys []string
	scan := func() []string {
		var found []string
		iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
		for iter.Next(ctx) {
			found = append(found, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
		return found
	}
	testenv.Eventually(t, 30*time.Second, func() bool { keys = scan(); return len(keys) == 0 }, func() string {
		return fmt.Sprintf("Redis holds %d keys after the purge, such as %v", len(keys), keys[:min(5, len(keys))])
	})
	t.Logf("purge: %s", time.Since(purge).Round(time.Millisecond))
}
