package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ackgate/ackgate/internal/testenv"
)

// faultyDownstream applies every effect it is sent and then answers as
// mode says: 201 with a result id, or the connection cut (the answer lost
// after the effect happened).
type faultyDownstream struct {
	srv   *httptest.Server
	lose  atomic.Bool
	calls atomic.Int64
	mu    sync.Mutex
	keys  []string
}

func newFaultyDownstream(t *testing.T) *faultyDownstream {
	d := &faultyDownstream{}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := d.calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		d.mu.Lock()
		d.keys = append(d.keys, r.Header.Get("Idempotency-Key"))
		d.mu.Unlock()
		if d.lose.Load() {
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		w.Header().Set("X-Result-Id", fmt.Sprintf("r-%d", n))
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(d.srv.Close)
	return d
}

func (d *faultyDownstream) lastKey() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.keys[len(d.keys)-1]
}

// key is the Idempotency-Key of call i (from 0).
func (d *faultyDownstream) key(i int) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.keys[i]
}

// cli runs gateway ops in-process against the admin listener of env.
type cli struct {
	t   *testing.T
	env gatewayEnv
}

func (c cli) run(args ...string) (string, error) {
	c.t.Helper()
	var out bytes.Buffer
	err := run(context.Background(), append([]string{"ops"}, args...), c.env.get, &out, io.Discard)
	return out.String(), err
}

