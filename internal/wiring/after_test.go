package wiring_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/internal/wiring"
	"github.com/ackgate/ackgate/storage"
)

// afterGateway is a migrated gateway on a fresh database and a private
// Redis, with one route whose downstream confirms every call.
func afterGateway(t *testing.T) (*wiring.Gateway, *gate.Route) {
	t.Helper()
	return afterGatewayLogged(t, nil)
}

// afterGatewayLogged is afterGateway logging to log (nil: slog's default).
func afterGatewayLogged(t *testing.T, log *slog.Logger) (*wiring.Gateway, *gate.Route) {
	t.Helper()
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(down.Close)
	dbURL := testenv.DatabaseURL(t)
	if err := storage.Migrate(context.Background(), dbURL); err != nil {
		t.Fatal(err)
	}
	o := options(t, map[string]string{
		"GATEWAY_DATABASE_URL": dbURL,
		"GATEWAY_REDIS_URL":    "redis://" + testenv.Redis(t),
		"GUARDED_TOKEN":        "guarded-token-0123",
	})
	// The longest ack deadline makes the leases outlive any test here (their
	// TTL is two renewal intervals, a third of the deadline each: 6.7 s by
	// default, which a loaded CI machine ran past before a test read a
	// lease it expected held).
	routes, err := config.ParseRoutes([]byte(strings.ReplaceAll(`routes:
  - name: orders
    broker: pubsub
    auth: none
    shape: unsafe
    ack_deadline: 600s
    effect:
      url: {{DOWN}}/effects
      evidence: status_only
`, "{{DOWN}}", down.URL)))
	if err != nil {
		t.Fatal(err)
	}
	o.Routes = routes
	o.Logger = log
	gw, err := wiring.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	return gw, routes[0]
}

// deliverAcked runs one fresh message through the gate up to its answer,
// which must be an ack whose mark and release are still to come.
func deliverAcked(t *testing.T, gw *wiring.Gateway, route *gate.Route, id string) *gate.Result {
	t.Helper()
	res, err := gw.Gate.Deliver(context.Background(), route, &gate.Message{Broker: gate.BrokerPubSub,
		Source: "projects/p/subscriptions/s", MessageID: id, Data: []byte(id)})
	if err != nil || res.Decision != gate.Ack {
		t.Fatalf("deliver %s: %+v, %v", id, res, err)
	}
	if res.State != gate.StateAckPending {
		t.Fatalf("deliver %s: state %s before the answer's bookkeeping, want ack_pending", id, res.State)
	}
	return res
}

