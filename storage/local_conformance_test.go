package storage_test

import (
	"context"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/gate/gatetest"
)

// The ledger's Local passes the cases the gate's fake Local passes: the
// statement commits with its evidence or not at all.
func TestLocalConforms(t *testing.T) {
	gatetest.RunLocal(t, func(t *testing.T) gatetest.LocalHarness {
		l, pool := newLedger(t)
		ctx := context.Background()
		if _, err := pool.Exec(ctx, `CREATE TABLE conformance_rows (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			key text NOT NULL,
			n integer NOT NULL CONSTRAINT positive CHECK (n > 0))`); err != nil {
			t.Fatal(err)
		}
		return gatetest.LocalHarness{
			LedgerHarness: ledgerHarness(l),
			Local:         l,
			Route: func(refuse bool) *gate.Route {
				n := "1"
				if refuse {
					n = "-1" // the CHECK refuses it: SQLSTATE 23514, terminal
				}
				return &gate.Route{Name: "orders", Shape: gate.ShapeLocal, Local: &gate.LocalSpec{
					SQL:    `INSERT INTO conformance_rows (key, n) VALUES ($1, ` + n + `) RETURNING id`,
					Params: []gate.LocalParam{{Kind: gate.ParamIdempotencyKey}}, Timeout: 5 * time.Second}}
			},
			Rows: func(t *testing.T, key string) int {
				t.Helper()
				var n int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM conformance_rows WHERE key = $1`, key).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			},
		}
	})
}
