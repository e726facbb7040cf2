package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A handoff's outbox entry from the shell, against a gateway serving
// in-process whose relay meets a failing downstream: retry makes a backed-off
// entry due at once, cancel ends its operation terminal and a replay hands it
// back; each is recorded under the credential's name, and each refusal has
// its exit status.
func TestOpsOutboxRetryAndCancel(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	var calls, applied atomic.Int64
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("X-Result-Id", fmt.Sprintf("r-%d", applied.Add(1)))
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(down.Close)
	// A failed pass waits a minute before the next, so only the commands
	// under test make one sooner.
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	yaml := fmt.Sprintf(`routes:
  - name: orders
    broker: pubsub
    auth: none
    shape: handoff
    dead_letter: gateway
    handoff:
      retry_min: 1m
      retry_max: 5m
    effect:
      url: %s/effects
      timeout: 2s
      result_id_header: X-Result-Id
`, down.URL)
	if err := os.WriteFile(routes, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, ops := serveForOps(t, routes, gatewayEnv{"GATEWAY_RELAY_POLL": "50ms"})

	// waitFor polls until cond holds; the bound only keeps a broken relay
	// from hanging the test.
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("still waiting for %s", what)
			}
		}
	}
	// handOff pushes a message while the downstream fails, and returns its
	// operation once the relay's first pass has failed on it and recorded
	// so: a command that came between the call and that record would see
	// its schedule replaced by the pass's backoff.
	handOff := func(messageID string) string {
		t.Helper()
		failing.Store(true)
		before := calls.Load()
		if code := pushTo(t, addr, messageID); code != http.StatusNoContent {
			t.Fatalf("push %s: %d, want the handoff's ack", messageID, code)
		}
		waitFor("the relay's first pass on "+messageID, func() bool { return calls.Load() > before })
		id := ops.opID(messageID)
		waitFor("the first pass's outcome on "+messageID, func() bool {
			return strings.Contains(ops.must("show", id, "-json"), `"retryable"`)
		})
		return id
	}

	// retry: the entry backed off for a minute is due at once, and the
	// relay's next pass confirms it.
	retried := handOff("m-1")
	failing.Store(false)
	out := ops.as("alice").must("outbox", "retry", retried, "--reason", "billing is back", "--note", "INC-12")
	if !strings.Contains(out, retried+": recorded") || !strings.Contains(out, "retry_now by api:alice") {
		t.Fatalf("ops outbox retry:\n%s", out)
	}
	waitFor("the retried entry's effect", func() bool { return applied.Load() == 1 })
	waitFor("the retried operation's evidence", func() bool {
		return strings.Contains(ops.must("show", retried), "r-1")
	})

	// cancel: the operation ends terminal with a dead letter, nothing more
	// is sent, the same words again change nothing, other words are
	// refused, and a replay hands the entry back to the relay.
	cancelled := handOff("m-2")
	bob := ops.as("bob")
	out = bob.must("outbox", "cancel", cancelled, "--reason", "customer withdrew")
	if !strings.Contains(out, cancelled+": recorded") || !strings.Contains(out, "terminal_failure") || !strings.Contains(out, "cancel by api:bob") {
		t.Fatalf("ops outbox cancel:\n%s", out)
	}
	if out := bob.must("outbox", "cancel", cancelled, "--reason", "customer withdrew"); !strings.Contains(out, "already recorded, nothing changed") {
		t.Fatalf("the same cancel again:\n%s", out)
	}
	bob.wantExit(exitRefused, "409", "outbox", "cancel", cancelled, "--reason", "and again")
	if list := ops.must("dead-letters", "-route", "orders"); !strings.Contains(list, cancelled) {
		t.Fatalf("ops dead-letters after a cancel:\n%s", list)
	}
	failing.Store(false)
	if out := bob.must("replay", cancelled, "--reason", "customer asked again"); !strings.Contains(out, "replay by api:bob") {
		t.Fatalf("ops replay of a cancelled entry:\n%s", out)
	}
	// The replay makes the entry due at once, though the failed pass had
	// set it a minute away.
	waitFor("the replayed entry's effect", func() bool { return applied.Load() == 2 })

	// Refusals and their exit statuses.
	ops.wantExit(exitRequest, "404", "outbox", "retry", "op_aaaaaaaaaaaaaaaaaaaaaaaaaa", "--reason", "x")
	ops.wantExit(exitUsage, "want retry or cancel", "outbox")
	ops.wantExit(exitUsage, `unknown action "resend"`, "outbox", "resend", retried, "--reason", "x")
	ops.wantExit(exitUsage, "--reason is required", "outbox", "retry", retried)
	ops.wantExit(exitUsage, "exactly one operation id", "outbox", "cancel", "--reason", "x")
	ops.as("mallory").wantExit(exitRequest, "401", "outbox", "retry", retried, "--reason", "x")
}
