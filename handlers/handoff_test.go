package handlers_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// Issue 21, item 9, end to end on Postgres and Redis: a handoff route's
// broker was acked when its outbox entry committed, so a redelivery is
// answered from the ledger even while someone else holds the operation's
// lease in Redis: the relay in the middle of its call, or another gateway
// that has just handed the operation off and not yet let go. A nack here
// would only make the broker retry, and under kills it retried hundreds of
// messages whose fate was already the relay's.
func TestHandoffRedeliveryAckedWhileTheLeaseIsHeld(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, routeYAML("orders-handoff", "handoff", "gateway", "    dedupe_window: 1h\n"))
	ctx := context.Background()

	t.Run("the relay is calling the downstream", func(t *testing.T) {
		m := msg{ID: "handoff-relay-1", Data: `{"order":1}`}
		wantStatus(t, e.push("orders-handoff", m), http.StatusNoContent)
		id := e.opID("orders-handoff", m)
		if rec := e.record(id); rec.HandedOffAt == nil {
			t.Fatalf("not handed off: %+v", rec.Operation)
		}

		calling, release := make(chan struct{}), make(chan struct{})
		e.down.set(func(w http.ResponseWriter, _ *http.Request, apply func() string) {
			close(calling)
			<-release
			answer(w, apply())
		})
		relayed := make(chan error, 1)
		go func() {
			_, err := e.gw.Relay.Tick(ctx)
			relayed <- err
		}()
		select {
		case <-calling:
		case <-time.After(20 * time.Second):
			t.Fatal("the relay never called the downstream")
		}
		released := false
		defer func() {
			if !released {
				close(release)
				<-relayed
			}
		}()

		// The premise: Redis has the relay's lease, and the ledger an open
		// attempt under it.
		if _, err := e.gate.Reservations.Acquire(ctx, id, "probe", time.Minute, 0); !errors.Is(err, gate.ErrHeld) {
			t.Fatalf("the relay does not hold the lease in Redis mid-call: %v", err)
		}
		if rec := e.record(id); len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != "" {
			t.Fatalf("no open attempt mid-call: %+v", rec.Attempts)
		}
		for i := range 3 {
			if r := e.push("orders-handoff", m); r.Status != http.StatusNoContent {
				t.Fatalf("redelivery %d while the relay holds the lease: %d %s, want 204", i+1, r.Status, r.Raw)
			}
		}
		if n := e.down.effectCalls.Load(); n != 1 {
			t.Fatalf("%d effect calls, want the relay's one", n)
		}

		close(release)
		released = true
		if err := <-relayed; err != nil {
			t.Fatalf("relay: %v", err)
		}
		rec := e.waitState(id, gate.StateAcknowledged)
		for _, d := range rec.Deliveries {
			if d.Decision != gate.Ack {
				t.Fatalf("delivery %d answered %s (%s)", d.N, d.Decision, d.Reason)
			}
		}
		if len(rec.Deliveries) != 4 || e.down.Applied() != 1 {
			t.Fatalf("%d deliveries, %d effects applied", len(rec.Deliveries), e.down.Applied())
		}
		e.down.set(nil)
	})

	t.Run("another gateway still holds it after handing off", func(t *testing.T) {
		m := msg{ID: "handoff-other-1", Data: `{"order":2}`}
		calls := e.down.effectCalls.Load()
		wantStatus(t, e.push("orders-handoff", m), http.StatusNoContent)
		id := e.opID("orders-handoff", m)
		rec := e.record(id)
		// Another replica's delivery took the lease over the committed
		// handoff and has not answered yet.
		l, err := e.gate.Reservations.Acquire(ctx, id, "gw-2/pending", time.Minute, rec.Fence)
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		t.Cleanup(func() { _ = e.gate.Reservations.ReleaseAll(ctx, []gate.Lease{l}) })
		if r := e.push("orders-handoff", m); r.Status != http.StatusNoContent {
			t.Fatalf("redelivery while another gateway holds the lease: %d %s, want 204", r.Status, r.Raw)
		}
		if n := e.down.effectCalls.Load(); n != calls {
			t.Fatalf("%d effect calls, %d before: the redelivery called the downstream", n, calls)
		}
	})
}
