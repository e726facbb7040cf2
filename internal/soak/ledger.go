package soak

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// readLedger reads what the checker needs straight from the ledger's tables,
// in one snapshot. It depends on the schema (storage/migrations), not on the
// gateway's Go packages, so the soak keeps working while their insides change.
func readLedger(ctx context.Context, dbURL string) (map[string]LedgerOp, map[string][]string, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, nil, fmt.Errorf("ledger: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, nil, fmt.Errorf("ledger: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))

	ops := map[string]LedgerOp{}
	rows, err := tx.Query(ctx, `
		SELECT o.id, o.route, o.key, o.idempotency_key, o.state, o.result_id,
		       coalesce(o.conflict_of, ''), o.reason,
		       (SELECT count(*) FROM attempts a WHERE a.operation_id = o.id AND a.kind = 'effect'),
		       coalesce((SELECT d.reason FROM dead_letters d WHERE d.operation_id = o.id), '')
		FROM operations o`)
	if err != nil {
		return nil, nil, fmt.Errorf("ledger: operations: %w", err)
	}
	for rows.Next() {
		var op LedgerOp
		if err := rows.Scan(&op.ID, &op.Route, &op.Key, &op.IdempotencyKey, &op.State, &op.ResultID,
			&op.ConflictOf, &op.Reason, &op.Attempts, &op.DeadLetter); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("ledger: operations: %w", err)
		}
		ops[op.ID] = op
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("ledger: operations: %w", err)
	}

	traces := map[string][]string{}
	rows, err = tx.Query(ctx, `SELECT DISTINCT trace_id, operation_id FROM deliveries WHERE trace_id <> ''`)
	if err != nil {
		return nil, nil, fmt.Errorf("ledger: deliveries: %w", err)
	}
	for rows.Next() {
		var trace, op string
		if err := rows.Scan(&trace, &op); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("ledger: deliveries: %w", err)
		}
		traces[trace] = append(traces[trace], op)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("ledger: deliveries: %w", err)
	}
	return ops, traces, nil
}
