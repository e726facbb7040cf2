package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackgate/ackgate/internal/testenv"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// blockingDownstream applies effects keyed by Idempotency-Key and, while
// hold is set, keeps each call waiting until released (at the latest when the
// test ends, so that closing the server never waits on a held call).
type blockingDownstream struct {
	srv     *httptest.Server
	calls   atomic.Int64
	entered chan struct{}
	release *testenv.Release
	hold    atomic.Bool
}

func newDownstream(t *testing.T) *blockingDownstream {
	d := &blockingDownstream{entered: make(chan struct{}, 16)}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := d.calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case d.entered <- struct{}{}:
		default: // more calls than any test waits for; calls counts them all
		}
		if d.hold.Load() {
			<-d.release.C
		}
		w.Header().Set("X-Result-Id", fmt.Sprintf("r-%d", n))
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(d.srv.Close)
	d.release = testenv.NewRelease(t) // after the server: let go before it closes
	return d
}

func writeRoutes(t *testing.T, downURL string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "routes.yaml")
	yaml := fmt.Sprintf(`routes:
  - name: orders
    broker: pubsub
    auth: none
    shape: unsafe
    effect:
      url: %s/effects
      result_id_header: X-Result-Id
`, downURL)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

type gatewayEnv map[string]string

func (g gatewayEnv) get(k string) string { return g[k] }

func (g gatewayEnv) list() []string {
	out := os.Environ()
	for k, v := range g {
		out = append(out, k+"="+v)
	}
	return out
}

func newGatewayEnv(t *testing.T, dbURL, redisAddr, routes string) gatewayEnv {
	return gatewayEnv{
		"GATEWAY_DATABASE_URL": dbURL, "GATEWAY_REDIS_URL": "redis://" + redisAddr + "/0",
		"GATEWAY_ROUTES_FILE": routes, "GATEWAY_LISTEN_ADDR": freeAddr(t), "GATEWAY_ADMIN_ADDR": freeAddr(t),
		"GATEWAY_ADMIN_TOKEN": "test-token-0123456789", "GATEWAY_SHUTDOWN_TIMEOUT": "5s",
	}
}

func waitReady(t *testing.T, addr string) {
	t.Helper()
	var last string
	testenv.Eventually(t, 30*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			last = err.Error()
			return false
		}
		resp.Body.Close()
		last = resp.Status
		return resp.StatusCode == http.StatusOK
	}, func() string { return fmt.Sprintf("gateway at %s never became ready (last: %s)", addr, last) })
}

// The Quickstart path in-process: migrate, serve, become ready, ack a
// delivery, shut down cleanly on cancel.
func TestRunMigrateServeAndShutdown(t *testing.T) {
	t.Parallel()
	down := newDownstream(t)
	env := newGatewayEnv(t, testenv.DatabaseURL(t), testenv.Redis(t), writeRoutes(t, down.srv.URL))
	ctx := context.Background()
	var out bytes.Buffer
	if err := run(ctx, []string{"migrate"}, env.get, &out, io.Discard); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	// A fresh database gets every migration in the repository, in order.
	files, err := filepath.Glob("../../storage/migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations found: %v", err)
	}
	var want strings.Builder
	for _, f := range files {
		fmt.Fprintf(&want, "applied %s\n", filepath.Base(f))
	}
	want.WriteString("ledger schema is current\n")
	if got := out.String(); got != want.String() {
		t.Fatalf("migrate said %q, want what it applied: %q", got, want.String())
	}
	out.Reset()
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	var logs testenv.SyncBuffer
	go func() { done <- run(sctx, []string{"serve"}, env.get, io.Discard, &logs) }()
	waitReady(t, env["GATEWAY_LISTEN_ADDR"])
	if code := pushTo(t, env["GATEWAY_LISTEN_ADDR"], "m-1"); code != http.StatusNoContent {
		t.Fatalf("push: %d", code)
	}

	// The operator's view from a shell: find the operation, show its record
	// with the delivery's trace id.
	var list bytes.Buffer
	if err := run(ctx, []string{"ops", "list", "-message_id", "m-1"}, env.get, &list, io.Discard); err != nil {
		t.Fatalf("ops list: %v", err)
	}
	fields := strings.Fields(strings.Split(list.String(), "\n")[1])
	if len(fields) != 6 || !strings.HasPrefix(fields[0], "op_") || fields[2] != "ack_pending" && fields[2] != "acknowledged" {
		t.Fatalf("ops list:\n%s", list.String())
	}
	var show bytes.Buffer
	if err := run(ctx, []string{"ops", "show", fields[0]}, env.get, &show, io.Discard); err != nil {
		t.Fatalf("ops show: %v", err)
	}
	if !strings.Contains(show.String(), "trace id") || !strings.Contains(show.String(), fields[5]) || len(fields[5]) != 32 ||
		!strings.Contains(show.String(), "effect_confirmed") {
		t.Fatalf("ops show lacks the trace id %s or the transitions:\n%s", fields[5], show.String())
	}
	if err := run(ctx, []string{"ops", "show", "op_missing"}, env.get, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("ops show of a missing operation: %v", err)
	}
	cancel()
	if err := testenv.Receive(t, done, "serve did not return after its context was cancelled"); err != nil {
		t.Fatalf("serve returned %v", err)
	}
	if !strings.Contains(logs.String(), `auth: none`) {
		t.Fatalf("no warning for a route without authentication in the logs:\n%s", logs.String())
	}
}

