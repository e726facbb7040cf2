package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/jackc/pgx/v5"
)

// The two shapes whose evidence is a commit write outside the shared
// commits of write.go: each needs more than the named change in its
// transaction (an outbox entry; the route's own statement). They run the
// same ackgate_write as everyone else, so the same guards judge them.

var _ gate.Local = (*Ledger)(nil)

// writeIn runs one named change inside tx.
func writeIn(ctx context.Context, tx pgx.Tx, c *gate.Change) error {
	wire, err := encode(c)
	if err != nil {
		return fmt.Errorf("storage: write: %w", err)
	}
	var answer string
	if err := tx.QueryRow(ctx, `SELECT ackgate_write($1::jsonb)`, wire).Scan(&answer); err != nil {
		return translate("write", err)
	}
	return answerError(answer)
}

// handoff commits a handoff route's claim with its outbox entry.
func (l *Ledger) handoff(ctx context.Context, c *gate.Change) error {
	e, m := c.Outbox, c.Outbox.Message
	attrs, err := json.Marshal(m.Attributes)
	if err != nil {
		return fmt.Errorf("storage: handoff: %w", err)
	}
	var published *time.Time
	if !m.PublishTime.IsZero() {
		published = &m.PublishTime
	}
	err = pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if err := writeIn(ctx, tx, c); err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO outbox (operation_id, route, publication_id, broker, source, message_id,
				publish_time, ordering_key, attributes, data, created_at, next_attempt_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
			ON CONFLICT (operation_id) DO NOTHING`,
			e.OperationID, e.Route, e.PublicationID, m.Broker, m.Source, m.MessageID, published,
			m.OrderingKey, attrs, nonNilBytes(m.Data), orNow(e.CreatedAt), orNow(e.NextAttemptAt))
		b.Queue(`UPDATE operations SET handed_off_at = $2 WHERE id = $1 AND handed_off_at IS NULL`,
			c.OperationID, orNow(c.At))
		return tx.SendBatch(ctx, b).Close()
	})
	return translate("handoff", err)
}

func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// Apply implements gate.Local: the claim, the statement and its settlement
// in one transaction. The statement runs inside a savepoint, under the
// route's role and timeout, so its failure takes back its own writes and
// nothing else, and the settlement records that failure.
func (l *Ledger) Apply(ctx context.Context, start *gate.Change, req *gate.EffectRequest, settle func(gate.EffectResult) (*gate.Change, error)) error {
	spec := req.Route.Local
	if spec == nil {
		return fmt.Errorf("storage: local: route %s has no statement", req.Route.Name)
	}
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if err := writeIn(ctx, tx, start); err != nil {
			return err
		}
		res, err := runLocal(ctx, tx, spec, req)
		if err != nil {
			return err
		}
		c, err := settle(res)
		if err != nil {
			return err
		}
		return writeIn(ctx, tx, c)
	})
	return translate("local", err)
}
