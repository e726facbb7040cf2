package handlers_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/handlers"
)

// ackingGate answers every delivery ack with a result whose post-response
// work the Afterward below takes.
type ackingGate struct{}

func (ackingGate) Deliver(context.Context, *gate.Route, *gate.Message) (*gate.Result, error) {
	return &gate.Result{Decision: gate.Ack, OperationID: "op_x"}, nil
}

// afterward records what the handler offered it. queue says whether Queue
// takes the work.
type afterward struct {
	queue bool

	mu       sync.Mutex
	queued   int
	finished int
	// finishDeadline and finishErr are what Finish's context said.
	finishDeadline time.Time
	hasDeadline    bool
	finishErr      error
}

func (a *afterward) Queue(*gate.Result, bool) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.queued++
	return a.queue
}

func (a *afterward) Finish(ctx context.Context, _ *gate.Result, _ bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.finished++
	a.finishDeadline, a.hasDeadline = ctx.Deadline()
	a.finishErr = ctx.Err()
}

func pushThrough(t *testing.T, after *afterward) {
	t.Helper()
	routes, err := config.ParseRoutes([]byte(strings.ReplaceAll("routes:\n"+routeYAML("orders", "idempotent", "broker", ""),
		"{{DOWN}}", "http://127.0.0.1:9")))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(handlers.NewIngest(handlers.IngestOptions{
		Gate: ackingGate{}, Routes: map[string]*gate.Route{"orders": routes[0]}, MaxBodyBytes: 1 << 20,
		After: after, FinishTimeout: time.Hour, Logger: slog.New(slog.DiscardHandler),
	}))
	// Close waits for the handler, whose post-response work follows the
	// answer the client has read.
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/push/pubsub/orders", "application/json",
		bytes.NewReader(envelope(msg{ID: "m-after", Data: "x"})))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("status %d, want 204", resp.StatusCode)
	}
}

// Work the Afterward queues is not offered to Finish as well.
func TestQueuedWorkIsNotFinishedByTheHandler(t *testing.T) {
	t.Parallel()
	after := &afterward{queue: true}
	pushThrough(t, after)
	after.mu.Lock()
	defer after.mu.Unlock()
	if after.queued != 1 || after.finished != 0 {
		t.Fatalf("queued %d, finished %d; want 1 and 0", after.queued, after.finished)
	}
}

// Work the Afterward cannot queue goes to Finish, under a context of its
// own: bounded by FinishTimeout, and not ended with the answer.
func TestUnqueuedWorkIsFinishedUnderItsOwnContext(t *testing.T) {
	t.Parallel()
	after := &afterward{queue: false}
	pushThrough(t, after)
	after.mu.Lock()
	defer after.mu.Unlock()
	if after.queued != 1 || after.finished != 1 {
		t.Fatalf("queued %d, finished %d; want 1 and 1", after.queued, after.finished)
	}
	if !after.hasDeadline {
		t.Fatal("Finish got a context without a deadline")
	}
	if left := time.Until(after.finishDeadline); left < 30*time.Minute {
		t.Errorf("Finish's deadline is %s away, want about the hour FinishTimeout gives", left)
	}
	if after.finishErr != nil {
		t.Errorf("Finish's context had ended: %v", after.finishErr)
	}
}