// Two gateway processes share Redis and Postgres; the same delivery reaches
// both at once. Exactly one downstream effect; the other answer is 503.
func TestTwoProcessesOneEffect(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "gateway")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	down := newDownstream(t)
	down.hold.Store(true)
	dbURL, redisAddr := testenv.DatabaseURL(t), testenv.Redis(t)
	routes := writeRoutes(t, down.srv.URL)
	var addrs []string
	for i := range 2 {
		env := newGatewayEnv(t, dbURL, redisAddr, routes)
		env["GATEWAY_INSTANCE_ID"] = fmt.Sprintf("proc-%d", i)
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

	start := make(chan struct{})
	codes := make(chan int, 2)
	for _, a := range addrs {
		go func() {
			<-start
			codes <- pushQuiet(a, "m-twice")
		}()
	}
	close(start)
	testenv.Receive(t, down.entered, "neither process reached the downstream")
	first := testenv.Receive(t, codes, "the process without the lease did not answer while the other held it")
	down.release.Now()
	second := testenv.Receive(t, codes, "the lease holder did not answer after its downstream call returned")
	if first != http.StatusServiceUnavailable || second != http.StatusNoContent {
		t.Fatalf("answers %d then %d, want 503 while the owner works, then 204", first, second)
	}
	if n := down.calls.Load(); n != 1 {
		t.Fatalf("downstream effects = %d, want exactly 1", n)
	}
}

func TestCheckConfigNamesRouteAndField(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "routes.yaml")
	bad := "routes:\n  - name: orders\n    broker: pubsub\n    auth: none\n    shape: sometimes\n    effect:\n      url: http://127.0.0.1:1/x\n"
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	env := gatewayEnv{"GATEWAY_ROUTES_FILE": path}
	err := run(context.Background(), []string{"check-config"}, env.get, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `"orders"`) || !strings.Contains(err.Error(), "shape") {
		t.Fatalf("check-config error = %v, want one naming route orders and field shape", err)
	}
	// serve refuses to start on the same file, before touching any service.
	env["GATEWAY_ADMIN_TOKEN"] = "test-token-0123456789"
	if err := run(context.Background(), []string{"serve"}, env.get, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "shape") {
		t.Fatalf("serve with an invalid routes file: %v", err)
	}
	if err := run(context.Background(), []string{"frobnicate"}, env.get, io.Discard, io.Discard); err == nil {
		t.Fatal("unknown command accepted")
	}
}