func leaseHeld(t *testing.T, rdb redis.UniversalClient, opID string) bool {
	t.Helper()
	n, err := rdb.Exists(context.Background(), "ackgate:{"+opID+"}:lease").Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// waitFor polls cond until it holds or 30 seconds pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// settled is true once op is acknowledged and its lease is gone.
func settled(t *testing.T, gw *wiring.Gateway, res *gate.Result) bool {
	t.Helper()
	rec, err := gw.Ledger.Get(context.Background(), res.OperationID)
	if err != nil {
		t.Fatal(err)
	}
	return rec.State == gate.StateAcknowledged && !leaseHeld(t, gw.Redis, res.OperationID)
}

// Acks through the listener: the answer comes first, and the ack mark and
// the lease release follow in the background.
func TestAckMarkAndReleaseFollowTheAnswer(t *testing.T) {
	t.Parallel()
	gw, route := afterGateway(t)
	srv := httptest.NewServer(gw.Ingest)
	t.Cleanup(srv.Close)
	const n = 12
	ids := make([]string, n)
	for i := range n {
		body := fmt.Sprintf(`{"message":{"messageId":"m-%d","data":"eA=="},"subscription":"projects/p/subscriptions/s"}`, i)
		resp, err := http.Post(srv.URL+"/v1/push/pubsub/orders", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("push %d: %d", i, resp.StatusCode)
		}
		ids[i] = deliverID(t, gw, route, fmt.Sprintf("m-%d", i))
	}
	for _, id := range ids {
		waitFor(t, id+" acknowledged with its lease released", func() bool {
			rec, err := gw.Ledger.Get(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			return rec.State == gate.StateAcknowledged && !leaseHeld(t, gw.Redis, id)
		})
	}
	waitFor(t, "every result queued", func() bool {
		queued, inline, _ := gw.After.Counts()
		return queued == n && inline == 0
	})
}

// deliverID is the operation id the gate derives for message id on route.
func deliverID(t *testing.T, gw *wiring.Gateway, route *gate.Route, id string) string {
	t.Helper()
	ident, err := gate.Identify(route, &gate.Message{Broker: gate.BrokerPubSub,
		Source: "projects/p/subscriptions/s", MessageID: id, Data: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	return ident.OperationID
}

// A full queue never drops work: the result that finds it full is done on
// its caller. Redis is paused so the one worker stays inside its batch's
// release while the queue fills.
func TestFullQueueRunsWorkOnTheCaller(t *testing.T) {
	t.Parallel()
	gw, route := afterGateway(t)
	results := make([]*gate.Result, 3)
	for i := range results {
		results[i] = deliverAcked(t, gw, route, fmt.Sprintf("full-%d", i))
	}
	after := gate.NewAfterAnswer(gw.Reservations, nil, gate.AfterAnswerOptions{Queue: 1, Workers: 1})
	pause := pauseRedisWrites(t, gw)
	unpaused := false
	unpause := func() {
		if !unpaused {
			unpaused = true
			if err := pause.Do(context.Background(), "CLIENT", "UNPAUSE").Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(unpause)

	after.Finish(context.Background(), results[0], true)
	waitFor(t, "the worker took the first result", func() bool { _, _, b := after.Counts(); return b == 1 })
	after.Finish(context.Background(), results[1], true) // fills the queue
	if after.Queue(results[2], true) {
		t.Fatal("Queue took work with the queue full")
	}
	inlineDone := make(chan struct{})
	go func() {
		defer close(inlineDone)
		after.Finish(context.Background(), results[2], true)
	}()
	waitFor(t, "the third result ran on its caller", func() bool { _, inline, _ := after.Counts(); return inline == 1 })
	// The caller did the ack mark itself, before its release (paused).
	waitFor(t, "the inline ack mark", func() bool {
		rec, err := gw.Ledger.Get(context.Background(), results[2].OperationID)
		if err != nil {
			t.Fatal(err)
		}
		return rec.State == gate.StateAcknowledged
	})
	unpause()
	testenv.Receive(t, inlineDone, "the inline release never returned")
	if err := after.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, res := range results {
		if !settled(t, gw, res) {
			t.Errorf("%s not acknowledged with its lease released", res.OperationID)
		}
	}
	if queued, inline, _ := after.Counts(); queued != 2 || inline != 1 {
		t.Fatalf("queued %d, inline %d; want 2 and 1", queued, inline)
	}
}

// At shutdown the queue is drained: every queued result's ack is marked and
// its lease released before Drain returns, and work offered afterwards runs
// on its caller.
func TestDrainFinishesQueuedWork(t *testing.T) {
	t.Parallel()
	gw, route := afterGateway(t)
	results := make([]*gate.Result, 40)
	for i := range results {
		results[i] = deliverAcked(t, gw, route, fmt.Sprintf("drain-%d", i))
	}
	for _, res := range results[:39] {
		gw.After.Finish(context.Background(), res, true)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := gw.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	for _, res := range results[:39] {
		if !settled(t, gw, res) {
			t.Errorf("%s not acknowledged with its lease released after the drain", res.OperationID)
		}
	}
	if gw.After.Queue(results[39], true) {
		t.Fatal("Queue took work after the drain")
	}
	gw.After.Finish(context.Background(), results[39], true)
	if !settled(t, gw, results[39]) {
		t.Errorf("work offered after the drain was not done on its caller")
	}
	if queued, inline, _ := gw.After.Counts(); queued != 39 || inline != 1 {
		t.Fatalf("queued %d, inline %d; want 39 and 1", queued, inline)
	}
}

// A response that was not written gets no ack mark, queued or not; its
// lease is still released.
func TestUnsentAnswerIsNeverMarked(t *testing.T) {
	t.Parallel()
	gw, route := afterGateway(t)
	res := deliverAcked(t, gw, route, "unsent")
	gw.After.Finish(context.Background(), res, false)
	waitFor(t, "the lease released", func() bool { return !leaseHeld(t, gw.Redis, res.OperationID) })
	if err := gw.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec, err := gw.Ledger.Get(context.Background(), res.OperationID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != gate.StateAckPending {
		t.Fatalf("state %s after an unsent ack, want ack_pending", rec.State)
	}
}

// A drain that runs out of time leaves what it has not done as it is: here
// Redis is paused, so the ack marks commit but the releases cannot, and the
// leases stay for their TTL to end. Drain says so.
func TestDrainPastItsDeadlineLeavesWorkUndone(t *testing.T) {
	t.Parallel()
	gw, route := afterGateway(t)
	results := make([]*gate.Result, 5)
	for i := range results {
		results[i] = deliverAcked(t, gw, route, fmt.Sprintf("late-%d", i))
	}
	pause := pauseRedisWrites(t, gw)
	for _, res := range results {
		gw.After.Finish(context.Background(), res, true)
	}
	waitFor(t, "the ack marks committed", func() bool {
		for _, res := range results {
			rec, err := gw.Ledger.Get(context.Background(), res.OperationID)
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != gate.StateAcknowledged {
				return false
			}
		}
		return true
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the deadline has passed
	if err := gw.Drain(ctx); err == nil {
		t.Fatal("a drain cut short reported nothing left undone")
	}
	// Read while still paused (reads are not): a release the server holds
	// back may still run once it resumes, which the fence allows.
	for _, res := range results {
		if !leaseHeld(t, pause, res.OperationID) {
			t.Errorf("%s: lease released by a drain that was cut short", res.OperationID)
		}
	}
	unpauseRedis(t, pause)
}

// A drain cut short while results are still queued leaves their ack marks
// unwritten, and says so for each operation by id: the operations stay
// ack_pending, none is left so silently.
func TestDrainCutShortNamesEveryOperationLeftAckPending(t *testing.T) {
	t.Parallel()
	var logs testenv.SyncBuffer
	gw, route := afterGatewayLogged(t, slog.New(slog.NewJSONHandler(&logs, nil)))
	// More than the two workers can take in their first batches, so that
	// some results are still queued when the drain gives up.
	const n = 2*gate.DefaultAfterBatch + 8
	results := make([]*gate.Result, n)
	for i := range results {
		results[i] = deliverAcked(t, gw, route, fmt.Sprintf("queued-%d", i))
	}
	// The workers' releases wait on the paused writes, so each takes one
	// batch and no more.
	pause := pauseRedisWrites(t, gw)
	for _, res := range results {
		gw.After.Finish(context.Background(), res, true)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := gw.Drain(ctx)
	if err == nil {
		t.Fatal("a drain cut short reported nothing left undone")
	}
	unpauseRedis(t, pause)
	var left []string
	for _, res := range results {
		rec, err := gw.Ledger.Get(context.Background(), res.OperationID)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State == gate.StateAckPending {
			left = append(left, res.OperationID)
		}
	}
	if len(left) < n-2*gate.DefaultAfterBatch {
		t.Fatalf("%d of %d operations left ack_pending; want at least the %d the workers could not take", len(left), n, n-2*gate.DefaultAfterBatch)
	}
	if !strings.Contains(err.Error(), "queued results left undone") {
		t.Errorf("drain error %q does not say how many queued results it left", err)
	}
	// Queued results are named as the drain gives up; those of the batches
	// it cancelled, by their failed ack marks.
	text := logs.String()
	for _, id := range left {
		if !strings.Contains(text, `"operation_id":"`+id+`"`) {
			t.Errorf("%s left ack_pending without a log line naming it", id)
		}
	}
	if gw.After.Pending() != 0 {
		t.Errorf("%d results still counted as pending after the drain", gw.After.Pending())
	}
}

// pauseRedisWrites holds back every write command to the gateway's Redis
// (reads still run) and returns a client of its own to read with and to
// unpause by.
func pauseRedisWrites(t *testing.T, gw *wiring.Gateway) *redis.Client {
	t.Helper()
	pause := redis.NewClient(&redis.Options{Addr: gw.Redis.(*redis.Client).Options().Addr})
	t.Cleanup(func() { pause.Close() })
	if err := pause.Do(context.Background(), "CLIENT", "PAUSE", "30000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	return pause
}

func unpauseRedis(t *testing.T, pause *redis.Client) {
	t.Helper()
	if err := pause.Do(context.Background(), "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
}
