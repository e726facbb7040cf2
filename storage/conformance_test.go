package storage_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/gate/gatetest"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
)

// The adapters pass the cases the gate's fakes pass (gate/gatetest), so a
// gate test against the fakes says something about production.
func TestLedgerConforms(t *testing.T) {
	gatetest.RunLedger(t, func(t *testing.T) gatetest.LedgerHarness {
		l, _ := newLedger(t)
		return ledgerHarness(l)
	})
}

// ledgerHarness reads back what l recorded about an operation through its
// evidence record, as the admin API does.
func ledgerHarness(l *storage.Ledger) gatetest.LedgerHarness {
	return gatetest.LedgerHarness{Ledger: l, Inspect: func(t *testing.T, id string) gatetest.Snapshot {
		t.Helper()
		rec := mustGet(t, l, id)
		s := gatetest.Snapshot{Op: rec.Operation, Deliveries: rec.Deliveries, Attempts: rec.Attempts, DeadLetters: rec.DeadLetters,
			Interventions: rec.Interventions}
		for _, e := range rec.LeaseEvents {
			s.LeaseEvents = append(s.LeaseEvents, gatetest.LeaseEvent{Kind: e.Kind, Fence: e.Fence})
		}
		for _, e := range rec.Events {
			s.Transitions = append(s.Transitions, gate.Transition{From: e.From, To: e.To})
		}
		return s
	}}
}

func TestReservationsConform(t *testing.T) {
	gatetest.RunReservations(t, func(t *testing.T) gatetest.ReservationsHarness {
		rdb := redis.NewClient(&redis.Options{Addr: testenv.Redis(t)})
		t.Cleanup(func() { rdb.Close() })
		return gatetest.ReservationsHarness{
			Reservations: storage.NewReservations(rdb),
			Wait:         time.Sleep,
			Flush: func() {
				if err := rdb.FlushAll(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}
