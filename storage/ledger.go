// Package storage adapts Postgres (the evidence ledger) and Redis (short
// reservations with fencing tokens) to the ports the gate declares.
//
// Postgres is the authority. The schema (schema.sql) refuses illegal
// transitions, fences going backwards and rewrites of history by itself, so
// the Go code here cannot produce evidence the lifecycle forbids even by
// mistake.
package storage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Ledger is the Postgres evidence store.
//
// Each step of an operation is one plain statement of schema.sql: the claim
// that creates or finds it, the change that moves it, the answer of a
// delivery. Concurrent deliveries' steps share statements and commits
// (groupcommit.go).
type Ledger struct {
	pool   *pgxpool.Pool
	commit committer
	// sealer keeps the outbox's private values sealed (sealing.go); nil
	// when no route has any.
	sealer Sealer
	// handedOff is told of every outbox entry committed; nil when nobody
	// listens.
	handedOff func()
	// texts says how the write path hands text columns to pgx: as types pgx
	// knows only by their Postgres type where the pool's sessions have the
	// server describe each statement's parameters (batchargs.go, texts).
	texts texts
}

var _ gate.Ledger = (*Ledger)(nil)

// LedgerOption adjusts a new Ledger.
type LedgerOption func(*Ledger)

// OnHandoff has the ledger call f after it commits an outbox entry, so
// that a relay in the same process looks at once instead of at its next
// poll. f must not block.
func OnHandoff(f func()) LedgerOption { return func(l *Ledger) { l.handedOff = f } }

// NewLedger uses pool for every call; the pool belongs to the caller.
func NewLedger(pool *pgxpool.Pool, opts ...LedgerOption) *Ledger {
	l := &Ledger{pool: pool}
	if pool != nil {
		switch pool.Config().ConnConfig.DefaultQueryExecMode {
		case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
		default:
			l.texts.described = true
		}
	}
	for _, o := range opts {
		o(l)
	}
	return l
}

// Claim implements gate.Ledger. It costs a share of one statement and one
// commit (groupcommit.go). A claim that creates its operation reads
// nothing of it back and returns none; one that finds it returns it
// whole, with the newest effect attempt, from the same statement.
func (l *Ledger) Claim(ctx context.Context, c *gate.Change) (*gate.Operation, bool, error) {
	if err := checkClaim(c); err != nil {
		return nil, false, err
	}
	r := l.enqueue(ctx, &job{kind: claimJob, id: c.OperationID, change: c})
	if r.created && c.Outbox != nil {
		l.tellHandedOff()
	}
	return r.op, r.created, r.err
}

func (l *Ledger) tellHandedOff() {
	if l.handedOff != nil {
		l.handedOff()
	}
}

// FindByID implements gate.Ledger: the operation as Claim finds it, and
// its latest manual intervention, in one round trip.
func (l *Ledger) FindByID(ctx context.Context, id string) (*gate.Operation, *gate.Intervention, error) {
	if gate.Unstorable(id) != "" {
		return nil, nil, fmt.Errorf("storage: find by id: %w", gate.ErrNotFound)
	}
	var (
		op *gate.Operation
		iv *gate.Intervention
	)
	b := &pgx.Batch{}
	b.Queue(findSQL, id).QueryRow(func(r pgx.Row) error {
		var err error
		op, err = scanFound(r)
		return err
	})
	b.Queue(`SELECT `+interventionCols+` FROM interventions WHERE operation_id = $1 ORDER BY id DESC LIMIT 1`, id).
		Query(func(rows pgx.Rows) error {
			for rows.Next() {
				iv = &gate.Intervention{}
				if err := rows.Scan(interventionFields(iv)...); err != nil {
					return err
				}
			}
			return rows.Err()
		})
	if err := l.pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, nil, translate("find by id", err)
	}
	return op, iv, nil
}

const interventionCols = `kind, actor, reason, result_id, from_state, to_state, fence, at`

