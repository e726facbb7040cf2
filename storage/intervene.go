package storage

import (
	"context"
	"fmt"

	"github.com/ackgate/ackgate/gate"
	"github.com/jackc/pgx/v5"
)

// intervene writes a resolution or a reconciliation (gate.Intervene) in a
// transaction of its own. These changes are rare and never on a delivery's
// path, so they do not join the shared commits of write.go; they pass the
// same triggers as every other writer, which judge each edge of the path.
func (l *Ledger) intervene(ctx context.Context, c *gate.Change) error {
	iv := c.Intervene
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		var (
			state       gate.State
			fence       int64
			attempts, n int
			conflict    bool
		)
		// By id alone, which only the primary key serves (see migration
		// 0016); a conflict record is not an operation one can take.
		err := tx.QueryRow(ctx, `SELECT state, fence, attempt_count, conflict_of IS NOT NULL FROM operations
			WHERE id = $1 FOR UPDATE`, c.OperationID).Scan(&state, &fence, &attempts, &conflict)
		if err == nil && conflict {
			err = pgx.ErrNoRows
		}
		if err != nil {
			return err
		}
		// Like a claim: only a strictly higher fence may take the operation.
		if fence >= c.Fence {
			return fmt.Errorf("fence %d, recorded %d: %w", c.Fence, fence, gate.ErrFenced)
		}
		if state != c.Expect {
			return fmt.Errorf("state %s, expected %s: %w", state, c.Expect, gate.ErrStateChanged)
		}
		final := state
		if len(c.Steps) > 0 {
			final = c.Steps[len(c.Steps)-1].To
		}
		b := &pgx.Batch{}
		// The log first: its trigger judges each edge, and the row's guard
		// lets the state move only to where the log now ends.
		for _, st := range c.Steps {
			b.Queue(insertTransitionSQL, c.OperationID, st.From, st.To, c.At, c.Fence, "", st.Reason)
		}
		b.Queue(`UPDATE operations SET
				state = $2::text, fence = $3, owner = $4, updated_at = $5, reason = $6,
				grant_through = CASE WHEN $7::integer > 0 THEN $7::integer ELSE grant_through END,
				next_check_at = $8, checks = $9,
				attempt_count = attempt_count + $10::boolean::integer,
				result_id = CASE WHEN $11::text <> '' THEN $11::text ELSE result_id END,
				evidence_at = CASE WHEN $11::text <> '' THEN $5 ELSE evidence_at END,
				lane = CASE WHEN $2::text = 'effect_indeterminate' THEN lane ELSE '' END
			WHERE id = $1`,
			c.OperationID, final, c.Fence, iv.Owner, c.At, c.Reason, iv.Grant, iv.NextCheckAt, iv.Checks,
			iv.Lookup != nil, c.ResultID)
		if a := iv.Lookup; a != nil {
			n = attempts + 1
			if a.N != n {
				return fmt.Errorf("lookup numbered %d, next attempt is %d: %w", a.N, n, gate.ErrStateChanged)
			}
			b.Queue(`INSERT INTO attempts (operation_id, n, kind, idempotency_key, fence, started_at,
					finished_at, outcome, status_code, result_id, reason)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
				c.OperationID, a.N, a.Kind, a.IdempotencyKey, c.Fence, a.StartedAt, a.FinishedAt,
				a.Outcome, a.StatusCode, a.ResultID, a.Reason)
		}
		if m := iv.Intervention; m != nil {
			b.Queue(`INSERT INTO manual_interventions (operation_id, seq, kind, actor, reason, result_id,
					from_state, to_state, fence, at)
				SELECT $1, coalesce(max(seq), 0) + 1, $2, $3, $4, $5, $6, $7, $8, $9
				FROM manual_interventions WHERE operation_id = $1`,
				c.OperationID, m.Kind, m.Actor, m.Reason, m.ResultID, m.From, m.To, c.Fence, m.At)
		}
		if dl := c.DeadLetter; dl != nil {
			b.Queue(insertDeadLetterSQL, c.OperationID, dl.Reason, dl.At)
		}
		return tx.SendBatch(ctx, b).Close()
	})
	return translate(string(c.Kind), err)
}
