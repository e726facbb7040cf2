// Package storage adapts Postgres (the evidence ledger) and Redis (short
// reservations with fencing tokens) to the ports the gate declares.
//
// Postgres is the authority. The schema in migrations/ refuses illegal
// transitions, fences going backwards and rewrites of history by itself, so the
// Go code here cannot produce evidence the lifecycle forbids even by mistake.
package storage

import (
	"cmp"
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
// Every named change is one call of ackgate_write on the server
// (migrations/0008_one_write_per_step.sql), or one share of a call of
// ackgate_write_batch (0017), which checks the change's guard, appends its
// log entries and writes the operation row once; the
// triggers of migrations/0003_guards.sql and 0008 judge every edge, so
// nothing here can record a path the lifecycle forbids. Concurrent changes
// share statements and commits (write.go).
type Ledger struct {
	pool   *pgxpool.Pool
	commit committer
}

var _ gate.Ledger = (*Ledger)(nil)

// NewLedger uses pool for every call; the pool belongs to the caller.
func NewLedger(pool *pgxpool.Pool) *Ledger { return &Ledger{pool: pool} }

// operationColumns and operationFields change together: one names the columns,
// the other where each lands.
const operationColumns = `o.id, o.scope_key, o.tenant, o.route, o.key_source, o.key, o.fingerprint,
	o.fingerprint_version, coalesce(o.conflict_of, ''), o.state, o.shape, o.dead_letter_policy,
	o.contract_version, o.idempotency_key, o.fence, o.owner, o.lease_start, o.lease_deadline,
	o.lease_extensions, o.lease_lost_at, o.delivery_count, o.attempt_count, o.first_attempt_at, o.result_id,
	o.evidence_at, o.acked_at, o.reason, o.lane, o.trace_id, o.span_id, o.created_at, o.updated_at,
	o.retain_until, o.grant_through, o.next_check_at, o.checks, o.handed_off_at`

func operationFields(o *gate.Operation) []any {
	return []any{&o.ID, &o.ScopeKey, &o.Tenant, &o.Route, &o.KeySource, &o.Key, &o.Fingerprint,
		&o.FingerprintVersion, &o.ConflictOf, &o.State, &o.Shape, &o.DeadLetterPolicy,
		&o.ContractVersion, &o.IdempotencyKey, &o.Fence, &o.Owner, &o.LeaseStart, &o.LeaseDeadline,
		&o.LeaseExtensions, &o.LeaseLostAt, &o.DeliveryCount, &o.AttemptCount, &o.FirstAttemptAt, &o.ResultID,
		&o.EvidenceAt, &o.AckedAt, &o.Reason, &o.Lane, &o.TraceID, &o.SpanID, &o.CreatedAt, &o.UpdatedAt,
		&o.RetainUntil, &o.Grant, &o.NextCheckAt, &o.Checks, &o.HandedOffAt}
}

// findSQL returns the operation and its newest effect attempt in one query:
// Find is the only read on the hot path and the gate needs both to decide.
const findSQL = `
SELECT ` + operationColumns + `,
	a.n, a.kind, a.idempotency_key, a.fence, a.started_at, a.finished_at, a.outcome,
	a.status_code, a.result_id, a.reason
FROM operations o
LEFT JOIN LATERAL (
	SELECT * FROM attempts
	WHERE operation_id = o.id AND kind = 'effect'
	ORDER BY n DESC LIMIT 1
) a ON true
`

// Find costs one round trip.
func (l *Ledger) Find(ctx context.Context, scopeKey string) (*gate.Operation, error) {
	op, err := scanFound(l.pool.QueryRow(ctx, findSQL+`WHERE o.scope_key = $1 AND o.conflict_of IS NULL`, scopeKey))
	return op, translate("find", err)
}

// FindByID implements gate.Ledger: the operation as Find reads it, and its
// latest manual intervention, in one round trip.
func (l *Ledger) FindByID(ctx context.Context, id string) (*gate.Operation, *gate.Intervention, error) {
	if gate.Unstorable(id) != "" {
		return nil, nil, fmt.Errorf("storage: find by id: %w", gate.ErrNotFound)
	}
	var (
		op *gate.Operation
		iv *gate.Intervention
	)
	b := &pgx.Batch{}
	b.Queue(findSQL+`WHERE o.id = $1`, id).QueryRow(func(r pgx.Row) error {
		var err error
		op, err = scanFound(r)
		return err
	})
	b.Queue(`SELECT kind, actor, reason, result_id, from_state, to_state, fence, at
		FROM manual_interventions WHERE operation_id = $1 ORDER BY seq DESC LIMIT 1`, id).
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

func interventionFields(iv *gate.Intervention) []any {
	return []any{&iv.Kind, &iv.Actor, &iv.Reason, &iv.ResultID, &iv.From, &iv.To, &iv.Fence, &iv.At}
}

func scanFound(r pgx.Row) (*gate.Operation, error) {
	var (
		op gate.Operation
		a  struct {
			n, status                            *int
			kind, key, outcome, resultID, reason *string
			fence                                *int64
			started, finished                    *time.Time
		}
	)
	dest := append(operationFields(&op), &a.n, &a.kind, &a.key, &a.fence, &a.started, &a.finished,
		&a.outcome, &a.status, &a.resultID, &a.reason)
	if err := r.Scan(dest...); err != nil {
		return nil, err
	}
	if a.n != nil {
		op.LastAttempt = &gate.Attempt{
			N: *a.n, Kind: gate.AttemptKind(*a.kind), IdempotencyKey: *a.key, Fence: *a.fence,
			StartedAt: *a.started, FinishedAt: a.finished, Outcome: gate.Outcome(*a.outcome),
			StatusCode: *a.status, ResultID: *a.resultID, Reason: *a.reason,
		}
	}
	return &op, nil
}

const insertOperationSQL = `
INSERT INTO operations (id, scope_key, tenant, route, key_source, key, fingerprint,
	fingerprint_version, conflict_of, state, shape, dead_letter_policy, contract_version,
	idempotency_key, fence, owner, lease_start, lease_deadline, lease_extensions, result_id,
	evidence_at, acked_at, reason, lane, trace_id, span_id, created_at, updated_at, retain_until)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20,
	$21, $22, $23, $24, $25, $26, $27, $28, $29)`

// insertOperationArgs leaves the counters and first_attempt_at out: the
// statements that insert deliveries and attempts maintain them.
func insertOperationArgs(o *gate.Operation) []any {
	return []any{o.ID, o.ScopeKey, o.Tenant, o.Route, o.KeySource, o.Key, o.Fingerprint,
		o.FingerprintVersion, nullIfEmpty(o.ConflictOf), o.State, o.Shape, o.DeadLetterPolicy,
		o.ContractVersion, o.IdempotencyKey, o.Fence, o.Owner, o.LeaseStart, o.LeaseDeadline,
		o.LeaseExtensions, o.ResultID, o.EvidenceAt, o.AckedAt, o.Reason, o.Lane, o.TraceID,
		o.SpanID, o.CreatedAt, o.UpdatedAt, o.RetainUntil}
}

// Write implements gate.Ledger. It costs a share of one statement and one
// commit (see write.go).
func (l *Ledger) Write(ctx context.Context, c *gate.Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if c.Intervene != nil {
		return l.intervene(ctx, c)
	}
	if c.Kind == gate.ChangeHandoff {
		return l.handoff(ctx, c)
	}
	wire, err := encode(c)
	if err != nil {
		return fmt.Errorf("storage: write: %w", err)
	}
	return l.write(ctx, c.OperationID, wire)
}

// checkChange refuses a change no constructor in gate builds, before it
// reaches the server.
func checkChange(c *gate.Change) error {
	switch {
	case c == nil || c.OperationID == "":
		return errors.New("storage: write: the change names no operation")
	case c.Kind == gate.ChangeAcked && (c.Claim != nil || c.Settle != nil):
		return errors.New("storage: write: an acked change neither claims nor settles")
	case (c.Kind == gate.ChangeResolve || c.Kind == gate.ChangeReconcile) != (c.Intervene != nil),
		c.Intervene != nil && (c.Claim != nil || c.Settle != nil || c.Expect == ""):
		return fmt.Errorf("storage: write: a %s change intervenes on an existing operation, and only it does", c.Kind)
	case c.Intervene != nil:
	case c.Kind != gate.ChangeAcked && (c.Claim == nil) == (c.Settle == nil):
		return fmt.Errorf("storage: write: a %s change either claims or settles", c.Kind)
	case c.Claim != nil && c.Claim.Row != nil && (c.Claim.Row.ID != c.OperationID || len(c.Steps) == 0):
		return errors.New("storage: write: a creating claim needs its row and at least one step")
	case c.Expect == "" && (c.Claim == nil || c.Claim.Row == nil):
		return errors.New("storage: write: only a creating claim may skip the state guard")
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

const (
	// seq is assigned by the ledger's trigger.
	insertTransitionSQL = `
INSERT INTO transitions (operation_id, from_state, to_state, at, fence, message_id, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7)`

	insertDeliverySQL = `
WITH counted AS (
	UPDATE operations SET delivery_count = delivery_count + 1 WHERE id = $1 RETURNING id
)
INSERT INTO deliveries (operation_id, broker, source, message_id, broker_attempt, received_at,
	decision, reason, anomaly, trace_id, owner, publish_time)
SELECT id, $2::text, $3::text, $4::text, $5::integer, $6::timestamptz, $7::text, $8::text,
	$9::text, $10::text, $11::text, $12::timestamptz
FROM counted
RETURNING id`

	// A lease-taking delivery is answered once, by its owner token.
	answerDeliverySQL = `
UPDATE deliveries SET decision = $3, reason = CASE WHEN $4::text = '' THEN reason ELSE $4::text END
WHERE operation_id = $1 AND owner = $2 AND decision = ''`

	insertDeadLetterSQL = `
INSERT INTO dead_letters (operation_id, reason, at) VALUES ($1, $2, $3)
ON CONFLICT (operation_id) DO NOTHING`
)

func deliveryArgs(opID string, d *gate.Delivery) []any {
	return []any{opID, d.Broker, d.Source, d.MessageID, d.BrokerAttempt, d.ReceivedAt, d.Decision,
		d.Reason, d.Anomaly, d.TraceID, d.Owner, d.PublishTime}
}

// RecordConflict takes an explicit transaction (four round trips) because
// what it writes depends on whether the record already exists; conflicts are
// rare, and that is not worth pushing into SQL.
func (l *Ledger) RecordConflict(ctx context.Context, c *gate.Conflict) (*gate.Operation, error) {
	if c.Original == nil || c.Record == nil || c.Record.ID == "" {
		return nil, errors.New("storage: record conflict: the conflict needs its original and its record")
	}
	at := orNow(c.At)
	row := *c.Record
	row.ConflictOf = c.Original.ID
	row.State = gate.StateConflicting
	// A conflict record is never reserved: it is not going to be executed.
	row.Fence, row.Owner, row.LeaseStart, row.LeaseDeadline, row.LeaseExtensions = 0, "", nil, nil, 0
	if row.CreatedAt.IsZero() {
		row.CreatedAt = at
	}
	row.UpdatedAt = at

	var stored gate.Operation
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, insertOperationSQL+` ON CONFLICT (id) DO NOTHING`, insertOperationArgs(&row)...)
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		if tag.RowsAffected() == 1 {
			msg := ""
			if c.Delivery != nil {
				msg = c.Delivery.MessageID
			}
			b.Queue(insertTransitionSQL, row.ID, nil, gate.StateReceived, at, 0, msg, "")
			b.Queue(insertTransitionSQL, row.ID, gate.StateReceived, gate.StateConflicting, at, 0, msg, row.Reason)
		}
		if c.Delivery != nil {
			b.Queue(insertDeliverySQL, deliveryArgs(row.ID, c.Delivery)...)
		}
		if dl := c.DeadLetter; dl != nil {
			b.Queue(insertDeadLetterSQL, row.ID, dl.Reason, cmp.Or(dl.At, at))
		}
		b.Queue(`SELECT `+operationColumns+` FROM operations o WHERE o.id = $1`, row.ID).
			QueryRow(func(r pgx.Row) error { return r.Scan(operationFields(&stored)...) })
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return nil, translate("record conflict", err)
	}
	return &stored, nil
}

// RecordDelivery shares a commit with concurrent writes, like Write.
// gate.ErrNotFound when the operation does not exist.
func (l *Ledger) RecordDelivery(ctx context.Context, d *gate.Delivery) error {
	wire, err := encodeDeliveryOnly(d)
	if err != nil {
		return err
	}
	return l.write(ctx, d.OperationID, wire)
}

// AnswerDelivery implements gate.Ledger: it fills in the decision of the
// undecided delivery written by a.Owner. No matching row is not an error:
// there is nothing left to answer.
func (l *Ledger) AnswerDelivery(ctx context.Context, operationID string, a *gate.Answer) error {
	_, err := l.pool.Exec(ctx, answerDeliverySQL, operationID, a.Owner, a.Decision, a.Reason)
	return translate("answer delivery", err)
}

// orNow stands in for a change time the caller forgot; the gate's own clock is
// the one that should be on the record.
func orNow(t time.Time) time.Time {
	if t.IsZero() {
		return time.Now()
	}
	return t
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
