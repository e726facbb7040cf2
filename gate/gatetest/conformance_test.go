package gatetest_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/gate/gatetest"
)

// The fakes pass the same cases storage/ passes on real Postgres and Redis
// (storage's conformance_test.go).
func TestFakeLedgerConforms(t *testing.T) {
	gatetest.RunLedger(t, func(t *testing.T) gatetest.LedgerHarness { return fakeHarness(gatetest.NewLedger()) })
}

func fakeHarness(l *gatetest.Ledger) gatetest.LedgerHarness {
	return gatetest.LedgerHarness{Ledger: l, Inspect: func(t *testing.T, id string) gatetest.Snapshot {
		t.Helper()
		s, ok := l.Snapshot(id)
		if !ok {
			t.Fatalf("no operation %s", id)
		}
		return s
	}}
}

func TestFakeReservationsConform(t *testing.T) {
	gatetest.RunReservations(t, func(t *testing.T) gatetest.ReservationsHarness {
		clock := gatetest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
		r := gatetest.NewReservations(clock.Now)
		return gatetest.ReservationsHarness{Reservations: r, Wait: clock.Advance, Flush: r.Flush}
	})
}

func TestFakeLocalConforms(t *testing.T) {
	gatetest.RunLocal(t, func(t *testing.T) gatetest.LocalHarness {
		l := gatetest.NewLedger()
		x := &gatetest.Local{Ledger: l, Script: func(n int, req *gate.EffectRequest) gate.EffectResult {
			if req.Route.Local.SQL == "refuse" {
				return gate.EffectResult{Outcome: gate.OutcomeTerminal, Reason: "SQLSTATE 23514 (constraint positive)"}
			}
			return gate.EffectResult{Outcome: gate.OutcomeConfirmed, ResultID: fmt.Sprintf("row-%d", n)}
		}}
		return gatetest.LocalHarness{
			LedgerHarness: fakeHarness(l),
			Local:         x,
			Route: func(refuse bool) *gate.Route {
				sql := "insert"
				if refuse {
					sql = "refuse"
				}
				return &gate.Route{Name: "orders", Shape: gate.ShapeLocal, Local: &gate.LocalSpec{SQL: sql,
					Params: []gate.LocalParam{{Kind: gate.ParamIdempotencyKey}}, Timeout: 5 * time.Second}}
			},
			Rows: func(_ *testing.T, key string) int { return x.Rows(key) },
		}
	})
}
