package storage_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/storage"
)

func poisonOf(route, fp string, at time.Time) *gate.Poison {
	return &gate.Poison{Route: route, Broker: gate.BrokerPubSub, Fingerprint: fp, MessageID: "m-" + fp,
		Reason: "no usable identity", At: at, Acked: true}
}

// The poison table grows with distinct messages, not deliveries, and not
// past the cap per route: a redelivery only counts (even when the route is
// full), and one route's garbage does not crowd out another's.
func TestPoisonRecordsAreBounded(t *testing.T) {
	t.Parallel()
	_, pool := newLedger(t)
	log := storage.NewPoisonLog(pool, 3)
	ctx := context.Background()
	record := func(p *gate.Poison) bool {
		t.Helper()
		kept, err := log.Record(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return kept
	}
	for i := range 5 {
		kept := record(poisonOf("orders", fmt.Sprintf("px_%d", i), t0.Add(time.Duration(i)*time.Second)))
		if kept != (i < 3) {
			t.Errorf("message %d: kept %v with a cap of 3", i, kept)
		}
	}
	again := poisonOf("orders", "px_0", t0.Add(time.Hour))
	again.MessageID, again.Acked, again.Reason = "", false, "seen again"
	if !record(again) {
		t.Error("a redelivery of a kept message on a full route was not counted")
	}
	if !record(poisonOf("billing", "px_0", t0)) {
		t.Error("another route's first poison message was not kept")
	}

	list, next, err := log.List(ctx, adminapi.PoisonFilter{Route: "orders"})
	if err != nil || next != "" || len(list) != 3 {
		t.Fatalf("orders' poison: %+v, %q, %v", list, next, err)
	}
	p := list[2] // the first seen earliest comes last
	if p.Fingerprint != "px_0" || p.Count != 2 || p.MessageID != "m-px_0" || p.Reason != "seen again" || p.Acked ||
		!p.FirstSeen.Equal(t0) || !p.LastSeen.Equal(t0.Add(time.Hour)) {
		t.Errorf("redelivered record: %+v", p)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM poison_messages`).Scan(&rows); err != nil || rows != 4 {
		t.Fatalf("%d rows (%v), want 4", rows, err)
	}
}

// Concurrent deliveries of the same new poison message make one record that
// counts every one of them.
func TestConcurrentPoisonIsCountedOnce(t *testing.T) {
	t.Parallel()
	_, pool := newLedger(t)
	log := storage.NewPoisonLog(pool, 0)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			kept, err := log.Record(context.Background(), poisonOf("orders", "px_same", t0))
			if err == nil && !kept {
				err = errors.New("not kept")
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	list, _, err := log.List(context.Background(), adminapi.PoisonFilter{})
	if err != nil || len(list) != 1 || list[0].Count != n {
		t.Fatalf("poison: %+v, %v; want one record counted %d times", list, err, n)
	}
}

// Pages of poison records neither lose nor repeat one, even when records are
// seen again between pages; a cursor the gateway did not issue is refused.
func TestPoisonPages(t *testing.T) {
	t.Parallel()
	_, pool := newLedger(t)
	log := storage.NewPoisonLog(pool, 0)
	ctx := context.Background()
	for i := range 5 {
		if _, err := log.Record(ctx, poisonOf(fmt.Sprintf("r%d", i%2), fmt.Sprintf("px_%d", i), t0.Add(time.Duration(i%3)*time.Second))); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	cursor := ""
	for page := 0; ; page++ {
		list, next, err := log.List(ctx, adminapi.PoisonFilter{Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list {
			seen[p.Route+"/"+p.Fingerprint]++
			// Seen again while paging: its place does not move.
			if _, err := log.Record(ctx, poisonOf(p.Route, p.Fingerprint, t0.Add(time.Hour))); err != nil {
				t.Fatal(err)
			}
		}
		if next == "" {
			break
		}
		if page > 5 {
			t.Fatal("pages do not end")
		}
		cursor = next
	}
	if len(seen) != 5 {
		t.Errorf("pages listed %v, want 5 records once each", seen)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s listed %d times", k, n)
		}
	}
	for _, c := range []string{"bm9wZQ", "!!", "MTox"} {
		if _, _, err := log.List(ctx, adminapi.PoisonFilter{Cursor: c}); !errors.Is(err, adminapi.ErrInvalidFilter) {
			t.Errorf("cursor %q: %v, want ErrInvalidFilter", c, err)
		}
	}
}
