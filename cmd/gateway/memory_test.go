package main

import (
	"context"
	"io"
	"net/http"
	"runtime/debug"
	"testing"

	"github.com/ackgate/ackgate/internal/testenv"
)

// GATEWAY_MEMORY_LIMIT reaches the Go runtime as its soft limit while serve
// runs, at MEMORY_LIMIT_RATIO of it, and serve hands the previous limit back
// when it returns. Not parallel: the limit belongs to the whole test process.
func TestServeSetsTheRuntimeMemoryLimit(t *testing.T) {
	down := newDownstream(t)
	env := newGatewayEnv(t, testenv.DatabaseURL(t), testenv.Redis(t), writeRoutes(t, down.srv.URL))
	env["GATEWAY_MEMORY_LIMIT"] = "1GiB"
	env["GATEWAY_MEMORY_LIMIT_RATIO"] = "0.5"
	ctx := context.Background()
	if err := run(ctx, []string{"migrate"}, env.get, io.Discard, io.Discard); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	before := debug.SetMemoryLimit(-1)
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(sctx, []string{"serve"}, env.get, io.Discard, io.Discard) }()
	waitReady(t, env["GATEWAY_LISTEN_ADDR"])
	if got := debug.SetMemoryLimit(-1); got != 512<<20 {
		t.Errorf("memory limit while serving = %d, want %d (half of 1GiB)", got, 512<<20)
	}
	if code := pushTo(t, env["GATEWAY_LISTEN_ADDR"], "m-limit"); code != http.StatusNoContent {
		t.Errorf("push under the limit: %d", code)
	}
	cancel()
	if err := testenv.Receive(t, done, "serve did not return after its context was cancelled"); err != nil {
		t.Fatalf("serve returned %v", err)
	}
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Errorf("memory limit after serve = %d, want the previous %d back", got, before)
	}
}
