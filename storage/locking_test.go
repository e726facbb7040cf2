package storage_test

// Statements that lock rows with FOR UPDATE SKIP LOCKED and then write them
// must run their locking subquery once per pass, whatever the statistics
// their generic plan was made from (outbox.go says why).

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/storage"
)

// The statements that lock outbox entries run their locking subquery once
// per pass (per route for the relay's round), whatever the outbox held when
// their plan was made. A relay polls an outbox drained between bursts, so a
// gateway session plans its statements (generic plans, kept until the next
// ANALYZE) while the outbox is empty and keeps them through the burst. A
// statement that joined its locking subquery to the outbox was planned as
// a scan of the whole outbox running that subquery once per entry: a burst
// of 2,000 handoffs took the relay 12 s instead of 1.5.
func TestOutboxStatementsLockOncePerPass(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	// A ledger with history and a drained outbox, as autovacuum leaves it.
	for i := range 200 {
		createPending(t, l, newOperation(fmt.Sprintf("lock-once-plain-%03d", i)))
	}
	// Each is planned, and run once, while the outbox is empty.
	statements := []lockingStatement{
		{"relay_round", storage.ClaimEachSQL, "text[], int[], float8", "'{orders}', '{16}', 30"},
		{"claim", storage.ClaimOutboxSQL, "text[], int, float8", "'{orders}', 16, 30"},
		{"sweep", storage.SweepOutboxSQL, "int", "16"},
	}
	conn := planOnEmpty(t, pool, statements...)
	const n = 60
	for i := range n {
		op := handoffOp(fmt.Sprintf("lock-once-%02d", i))
		create(t, l, creatingHandoff(t, op, handedOffMessage(fmt.Sprintf("m-%02d", i)), t0))
	}
	for _, st := range statements {
		t.Run(st.name, func(t *testing.T) { wantOneLock(t, conn, st.name, st.args, n) })
	}
}

// The reconciler's claim of due indeterminate operations likewise, planned
// on a ledger analyzed while empty (a new deployment) and run once it holds
// work to check.
func TestReconcilerClaimLocksOncePerPass(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	const args = "'orders', 1000000, 30000000, 16"
	conn := planOnEmpty(t, pool, lockingStatement{"claim_due", storage.ClaimDueSQL, "text, bigint, bigint, int", args})
	const n = 60
	for i := range n {
		op := newOperation(fmt.Sprintf("due-%02d", i))
		op.Shape = gate.ShapeLookup
		createPending(t, l, op)
		must(t, l.Write(ctx, gate.IndeterminateChange(
			settling(op.ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown, Reason: "timeout"}, 1),
			steps(t, gate.StatePendingEffect, gate.StateEffectIndeterminate), gate.LaneOperator, "lost", t0)))
	}
	if locked := wantOneLock(t, conn, "claim_due", args, n); locked != 16 {
		t.Errorf("the claim locked %v operations of %d due, want its limit of 16", locked, n)
	}
}

// The retention purge of poison records likewise, for one route and for
// the routes that left the routes file, planned while the table was empty.
func TestPoisonPurgeLocksOncePerPass(t *testing.T) {
	t.Parallel()
	_, pool := newLedger(t)
	ctx := context.Background()
	statements := []lockingStatement{
		{"purge_route", storage.PurgePoisonSQL(false), "text, timestamptz, int", "'orders', now(), 16"},
		{"purge_others", storage.PurgePoisonSQL(true), "text[], timestamptz, int", "'{kept}', now(), 16"},
	}
	conn := planOnEmpty(t, pool, statements...)
	const n = 60
	if _, err := pool.Exec(ctx, `INSERT INTO poison_messages (route, fingerprint, broker, reason, first_seen, last_seen, acked)
		SELECT 'orders', 'fp-' || g, 'pubsub', 'malformed', now() - interval '1 day', now() - interval '1 day', true
		FROM generate_series(1, $1) g`, n); err != nil {
		t.Fatal(err)
	}
	for _, st := range statements {
		t.Run(st.name, func(t *testing.T) {
			if locked := wantOneLock(t, conn, st.name, st.args, n); locked != 16 {
				t.Errorf("the purge locked %v records of %d due, want its limit of 16", locked, n)
			}
		})
	}
}

// lockingStatement is a statement prepared under name with its parameter
// types, and the arguments a test runs it with.
type lockingStatement struct{ name, sql, types, args string }

// planOnEmpty analyzes the ledger as it is, takes a session of its own (as
// a gateway's, which keeps its generic plans), and prepares and runs each
// statement there once, so each is planned from these statistics.
func planOnEmpty(t *testing.T, pool *pgxpool.Pool, statements ...lockingStatement) *pgxpool.Conn {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE)`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	for _, st := range statements {
		if _, err := conn.Exec(ctx, "PREPARE "+st.name+"("+st.types+") AS "+st.sql); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "EXECUTE "+st.name+"("+st.args+")"); err != nil {
			t.Fatal(err)
		}
	}
	return conn
}

// wantOneLock runs prepared statement name with args under EXPLAIN ANALYZE,
// in a transaction it rolls back, and fails unless its locking subquery ran
// once over the n rows it could take. It returns how many rows it locked.
func wantOneLock(t *testing.T, conn *pgxpool.Conn, name, args string, n int) (locked float64) {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the statement's writes are not wanted
	var raw []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE "+name+"("+args+")").Scan(&raw); err != nil {
		t.Fatal(err)
	}
	nodes, err := storage.PlanNodes(raw)
	if err != nil {
		t.Fatal(err)
	}
	locks := 0.0
	for _, node := range nodes {
		if node.Type == "LockRows" {
			locks += node.Loops
			locked += node.Rows
		}
	}
	if locks != 1 {
		t.Errorf("the locking subquery ran %v times for one pass over %d rows, want 1:\n%v", locks, n, nodes)
	}
	return locked
}
