package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/jackc/pgx/v5"
)

// The steps whose transaction holds more than a named change: a local
// route's statement, run between the claim that records its attempt and
// the change that records its result; and a handoff that takes an existing
// operation, which writes its outbox entry beside the change. Each runs the
// same named statements as every other write (a batch of one), so the same
// compare-and-set and guards judge it.

var _ gate.Local = (*Ledger)(nil)

// writeIn runs one named change inside tx and returns its answer.
func (l *Ledger) writeIn(ctx context.Context, tx pgx.Tx, c *gate.Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	r, err := l.run(ctx, tx, []*job{{kind: changeJob, id: c.OperationID, change: c}})
	if err != nil {
		return translate("write", err)
	}
	return r[0].err
}

// handoff commits a change that hands an existing operation off, with its
// outbox entry.
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
	sealed, err := l.sealEntry(e)
	if err != nil {
		return err
	}
	var pointers []byte
	if sealed.sealedWith != nil {
		if pointers, err = json.Marshal(sealed.pointers); err != nil {
			return fmt.Errorf("storage: handoff: %w", err)
		}
	}
	err = pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if err := l.writeIn(ctx, tx, c); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO outbox (operation_id, route, publication_id, broker, source, message_id,
				publish_time, ordering_key, attributes, data, sealed_with, sealed_pointers, created_at, next_attempt_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
			ON CONFLICT (operation_id) DO NOTHING`,
			e.OperationID, e.Route, e.PublicationID, m.Broker, m.Source, m.MessageID, published,
			m.OrderingKey, attrs, sealed.data, sealed.sealedWith, pointers, orNow(e.CreatedAt), orNow(e.NextAttemptAt))
		return err
	})
	return translate("handoff", err)
}

// Apply implements gate.Local: the claim (unless the operation's creation
// recorded the attempt already), the statement and its settlement in one
// transaction. The statement runs inside a savepoint, under the route's
// role and timeout, so its failure takes back its own writes and nothing
// else, and the settlement records that failure.
func (l *Ledger) Apply(ctx context.Context, start *gate.Change, req *gate.EffectRequest, settle func(gate.EffectResult) (*gate.Change, error)) error {
	spec := req.Route.Local
	if spec == nil {
		return fmt.Errorf("storage: local: route %s has no statement", req.Route.Name)
	}
	var found *gate.Operation
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		switch {
		case start != nil && start.Claim != nil && start.Claim.Row != nil:
			// A creating claim: if it finds the operation, it has recorded
			// the delivery against it, which commits, and nothing else runs.
			if err := checkClaim(start); err != nil {
				return err
			}
			r, err := l.run(ctx, tx, []*job{{kind: claimJob, id: start.OperationID, change: start}})
			if err != nil {
				return translate("claim", err)
			}
			if r[0].err != nil {
				return r[0].err
			}
			if !r[0].created {
				found = r[0].op
				return nil
			}
		case start != nil:
			if err := l.writeIn(ctx, tx, start); err != nil {
				return err
			}
		}
		res, err := runLocal(ctx, tx, spec, req)
		if err != nil {
			return err
		}
		c, err := settle(res)
		if err != nil {
			return err
		}
		return l.writeIn(ctx, tx, c)
	})
	if err == nil && found != nil {
		return &gate.Found{Op: found}
	}
	return translate("local", err)
}
