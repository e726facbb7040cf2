package storage

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
)

// The write path's statements find operations by index, whatever the
// ledger held when a session planned them. A gateway session plans each
// statement once (generic plans) and keeps the plan; planned on an empty
// ledger, a statement that joined its batch to operations by hashing a
// sequential scan would go on scanning the whole table for every batch as
// the ledger grew (PlanAsLookups says how that was seen). Here a session
// runs the claim, row and change statements on an empty ledger, the ledger
// grows to 20,000 operations with nothing to plan again, and the same
// session runs them again: the transaction's own table counters must show
// index scans only.
func TestWriteStatementsPlanAsLookups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.DatabaseURL(t)
	if err := Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	pool, err := NewPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	l := NewLedger(pool)
	// No ANALYZE of the grown table may plan the statements again.
	if _, err := pool.Exec(ctx, `ALTER TABLE operations SET (autovacuum_enabled = off)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE)`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)

	at := time.Now()
	// round claims four operations, then confirms two (the row statement)
	// and parks two indeterminate (the change statement), each step its own
	// batch through q, as group commit sends them.
	round := func(q querier, tag string) {
		t.Helper()
		var claims, settles []*job
		for i := range 4 {
			op := benchOperation(fmt.Sprintf("%s-%d", tag, i), at)
			claims = append(claims, &job{kind: claimJob, id: op.ID, change: benchCreating(op, at)})
			c := benchConfirm(op, at)
			if i%2 == 1 {
				w := gate.Settling(&gate.Operation{ID: op.ID, State: gate.StatePendingEffect}, 1,
					&gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown, Reason: "timeout"}, nil,
					gate.LeaseFacts{Deadline: at.Add(time.Minute)})
				c = gate.IndeterminateChange(w, []gate.Step{{Transition: gate.Transition{
					From: gate.StatePendingEffect, To: gate.StateEffectIndeterminate}}}, gate.LaneOperator, "lost", at)
			}
			settles = append(settles, &job{kind: changeJob, id: op.ID, change: c})
		}
		for _, batch := range [][]*job{claims, settles} {
			results, err := l.run(ctx, q, batch)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range results {
				if r.err != nil {
					t.Fatal(r.err)
				}
			}
		}
	}
	round(conn, "planned")
	if _, err := pool.Exec(ctx, `INSERT INTO operations (created_at, retain_until, fingerprint_version, id, route,
		tenant, key_source, key, scope_key, fingerprint, shape, dead_letter_policy, contract_version,
		idempotency_key, broker, source, message_id, fence, state, updated_at)
		SELECT now(), now() + interval '1 day', 1, 'op_grown-' || g, 'r', 't', 'message_id', 'grown-' || g,
			't/r/message_id:/grown-' || g, 'v1:grown-' || g, 'idempotent', 'broker', 'c1', 'ik_grown-' || g,
			'pubsub', 's', 'm-' || g, 1, 'pending_effect', now()
		FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the round's writes are not wanted
	round(tx, "grown")
	rows, err := tx.Query(ctx, `SELECT relname, seq_scan, coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables`)
	if err != nil {
		t.Fatal(err)
	}
	var (
		name                 string
		seq, idx, operations int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &seq, &idx}, func() error {
		if seq > 0 {
			t.Errorf("the write path scanned %s sequentially %d times", name, seq)
		}
		if name == "operations" {
			operations = idx
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if operations == 0 {
		t.Error("the write path read operations by no index: the counters saw nothing")
	}
}