func (c cli) must(args ...string) string {
	c.t.Helper()
	out, err := c.run(args...)
	if err != nil {
		c.t.Fatalf("gateway ops %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// wantExit checks that gateway ops args fails with exit status code and an
// error mentioning what.
func (c cli) wantExit(code int, what string, args ...string) {
	c.t.Helper()
	_, err := c.run(args...)
	var coded interface{ ExitCode() int }
	if err == nil || !errors.As(err, &coded) || coded.ExitCode() != code || !strings.Contains(err.Error(), what) {
		c.t.Fatalf("gateway ops %s: %v, want exit status %d and %q", strings.Join(args, " "), err, code, what)
	}
}

// opID finds the operation of a message id with gateway ops list.
func (c cli) opID(messageID string) string {
	c.t.Helper()
	lines := strings.Split(c.must("list", "-message_id", messageID), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[1], "op_") {
		c.t.Fatalf("no operation for %s:\n%s", messageID, strings.Join(lines, "\n"))
	}
	return strings.Fields(lines[1])[0]
}

// Each resolution kind and a replay from the shell, against a gateway
// serving in-process: what each changes, who and why recorded, the
// downstream calls that follow, and the exit status of every refusal.
func TestOpsResolveReplayAndDeadLetters(t *testing.T) {
	t.Parallel()
	down := newFaultyDownstream(t)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	yaml := fmt.Sprintf(`routes:
  - name: orders
    broker: pubsub
    auth: none
    shape: unsafe
    effect:
      url: %s/effects
      result_id_header: X-Result-Id
`, down.srv.URL)
	if err := os.WriteFile(routes, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	env := newGatewayEnv(t, testenv.DatabaseURL(t), testenv.Redis(t), routes)
	ctx, cancel := context.WithCancel(context.Background())
	if err := run(ctx, []string{"migrate"}, env.get, io.Discard, io.Discard); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, env.get, io.Discard, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	addr := env["GATEWAY_LISTEN_ADDR"]
	waitReady(t, addr)
	ops := cli{t: t, env: env}

	// Three unsafe effects whose answers were lost: indeterminate.
	down.lose.Store(true)
	for _, m := range []string{"m-1", "m-2", "m-3"} {
		if code := pushTo(t, addr, m); code != http.StatusServiceUnavailable {
			t.Fatalf("push %s: %d", m, code)
		}
	}
	down.lose.Store(false)
	happened, notHappened, abandoned := ops.opID("m-1"), ops.opID("m-2"), ops.opID("m-3")

	// happened: confirmed on the operator's word; the redelivery is acked
	// without a call; the same command again changes nothing.
	out := ops.must("resolve", happened, "--kind", "happened", "--result-id", "r-console", "--reason", "found in the provider's log", "--actor", "alice")
	if !strings.Contains(out, happened+": recorded") || !strings.Contains(out, "effect_confirmed") ||
		!strings.Contains(out, "happened by alice") || !strings.Contains(out, "confirmed by operator alice") {
		t.Fatalf("ops resolve happened:\n%s", out)
	}
	out = ops.must("resolve", "--kind", "happened", "--result-id", "r-console", "--reason", "found in the provider's log", "--actor", "alice", happened)
	if !strings.Contains(out, "already recorded, nothing changed") {
		t.Fatalf("the same resolution again:\n%s", out)
	}
	calls := down.calls.Load()
	if code := pushTo(t, addr, "m-1"); code != http.StatusNoContent || down.calls.Load() != calls {
		t.Fatalf("redelivery after happened: %d, %d new calls", code, down.calls.Load()-calls)
	}

	// not_happened: the actor comes from $USER, or is required.
	ops.wantExit(exitUsage, "--actor is required", "resolve", notHappened, "--kind", "not_happened", "--reason", "not in the log")
	withUser := cli{t: t, env: gatewayEnv{}}
	for k, v := range env {
		withUser.env[k] = v
	}
	withUser.env["USER"] = "bob"
	out = withUser.must("resolve", notHappened, "--kind", "not_happened", "--reason", "not in the log")
	if !strings.Contains(out, "pending_effect") || !strings.Contains(out, "not_happened by bob") || !strings.Contains(out, "One attempt is granted") {
		t.Fatalf("ops resolve not_happened:\n%s", out)
	}
	show := ops.must("show", notHappened)
	if !strings.Contains(show, "intervention") || !strings.Contains(show, "not_happened by bob") {
		t.Fatalf("ops show after not_happened:\n%s", show)
	}
	key, calls := down.key(1), down.calls.Load() // m-2's first call
	if code := pushTo(t, addr, "m-2"); code != http.StatusNoContent || down.calls.Load() != calls+1 || down.lastKey() != key {
		t.Fatalf("redelivery after not_happened: %d, %d new calls, key %s want %s", code, down.calls.Load()-calls, down.lastKey(), key)
	}

	// abandon, then the dead-letter list, then a replay.
	ops.must("resolve", abandoned, "--kind", "abandon", "--reason", "refunded by hand", "--actor", "carol")
	list := ops.must("dead-letters", "-route", "orders")
	if rows := strings.Split(strings.TrimSpace(list), "\n"); len(rows) != 2 || !strings.HasPrefix(rows[1], abandoned) ||
		!strings.Contains(rows[1], "terminal_failure") || !strings.Contains(rows[1], "broker") || !strings.Contains(rows[1], "true") {
		t.Fatalf("ops dead-letters:\n%s", list)
	}
	out = ops.must("replay", abandoned, "--reason", "the customer asked again", "--actor", "dave")
	if !strings.Contains(out, "pending_effect") || !strings.Contains(out, "replay by dave") {
		t.Fatalf("ops replay:\n%s", out)
	}
	key, calls = down.key(2), down.calls.Load() // m-3's first call
	if code := pushTo(t, addr, "m-3"); code != http.StatusNoContent || down.calls.Load() != calls+1 || down.lastKey() != key {
		t.Fatalf("redelivery after replay: %d, %d new calls, key %s want %s", code, down.calls.Load()-calls, down.lastKey(), key)
	}

	// Refusals and their exit statuses.
	ops.wantExit(exitRefused, "409", "replay", abandoned, "--reason", "again", "--actor", "dave")
	ops.wantExit(exitRefused, "409", "resolve", happened, "--kind", "not_happened", "--reason", "x", "--actor", "dave")
	ops.wantExit(exitRequest, "404", "replay", "op_aaaaaaaaaaaaaaaaaaaaaaaaaa", "--reason", "x", "--actor", "dave")
	ops.wantExit(exitRequest, "400", "resolve", happened, "--kind", "happened", "--reason", "x", "--actor", "dave")
	ops.wantExit(exitUsage, "exactly one operation id", "replay", "--reason", "x", "--actor", "dave")
	ops.wantExit(exitUsage, "exactly one operation id", "replay", happened, notHappened, "--reason", "x", "--actor", "dave")
	ops.wantExit(exitUsage, "--reason is required", "replay", happened, "--actor", "dave")
	ops.wantExit(exitUsage, "flag provided but not defined", "replay", happened, "--force")
	unreachable := cli{t: t, env: gatewayEnv{"GATEWAY_ADMIN_URL": "http://" + freeAddr(t), "GATEWAY_ADMIN_TOKEN": "x"}}
	unreachable.wantExit(exitUnavailable, "admin API", "dead-letters")
}