// Shutdown stops taking deliveries, lets one in flight finish inside the
// deadline, and cuts off one that would outlive it: the broker sees a broken
// connection (a nack), never an ack, and the ledger shows no ack either.
func TestShutdownNeverAcksUnfinishedWork(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		finishes   bool
		wantStatus int
		// deadline is the shutdown deadline: ample for the delivery that
		// is released (a busy machine must not turn it into a cut-off),
		// short for the one that never is.
		deadline string
	}{
		{"in-flight delivery finishes inside the deadline", true, http.StatusNoContent, "30s"},
		{"delivery outliving the deadline is cut off", false, 0, "1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			down := newDownstream(t)
			down.hold.Store(true)
			dbURL := testenv.DatabaseURL(t)
			env := newGatewayEnv(t, dbURL, testenv.Redis(t), writeRoutes(t, down.srv.URL))
			env["GATEWAY_SHUTDOWN_TIMEOUT"] = tc.deadline
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := run(ctx, []string{"migrate"}, env.get, io.Discard, io.Discard); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- run(ctx, []string{"serve"}, env.get, io.Discard, io.Discard) }()
			addr := env["GATEWAY_LISTEN_ADDR"]
			waitReady(t, addr)

			answered := make(chan int, 1)
			go func() { answered <- pushQuiet(addr, "m-inflight") }()
			testenv.Receive(t, down.entered, "the delivery never reached the downstream")
			cancel() // SIGTERM
			// New deliveries are refused once the listener is closed. The
			// probe goes to a route that does not exist, so one that lands
			// before the listener closes is answered 404 at once instead of
			// joining the held delivery at the downstream.
			late := func() int {
				resp, err := http.Post("http://"+addr+"/v1/push/pubsub/no-such-route", "application/json", strings.NewReader("{}"))
				if err != nil {
					return 0
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			testenv.Eventually(t, 10*time.Second, func() bool { return late() == 0 },
				func() string { return "the gateway kept taking deliveries after shutdown began" })
			if tc.finishes {
				down.release.Now()
			}
			got := testenv.Receive(t, answered, "the in-flight delivery was neither answered nor cut off")
			// The cut-off delivery's call is let go only once serve has
			// returned: released earlier, it could still record the effect's
			// evidence as its cut connection was noticed, and what the test
			// reads would depend on which came first.
			testenv.Receive(t, done, "serve did not return after its shutdown deadline")
			down.release.Now()
			if got != tc.wantStatus {
				t.Fatalf("in-flight delivery got %d, want %d (0: connection cut)", got, tc.wantStatus)
			}
			if !tc.finishes {
				pool, err := pgxpool.New(context.Background(), dbURL)
				if err != nil {
					t.Fatal(err)
				}
				defer pool.Close()
				// The cut-off delivery's operation must be left where
				// unfinished work waits, with no evidence of its effect and
				// no delivery answered ack: ack_pending would claim evidence
				// the gateway never received.
				var (
					state     string
					ackAnswer int
				)
				if err := pool.QueryRow(context.Background(), `
					SELECT o.state::text, (SELECT count(*) FROM deliveries d WHERE d.operation_id = o.id AND d.decision = 'ack')
					FROM operations o`).Scan(&state, &ackAnswer); err != nil {
					t.Fatalf("the cut-off delivery left no single operation: %v", err)
				}
				switch {
				case ackAnswer != 0:
					t.Fatalf("a delivery cut off at shutdown was answered ack in the ledger (state %s)", state)
				case state != "pending_effect" && state != "effect_indeterminate":
					t.Fatalf("a delivery cut off at shutdown left its operation in %s, want pending_effect or effect_indeterminate", state)
				}
			}
		})
	}
}

// pushJSON delivers data as a Pub/Sub message to route and returns the
// status, or 0 when no answer came.
func pushJSON(addr, route, id, data string) int {
	body := fmt.Sprintf(`{"message":{"data":%q,"messageId":%q},"subscription":"projects/p/subscriptions/s"}`,
		base64.StdEncoding.EncodeToString([]byte(data)), id)
	resp, err := http.Post("http://"+addr+"/v1/push/pubsub/"+route, "application/json", strings.NewReader(body))
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// pushRoute, pushQuiet and pushTo are pushJSON's shorthands for the
// messages most tests send.
func pushRoute(addr, route, id string) int { return pushJSON(addr, route, id, "hello") }

func pushQuiet(addr, id string) int { return pushRoute(addr, "orders", id) }

// pushTo also fails the test when no answer came.
func pushTo(t *testing.T, addr, id string) int {
	t.Helper()
	code := pushQuiet(addr, id)
	if code == 0 {
		t.Errorf("push %s: no answer", id)
	}
	return code
}
