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

// as is c run with name's own token (operatorTokens): what it resolves is
// recorded under that name.
func (c cli) as(name string) cli {
	env := gatewayEnv{}
	for k, v := range c.env {
		env[k] = v
	}
	env["GATEWAY_ADMIN_TOKEN"] = name + "-token-0123456789"
	return cli{t: c.t, env: env}
}

// operatorTokens are the named credentials the test gateway accepts.
const operatorTokens = "alice=alice-token-0123456789,bob=bob-token-0123456789,carol=carol-token-0123456789,dave=dave-token-0123456789"

// opID finds the operation of a message id with gateway ops list.
func (c cli) opID(messageID string) string {
	c.t.Helper()
	lines := strings.Split(c.must("list", "-message_id", messageID), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[1], "op_") {
		c.t.Fatalf("no operation for %s:\n%s", messageID, strings.Join(lines, "\n"))
	}
	return strings.Fields(lines[1])[0]
}

// serveForOps migrates a database of its own and serves routes in-process,
// with settings added to the gateway's environment and operatorTokens as its
// admin credentials, until the test ends. It returns the ingest address and
// a gateway ops that reaches the admin listener (with no token of its own:
// as gives it one).
func serveForOps(t *testing.T, routes string, settings gatewayEnv) (string, cli) {
	t.Helper()
	env := newGatewayEnv(t, testenv.DatabaseURL(t), testenv.Redis(t), routes)
	for k, v := range settings {
		env[k] = v
	}
	serverEnv := gatewayEnv{"GATEWAY_ADMIN_TOKENS": operatorTokens}
	for k, v := range env {
		serverEnv[k] = v
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := run(ctx, []string{"migrate"}, env.get, io.Discard, io.Discard); err != nil {
		cancel()
		t.Fatalf("migrate: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, serverEnv.get, io.Discard, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	addr := env["GATEWAY_LISTEN_ADDR"]
	waitReady(t, addr)
	return addr, cli{t: t, env: env}
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
	addr, ops := serveForOps(t, routes, nil)

	// Three unsafe effects whose answers were lost: indeterminate.
	down.lose.Store(true)
	for _, m := range []string{"m-1", "m-2", "m-3"} {
		if code := pushTo(t, addr, m); code != http.StatusServiceUnavailable {
			t.Fatalf("push %s: %d", m, code)
		}
	}
	down.lose.Store(false)
	happened, notHappened, abandoned := ops.opID("m-1"), ops.opID("m-2"), ops.opID("m-3")

	// happened: confirmed on the operator's word, recorded under the name
	// of the credential the CLI carried; the redelivery is acked without a
	// call; the same command again changes nothing.
	alice := ops.as("alice")
	out := alice.must("resolve", happened, "--kind", "happened", "--result-id", "r-console", "--reason", "found in the provider's log")
	if !strings.Contains(out, happened+": recorded") || !strings.Contains(out, "effect_confirmed") ||
		!strings.Contains(out, "happened by api:alice") || !strings.Contains(out, "confirmed by operator api:alice") {
		t.Fatalf("ops resolve happened:\n%s", out)
	}
	out = alice.must("resolve", "--kind", "happened", "--result-id", "r-console", "--reason", "found in the provider's log", happened)
	if !strings.Contains(out, "already recorded, nothing changed") {
		t.Fatalf("the same resolution again:\n%s", out)
	}
	calls := down.calls.Load()
	if code := pushTo(t, addr, "m-1"); code != http.StatusNoContent || down.calls.Load() != calls {
		t.Fatalf("redelivery after happened: %d, %d new calls", code, down.calls.Load()-calls)
	}

	// not_happened: the actor is the credential's, never chosen; --actor
	// naming someone else is refused, naming oneself is accepted (older
	// scripts), and a note is kept with the reason.
	bob := ops.as("bob")
	bob.wantExit(exitRequest, "cannot be chosen", "resolve", notHappened, "--kind", "not_happened", "--reason", "not in the log", "--actor", "alice")
	out = bob.must("resolve", notHappened, "--kind", "not_happened", "--reason", "not in the log", "--actor", "bob", "--note", "ticket OPS-7")
	if !strings.Contains(out, "pending_effect") || !strings.Contains(out, "not_happened by api:bob") || !strings.Contains(out, "One attempt is granted") {
		t.Fatalf("ops resolve not_happened:\n%s", out)
	}
	show := ops.must("show", notHappened)
	if !strings.Contains(show, "intervention") || !strings.Contains(show, "not_happened by api:bob") || !strings.Contains(show, "(note: ticket OPS-7)") {
		t.Fatalf("ops show after not_happened:\n%s", show)
	}
	key, calls := down.key(1), down.calls.Load() // m-2's first call
	if code := pushTo(t, addr, "m-2"); code != http.StatusNoContent || down.calls.Load() != calls+1 || down.lastKey() != key {
		t.Fatalf("redelivery after not_happened: %d, %d new calls, key %s want %s", code, down.calls.Load()-calls, down.lastKey(), key)
	}

	// abandon, then the dead-letter list, then a replay.
	ops.as("carol").must("resolve", abandoned, "--kind", "abandon", "--reason", "refunded by hand")
	list := ops.must("dead-letters", "-route", "orders")
	if rows := strings.Split(strings.TrimSpace(list), "\n"); len(rows) != 2 || !strings.HasPrefix(rows[1], abandoned) ||
		!strings.Contains(rows[1], "terminal_failure") || !strings.Contains(rows[1], "broker") || !strings.Contains(rows[1], "true") {
		t.Fatalf("ops dead-letters:\n%s", list)
	}
	dave := ops.as("dave")
	out = dave.must("replay", abandoned, "--reason", "the customer asked again")
	if !strings.Contains(out, "pending_effect") || !strings.Contains(out, "replay by api:dave") {
		t.Fatalf("ops replay:\n%s", out)
	}
	key, calls = down.key(2), down.calls.Load() // m-3's first call
	if code := pushTo(t, addr, "m-3"); code != http.StatusNoContent || down.calls.Load() != calls+1 || down.lastKey() != key {
		t.Fatalf("redelivery after replay: %d, %d new calls, key %s want %s", code, down.calls.Load()-calls, down.lastKey(), key)
	}

	// Refusals and their exit statuses.
	dave.wantExit(exitRefused, "409", "replay", abandoned, "--reason", "again")
	dave.wantExit(exitRefused, "409", "resolve", happened, "--kind", "not_happened", "--reason", "x")
	dave.wantExit(exitRequest, "404", "replay", "op_aaaaaaaaaaaaaaaaaaaaaaaaaa", "--reason", "x")
	dave.wantExit(exitRequest, "400", "resolve", happened, "--kind", "happened", "--reason", "x")
	dave.wantExit(exitUsage, "exactly one operation id", "replay", "--reason", "x")
	dave.wantExit(exitUsage, "exactly one operation id", "replay", happened, notHappened, "--reason", "x")
	dave.wantExit(exitUsage, "--reason is required", "replay", happened)
	dave.wantExit(exitUsage, "flag provided but not defined", "replay", happened, "--force")
	// A misspelt -route is an error from the real admin API, not an empty
	// table that reads as "nothing there".
	for _, list := range []string{"list", "dead-letters", "poison"} {
		dave.wantExit(exitRequest, "no route nosuch", list, "-route", "nosuch")
	}
	ops.as("mallory").wantExit(exitRequest, "401", "replay", happened, "--reason", "x")
	unreachable := cli{t: t, env: gatewayEnv{"GATEWAY_ADMIN_URL": "http://" + freeAddr(t), "GATEWAY_ADMIN_TOKEN": "x"}}
	unreachable.wantExit(exitUnavailable, "admin API", "dead-letters")
}
