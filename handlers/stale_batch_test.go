package handlers_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
)

// A stale owner's settling write that shares its round trip with many
// other deliveries' settling writes is still refused by its fence. Group
// commit sends every step as one element of a set-based statement, and a
// fence guard that held only for a batch of one, or only for some of its
// elements, would let the stale owner's evidence land on the operation a
// new owner took over while that owner's call is still running. The storage
// tests build such batches by hand; here concurrent pushes through the
// ingest listener form them, and the spans show that the stale write rode
// in a batch of several.
//
// Not parallel: it counts the process's goroutines waiting on the ledger
// to know that every step is queued before the batch is let go.
func TestStaleFenceRefusedInASharedBatch(t *testing.T) {
	// A long renewal interval: the stale owner never learns that its lease
	// is gone, so it settles as an owner that believes it still holds it.
	e := newEnv(t, true, routeYAML("orders", "idempotent", "broker",
		"    ack_deadline: 600s\n    renewal:\n      interval: 300s\n"))
	ctx := context.Background()
	blockers := []msg{{ID: "m-blocker-0", Data: "b"}, {ID: "m-blocker-1", Data: "b"}}
	for _, b := range blockers {
		wantStatus(t, e.push("orders", b), http.StatusNoContent)
		e.waitState(e.opID("orders", b), gate.StateAcknowledged)
	}
	stale := msg{ID: "m-stale", Data: "stale"}
	id, key := e.opID("orders", stale), e.idempotencyKey(stale)
	const fresh = 10
	fresher := make([]msg, fresh)
	freshKeys := map[string]bool{}
	for i := range fresher {
		fresher[i] = msg{ID: fmt.Sprintf("m-fresh-%d", i), Data: "fresh"}
		freshKeys[e.idempotencyKey(fresher[i])] = true
	}

	// The stale owner's first call and the fresh deliveries' calls hang
	// until released together; the new owner's call hangs on its own.
	releaseCalls, releaseWinner := testenv.NewRelease(t), testenv.NewRelease(t)
	entered := make(chan string, 4)
	var staleCalls, freshCalls atomic.Int32
	e.down.set(func(w http.ResponseWriter, r *http.Request, apply func() string) {
		switch k := r.Header.Get("Idempotency-Key"); {
		case k == key && staleCalls.Add(1) == 1:
			entered <- r.Header.Get("X-Ackgate-Fence")
			<-releaseCalls.C
		case k == key:
			entered <- r.Header.Get("X-Ackgate-Fence")
			<-releaseWinner.C
		case freshKeys[k]:
			freshCalls.Add(1)
			<-releaseCalls.C
		}
		answer(w, apply())
	})

	staleDone := make(chan reply, 1)
	go func() { staleDone <- e.push("orders", stale) }()
	if f := testenv.Receive(t, entered, "the first delivery never reached the downstream"); f != "1" {
		t.Fatalf("first owner called with fence %s", f)
	}
	// The first owner's bound passes and its lease in Redis is gone: a
	// redelivery takes the operation over under fence 2 and starts its own
	// call, which hangs, so the row stays pending_effect.
	e.clock.Advance(gate.OwnerBound(e.routes["orders"], time.Time{}).Sub(time.Time{}) + time.Second)
	if err := e.rdb.Del(ctx, "ackgate:{"+id+"}:lease").Err(); err != nil {
		t.Fatal(err)
	}
	winnerDone := make(chan reply, 1)
	go func() { winnerDone <- e.push("orders", stale) }()
	if f := testenv.Receive(t, entered, "the redelivery never reached the downstream"); f != "2" {
		t.Fatalf("the new owner called with fence %s", f)
	}
	if rec := e.record(id); rec.Operation.Fence != 2 || rec.Operation.State != gate.StatePendingEffect {
		t.Fatalf("after the takeover: fence %d, state %s", rec.Operation.Fence, rec.Operation.State)
	}
	var wg sync.WaitGroup
	answers := make([]reply, fresh)
	for i, m := range fresher {
		wg.Go(func() { answers[i] = e.push("orders", m) })
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return freshCalls.Load() == fresh },
		func() string {
			return fmt.Sprintf("%d of %d fresh deliveries reached the downstream", freshCalls.Load(), fresh)
		})

	// Hold the two flushers: a transaction locks the rows of two settled
	// operations, and a redelivery of each, one after the other, blocks a
	// flusher on its claim. What is written after that queues.
	lock, err := pgx.Connect(ctx, e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close(ctx)
	tx, err := lock.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT 1 FROM operations WHERE id = ANY($1) FOR UPDATE",
		[]string{e.opID("orders", blockers[0]), e.opID("orders", blockers[1])}); err != nil {
		t.Fatal(err)
	}
	for i, b := range blockers {
		wg.Go(func() { wantStatus(t, e.push("orders", b), http.StatusNoContent) })
		testenv.Eventually(t, 30*time.Second, func() bool { return lockWaiters(t, e.dbURL) > i },
			func() string {
				return fmt.Sprintf("%d flushers blocked on the locked rows, want %d", lockWaiters(t, e.dbURL), i+1)
			})
	}
	// The stale owner and the fresh deliveries come back from their calls
	// together, and their settling writes queue behind the blocked ones.
	releaseCalls.Now()
	testenv.Eventually(t, 30*time.Second, func() bool { return waitingOnLedger() >= fresh+3 },
		func() string {
			return fmt.Sprintf("%d steps waiting on the ledger, want %d", waitingOnLedger(), fresh+3)
		})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	got := testenv.Receive(t, staleDone, "the stale owner was never answered")
	wantStatus(t, got, http.StatusServiceUnavailable)
	if !strings.Contains(got.Body.Reason, "fenced") {
		t.Fatalf("stale owner's answer: %+v", got.Body)
	}
	wg.Wait()
	for i, a := range answers {
		if a.Status != http.StatusNoContent {
			t.Errorf("fresh delivery %d: %d %s", i, a.Status, a.Raw)
		}
	}
	rec := e.record(id)
	if rec.Operation.Fence != 2 || rec.Operation.State != gate.StatePendingEffect || rec.Operation.ResultID != "" ||
		rec.Operation.EvidenceAt != nil {
		t.Fatalf("the stale owner's write landed: fence %d, state %s, result %q", rec.Operation.Fence,
			rec.Operation.State, rec.Operation.ResultID)
	}
	if n := largestBatchOf(e, rec.Operation.TraceID); n < 6 {
		t.Fatalf("the stale owner's steps went in batches of at most %d; the test wants one of six or more", n)
	}

	releaseWinner.Now()
	wantStatus(t, testenv.Receive(t, winnerDone, "the new owner was never answered"), http.StatusNoContent)
	rec = e.waitState(id, gate.StateAcknowledged)
	if rec.Operation.Fence != 2 || rec.Operation.ResultID == "" {
		t.Fatalf("the new owner's evidence: fence %d, result %q", rec.Operation.Fence, rec.Operation.ResultID)
	}
}

