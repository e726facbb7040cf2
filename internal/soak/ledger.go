package soak

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
		       (o.a1_started_at IS NOT NULL)::int
		           + (SELECT count(*) FROM attempts a WHERE a.operation_id = o.id AND a.kind = 'effect'),
		       coalesce((SELECT d.reason FROM dead_letters d WHERE d.operation_id = o.id ORDER BY d.id DESC LIMIT 1), ''),
		       o.handed_off_at IS NOT NULL, e.operation_id IS NOT NULL, e.delivered_at IS NOT NULL
		FROM operations o LEFT JOIN outbox e ON e.operation_id = o.id`)
	if err != nil {
		return nil, nil, fmt.Errorf("ledger: operations: %w", err)
	}
	for rows.Next() {
		var op LedgerOp
		if err := rows.Scan(&op.ID, &op.Route, &op.Key, &op.IdempotencyKey, &op.State, &op.ResultID,
			&op.ConflictOf, &op.Reason, &op.Attempts, &op.DeadLetter,
			&op.HandedOff, &op.Outbox, &op.OutboxDelivered); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("ledger: operations: %w", err)
		}
		ops[op.ID] = op
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("ledger: operations: %w", err)
	}

	traces := map[string][]string{}
	// Every delivery's trace: the first's on the operation's row, the
	// further ones' beside it.
	rows, err = tx.Query(ctx, `SELECT trace_id, id FROM operations WHERE trace_id <> ''
		UNION SELECT trace_id, operation_id FROM deliveries WHERE trace_id <> ''`)
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

// createLocalTable makes the local route's table in the ledger's database,
// where its statement runs in the ledger's own transaction.
func createLocalTable(ctx context.Context, dbURL string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("local table: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, localTable); err != nil {
		return fmt.Errorf("local table: %w", err)
	}
	return nil
}

// openHandoffs counts handed-off operations the relay has not settled yet:
// neither confirmed, parked nor terminal.
func openHandoffs(ctx context.Context, dbURL string) (int, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int
	err = conn.QueryRow(ctx, `
		SELECT count(*) FROM outbox e JOIN operations o ON o.id = e.operation_id
		WHERE e.delivered_at IS NULL AND o.state IN ('received', 'reserved', 'pending_effect')`).Scan(&n)
	return n, err
}

// readLocalRows reads every row the local route's statement wrote, with a
// digest of the data it was given, so that a row can be matched to the
// published payload without trusting the ledger.
func readLocalRows(ctx context.Context, dbURL, route string) ([]LocalRow, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("local rows: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT id::text, idempotency_key, operation_id, data FROM soak_local_effects ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("local rows: %w", err)
	}
	var out []LocalRow
	for rows.Next() {
		var (
			lr   = LocalRow{Route: route}
			data []byte
		)
		if err := rows.Scan(&lr.ID, &lr.Key, &lr.OperationID, &data); err != nil {
			rows.Close()
			return nil, fmt.Errorf("local rows: %w", err)
		}
		sum := sha256.Sum256(data)
		lr.BodySHA256 = hex.EncodeToString(sum[:])
		out = append(out, lr)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("local rows: %w", err)
	}
	return out, nil
}
