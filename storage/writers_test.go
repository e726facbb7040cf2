package storage_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ackgate/ackgate/gate"
)

// The ledger's bookkeeping is the database's own: a writer other than
// ackgate_write (an operator's resolution in plain SQL, say) appends to the
// log and then moves the row in one transaction, and needs nothing else; a
// row moved without its log is refused (TestLedgerRefusesRawSQL).
func TestPlainSQLWriterNeedsOnlyTheLogAndTheRow(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	op := newOperation("plain")
	createPending(t, l, op)

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO transitions (operation_id, from_state, to_state, at, fence, reason)
			VALUES ($1, 'pending_effect', 'effect_indeterminate', now(), 1, 'operator: unknown')`, op.ID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE operations SET state = 'effect_indeterminate', lane = 'operator', updated_at = now()
			WHERE id = $1`, op.ID)
		return err
	})
	if err != nil {
		t.Fatalf("log then row in one transaction: %v", err)
	}
	rec := mustGet(t, l, op.ID)
	if rec.State != gate.StateEffectIndeterminate || len(rec.Events) != 4 || rec.Events[3].Seq != 4 {
		t.Fatalf("after the plain writer: state %s, %d events", rec.State, len(rec.Events))
	}

	// ackgate_write still finds the log where the plain writer left it.
	c := gate.TerminalChange(settling(op.ID, gate.StateEffectIndeterminate, 1, nil, 0),
		steps(t, gate.StateEffectIndeterminate, gate.StateTerminalFailure), nil, "operator: gave up", time.Now())
	if err := l.Write(ctx, c); err != nil {
		t.Fatalf("ackgate_write after the plain writer: %v", err)
	}
	if rec := mustGet(t, l, op.ID); rec.State != gate.StateTerminalFailure || len(rec.Events) != 5 {
		t.Fatalf("after ackgate_write: state %s, %d events", rec.State, len(rec.Events))
	}
}