// idempotencyKey is the idempotency key the gateway sends the downstream for m.
func (e *env) idempotencyKey(m msg) string {
	e.t.Helper()
	r := e.routes["orders"]
	id, err := gate.Identify(r, &gate.Message{Broker: r.Broker, Source: m.Sub, MessageID: m.ID, Data: []byte(m.Data), Attributes: m.Attrs})
	if err != nil {
		e.t.Fatal(err)
	}
	return id.IdempotencyKey
}

// lockWaiters counts the backends of the test's database waiting on a
// lock.
func lockWaiters(t *testing.T, dsn string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = $1 AND wait_event_type = 'Lock'`, databaseName(t, dsn)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitingOnLedger counts the goroutines inside the ledger's group commit,
// waiting for their step's answer.
func waitingOnLedger() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte("storage.(*Ledger).enqueue("))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// largestBatchOf is the most steps of any ledger round trip that carried
// a step of the delivery traced as traceID: the batch's span continues its
// first step's trace and links the others'.
func largestBatchOf(e *env, traceID string) int {
	e.t.Helper()
	most := 0
	for _, s := range e.spans.GetSpans() {
		if s.Name != "ledger batch" {
			continue
		}
		ours := s.Parent.TraceID().String() == traceID
		for _, l := range s.Links {
			ours = ours || l.SpanContext.TraceID().String() == traceID
		}
		if !ours {
			continue
		}
		for _, a := range s.Attributes {
			if a.Key == "ackgate.batch.steps" {
				most = max(most, int(a.Value.AsInt64()))
			}
		}
	}
	if most == 0 {
		e.t.Fatalf("no ledger batch span carries trace %s", traceID)
	}
	return most
}
