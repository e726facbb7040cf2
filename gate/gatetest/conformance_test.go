package gatetest_test

import (
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate/gatetest"
)

// The fakes pass the same cases storage/ passes on real Postgres and Redis
// (storage's conformance_test.go).
func TestFakeLedgerConforms(t *testing.T) {
	gatetest.RunLedger(t, func(t *testing.T) gatetest.LedgerHarness {
		l := gatetest.NewLedger()
		return gatetest.LedgerHarness{Ledger: l, Inspect: func(t *testing.T, id string) gatetest.Snapshot {
			t.Helper()
			s, ok := l.Snapshot(id)
			if !ok {
				t.Fatalf("no operation %s", id)
			}
			return s
		}}
	})
}

func TestFakeReservationsConform(t *testing.T) {
	gatetest.RunReservations(t, func(t *testing.T) gatetest.ReservationsHarness {
		clock := gatetest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
		r := gatetest.NewReservations(clock.Now)
		return gatetest.ReservationsHarness{Reservations: r, Wait: clock.Advance, Flush: r.Flush}
	})
}
