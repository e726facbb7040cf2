package storage_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/storage"
)

func handoffRig(t *testing.T) *shapeRig {
	r := newShapeRig(t, gate.ShapeHandoff)
	r.route.DeadLetter, r.route.DedupeWindow = gate.DeadLetterGateway, time.Hour
	return r
}

// Two relays polling at once, each through its own pool as two replicas
// would, never take the same entry, and between them take every due one.
func TestOutboxClaimsNeverOverlap(t *testing.T) {
	t.Parallel()
	r := handoffRig(t)
	const n = 60
	for i := range n {
		if res := r.push(fmt.Sprintf("m-%d", i), `{"n":1}`, nil); res.Decision != gate.Ack {
			t.Fatalf("push %d: %s (%s)", i, res.Decision, res.Reason)
		}
	}
	other, err := storage.OpenPool(context.Background(), r.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	ledgers := []*storage.Ledger{r.ledger, storage.NewLedger(other)}
	var (
		mu     sync.Mutex
		seen   []string
		wg     sync.WaitGroup
		start  = make(chan struct{})
		errs   = make(chan error, 8)
		routes = []string{"orders"}
	)
	for _, l := range ledgers {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for {
					got, err := l.ClaimOutbox(context.Background(), routes, 7, time.Minute)
					if err != nil {
						errs <- err
						return
					}
					if len(got) == 0 {
						return
					}
					mu.Lock()
					for _, e := range got {
						seen = append(seen, e.OperationID)
					}
					mu.Unlock()
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	slices.Sort(seen)
	if len(seen) != n || len(slices.Compact(slices.Clone(seen))) != n {
		t.Fatalf("%d claims of %d distinct entries, want %d each", len(seen), len(slices.Compact(slices.Clone(seen))), n)
	}
	// Held for the horizon: nothing is due now.
	if got, err := r.ledger.ClaimOutbox(context.Background(), routes, 100, time.Minute); err != nil || len(got) != 0 {
		t.Fatalf("claimed again inside the horizon: %d, %v", len(got), err)
	}
}

func TestOutboxEntryLifecycle(t *testing.T) {
	t.Parallel()
	r := handoffRig(t)
	ctx := context.Background()
	res := r.push("m-1", `{"n":1}`, map[string]string{"region": "eu"})
	got, err := r.ledger.ClaimOutbox(ctx, []string{"orders"}, 10, 0)
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %d, %v", len(got), err)
	}
	e := got[0]
	if e.OperationID != res.OperationID || string(e.Message.Data) != `{"n":1}` || e.Message.Attributes["region"] != "eu" ||
		e.Message.MessageID != "m-1" || e.Passes != 1 {
		t.Fatalf("entry %+v / %+v", e, e.Message)
	}
	stats, err := r.ledger.OutboxStats(ctx)
	if err != nil || len(stats) != 1 || stats[0].Depth != 1 || stats[0].Oldest.IsZero() {
		t.Fatalf("stats %+v, %v", stats, err)
	}
	// Not yet evidenced: the sweep leaves it, and a reschedule holds it.
	if n, err := r.ledger.SweepOutbox(ctx, 100); err != nil || n != 0 {
		t.Fatalf("sweep before the effect: %d, %v", n, err)
	}
	if err := r.ledger.RescheduleOutbox(ctx, e.OperationID, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.ledger.ClaimOutbox(ctx, []string{"orders"}, 10, 0); len(got) != 0 {
		t.Fatalf("a rescheduled entry was due: %d", len(got))
	}
	// The relay delivers it; the sweep then empties it.
	out, err := r.gate.Relay(ctx, r.route, e)
	if err != nil || out.Decision != gate.Ack {
		t.Fatalf("relay: %+v, %v", out, err)
	}
	out.Finish(ctx, nil, true)
	if n, err := r.ledger.SweepOutbox(ctx, 100); err != nil || n != 1 {
		t.Fatalf("sweep after the effect: %d, %v", n, err)
	}
	var empty bool
	if err := r.pool.QueryRow(ctx, `SELECT data IS NULL AND attributes IS NULL AND delivered_at IS NOT NULL FROM outbox`).Scan(&empty); err != nil || !empty {
		t.Fatalf("after the sweep the message is still kept: %v", err)
	}
	if stats, _ := r.ledger.OutboxStats(ctx); len(stats) != 0 {
		t.Fatalf("stats after delivery %+v", stats)
	}
}