func interventionFields(iv *gate.Intervention) []any {
	return []any{&iv.Kind, &iv.Actor, &iv.Reason, &iv.ResultID, &iv.From, &iv.To, &iv.Fence, &iv.At}
}

// Write implements gate.Ledger. It costs a share of one statement and one
// commit (groupcommit.go); a handoff taking an existing operation writes
// its outbox entry too, in a transaction of its own.
func (l *Ledger) Write(ctx context.Context, c *gate.Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if c.Kind == gate.ChangeHandoff {
		err := l.handoff(ctx, c)
		if err == nil {
			l.tellHandedOff()
		}
		return err
	}
	return l.enqueue(ctx, &job{kind: changeJob, id: c.OperationID, change: c, lingers: c.Kind == gate.ChangeAcked}).err
}

// AnswerDelivery implements gate.Ledger. A delivery already answered, or
// not there, leaves nothing to answer, which is not an error.
func (l *Ledger) AnswerDelivery(ctx context.Context, operationID string, a *gate.Answer) error {
	if a == nil || a.N < 1 {
		return errors.New("storage: answer delivery: the answer names no delivery")
	}
	return l.enqueue(ctx, &job{kind: answerJob, id: operationID, answer: a}).err
}

// checkClaim refuses a claim no constructor in gate builds, before it
// reaches the server.
func checkClaim(c *gate.Change) error {
	switch {
	case c == nil || c.Claim == nil || c.Claim.Row == nil || c.Claim.Delivery == nil:
		return errors.New("storage: claim: a claim creates the operation with its first delivery")
	case c.Claim.Row.ID != c.OperationID || len(c.Steps) == 0:
		return errors.New("storage: claim: a creating claim needs its row and at least one step")
	case c.Fence != 1:
		return fmt.Errorf("storage: claim: a new operation's first fence is 1, not %d", c.Fence)
	}
	if err := checkSteps("", c.Steps); err != nil {
		return fmt.Errorf("storage: claim: %w", err)
	}
	switch c.Kind {
	case gate.ChangeStart, gate.ChangeTerminal, gate.ChangeHandoff:
		return nil
	}
	return fmt.Errorf("storage: claim: a %s change does not create an operation", c.Kind)
}

// checkChange refuses a change no constructor in gate builds.
func checkChange(c *gate.Change) error {
	switch {
	case c == nil || c.OperationID == "":
		return errors.New("storage: write: the change names no operation")
	case c.Claim != nil && c.Claim.Row != nil:
		return errors.New("storage: write: a creating claim goes through Claim")
	case c.Expect == "":
		return errors.New("storage: write: a change names the state it expects")
	case c.Kind == gate.ChangeAcked && (c.Claim != nil || c.Settle != nil):
		return errors.New("storage: write: an acked change neither claims nor settles")
	case (c.Kind == gate.ChangeResolve || c.Kind == gate.ChangeReconcile) != (c.Intervene != nil),
		c.Intervene != nil && (c.Claim != nil || c.Settle != nil):
		return fmt.Errorf("storage: write: a %s change intervenes on an existing operation, and only it does", c.Kind)
	case c.Intervene != nil:
	case c.Kind != gate.ChangeAcked && (c.Claim == nil) == (c.Settle == nil):
		return fmt.Errorf("storage: write: a %s change either claims or settles", c.Kind)
	}
	if err := checkSteps(c.Expect, c.Steps); err != nil {
		return fmt.Errorf("storage: write: %w", err)
	}
	switch c.Kind {
	case gate.ChangeStart, gate.ChangeConfirm, gate.ChangeIndeterminate, gate.ChangeTerminal,
		gate.ChangeRetryLater, gate.ChangeAcked, gate.ChangeResolve, gate.ChangeReconcile:
		return nil
	case gate.ChangeHandoff:
		if c.Outbox == nil || c.Claim == nil || c.Outbox.Message == nil || c.Outbox.OperationID != c.OperationID {
			return errors.New("storage: write: a handoff claims the operation with its outbox entry")
		}
		return nil
	}
	return fmt.Errorf("storage: write: unknown change kind %q", c.Kind)
}

// checkSteps refuses a path that does not begin at from or leaves the
// lifecycle: the log keeps a change's steps as they come, and its guard
// judges each edge but not their order.
func checkSteps(from gate.State, steps []gate.Step) error {
	cur := from
	for _, st := range steps {
		if st.From != cur || !(st.From == "" && st.To == gate.StateReceived || gate.CanTransition(st.From, st.To)) {
			return fmt.Errorf("%w: step %q -> %q does not continue the path at %q", ErrRefused, st.From, st.To, cur)
		}
		cur = st.To
	}
	return nil
}

// RecordConflict takes a transaction of its own: what it writes depends on
// whether the record already exists, and conflicts are rare.
func (l *Ledger) RecordConflict(ctx context.Context, c *gate.Conflict) (*gate.Operation, error) {
	if c.Original == nil || c.Record == nil || c.Record.ID == "" || c.Delivery == nil {
		return nil, errors.New("storage: record conflict: the conflict needs its original, its record and its delivery")
	}
	at := orNow(c.At)
	r, d := c.Record, c.Delivery
	created := r.CreatedAt
	if created.IsZero() {
		created = at
	}
	var stored *gate.Operation
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		var id string
		err := tx.QueryRow(ctx, `
			INSERT INTO operations (created_at, retain_until, publish_time, fingerprint_version, broker_attempt,
				id, route, tenant, key_source, key, scope_key, fingerprint, conflict_of, shape, dead_letter_policy,
				contract_version, idempotency_key, trace_id, broker, source, message_id, fence, waiting,
				d1_decision, d1_reason, reason, state, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21,
				0, 'conflicting', $22, $23, $24, 'conflicting', $1)
			ON CONFLICT (id) DO UPDATE SET delivery_count = operations.delivery_count + 1
			RETURNING id`,
			created, r.RetainUntil, d.PublishTime, r.FingerprintVersion, d.BrokerAttempt, r.ID, r.Route, r.Tenant,
			r.KeySource, r.Key, r.ScopeKey, r.Fingerprint, c.Original.ID, r.Shape, r.DeadLetterPolicy,
			r.ContractVersion, r.IdempotencyKey, d.TraceID, d.Broker, d.Source, d.MessageID,
			d.Decision, d.Reason, r.Reason).Scan(&id)
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		// A record that existed already gets this delivery as a further one.
		b.Queue(`INSERT INTO deliveries (operation_id, n, broker, source, message_id, broker_attempt, received_at,
				publish_time, trace_id, found, decision, reason)
			SELECT id, delivery_count, $2, $3, $4, $5, $6, $7, $8, state, $9, $10
			FROM operations WHERE id = $1 AND delivery_count > 1
			ON CONFLICT DO NOTHING`,
			r.ID, d.Broker, d.Source, d.MessageID, d.BrokerAttempt, d.ReceivedAt, d.PublishTime, d.TraceID,
			d.Decision, d.Reason)
		if dl := c.DeadLetter; dl != nil {
			// Once per record: a redelivered conflict is not dead-lettered again.
			b.Queue(`INSERT INTO dead_letters (operation_id, reason, at)
				SELECT $1, $2, $3 WHERE NOT EXISTS (SELECT 1 FROM dead_letters WHERE operation_id = $1)`,
				r.ID, dl.Reason, orNow(dl.At))
		}
		b.Queue(findSQL, r.ID).QueryRow(func(row pgx.Row) error {
			var err error
			stored, err = scanFound(row)
			return err
		})
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return nil, translate("record conflict", err)
	}
	return stored, nil
}

// orNow stands in for a change time the caller forgot; the gate's own clock is
// the one that should be on the record.
func orNow(t time.Time) time.Time {
	if t.IsZero() {
		return time.Now()
	}
	return t
}
