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
	"strings"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Ledger is the Postgres evidence store.
//
// Every Write sends its whole change as one pipelined batch and no
// explicit transaction. PostgreSQL runs everything between two Sync messages as
// one implicit transaction: it commits at the Sync if every statement succeeded
// and rolls all of it back at the first error. So the change is still atomic,
// but it costs one network round trip and one commit instead of the three
// round trips of BEGIN, statements, COMMIT. The price is that nothing can be
// decided on the client between statements; every precondition is therefore
// checked on the server and fails by raising (ackgate_lock_operation,
// ackgate_require and the triggers in migrations/0003_guards.sql).
//
// pgx prepares each distinct statement once per connection, so the first use
// of a statement on a connection adds one round trip; after that the counts in
// the method docs hold.
type Ledger struct {
	pool *pgxpool.Pool
}

var _ gate.Ledger = (*Ledger)(nil)

// NewLedger uses pool for every call; the pool belongs to the caller.
func NewLedger(pool *pgxpool.Pool) *Ledger { return &Ledger{pool: pool} }

// operationColumns and operationFields change together: one names the columns,
// the other where each lands.
const operationColumns = `o.id, o.scope_key, o.tenant, o.route, o.key_source, o.key, o.fingerprint,
	o.fingerprint_version, coalesce(o.conflict_of, ''), o.state, o.shape, o.dead_letter_policy,
	o.contract_version, o.idempotency_key, o.fence, o.owner, o.lease_start, o.lease_deadline,
	o.lease_extensions, o.delivery_count, o.attempt_count, o.first_attempt_at, o.result_id,
	o.evidence_at, o.acked_at, o.reason, o.lane, o.trace_id, o.span_id, o.created_at, o.updated_at,
	o.retain_until`

func operationFields(o *gate.Operation) []any {
	return []any{&o.ID, &o.ScopeKey, &o.Tenant, &o.Route, &o.KeySource, &o.Key, &o.Fingerprint,
		&o.FingerprintVersion, &o.ConflictOf, &o.State, &o.Shape, &o.DeadLetterPolicy,
		&o.ContractVersion, &o.IdempotencyKey, &o.Fence, &o.Owner, &o.LeaseStart, &o.LeaseDeadline,
		&o.LeaseExtensions, &o.DeliveryCount, &o.AttemptCount, &o.FirstAttemptAt, &o.ResultID,
		&o.EvidenceAt, &o.AckedAt, &o.Reason, &o.Lane, &o.TraceID, &o.SpanID, &o.CreatedAt, &o.UpdatedAt,
		&o.RetainUntil}
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
WHERE o.scope_key = $1 AND o.conflict_of IS NULL`

// Find costs one round trip.
func (l *Ledger) Find(ctx context.Context, scopeKey string) (*gate.Operation, error) {
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
	if err := l.pool.QueryRow(ctx, findSQL, scopeKey).Scan(dest...); err != nil {
		return nil, translate("find", err)
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

// Write implements gate.Ledger. A claim that carries a new row creates the
// operation; every other change updates one under its guard.
func (l *Ledger) Write(ctx context.Context, c *gate.Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if c.Claim != nil && c.Claim.Row != nil {
		return l.create(ctx, c)
	}
	return l.apply(ctx, c)
}

// checkChange refuses a change no constructor in gate builds, before it
// reaches the server.
func checkChange(c *gate.Change) error {
	switch {
	case c == nil || c.OperationID == "":
		return errors.New("storage: write: the change names no operation")
	case c.Kind == gate.ChangeAcked && (c.Claim != nil || c.Settle != nil):
		return errors.New("storage: write: an acked change neither claims nor settles")
	case c.Kind != gate.ChangeAcked && (c.Claim == nil) == (c.Settle == nil):
		return fmt.Errorf("storage: write: a %s change either claims or settles", c.Kind)
	case c.Claim != nil && c.Claim.Row != nil && (c.Claim.Row.ID != c.OperationID || len(c.Steps) == 0):
		return errors.New("storage: write: a creating claim needs its row and at least one step")
	case c.Expect == "" && (c.Claim == nil || c.Claim.Row == nil):
		return errors.New("storage: write: only a creating claim may skip the state guard")
	}
	switch c.Kind {
	case gate.ChangeStart, gate.ChangeConfirm, gate.ChangeIndeterminate, gate.ChangeTerminal,
		gate.ChangeRetryLater, gate.ChangeAcked:
		return nil
	}
	return fmt.Errorf("storage: write: unknown change kind %q", c.Kind)
}

// create costs one round trip and one commit (see Ledger). The row is
// inserted in the state its first step enters, then moved one step at a time.
func (l *Ledger) create(ctx context.Context, c *gate.Change) error {
	at := orNow(c.At)
	row := *c.Claim.Row
	row.State = c.Steps[0].To
	row.Fence, row.Owner, row.TraceID = c.Fence, c.Claim.Owner, c.Claim.TraceID
	deadline := c.Claim.LeaseDeadline
	row.LeaseStart, row.LeaseDeadline, row.LeaseExtensions = &at, &deadline, 0
	row.Reason, row.ResultID, row.EvidenceAt, row.Lane, row.AckedAt = c.Reason, "", nil, "", nil
	switch c.Kind {
	case gate.ChangeConfirm:
		row.ResultID, row.EvidenceAt = c.ResultID, &at
	case gate.ChangeIndeterminate:
		row.Lane = c.Lane
	}
	if row.CreatedAt.IsZero() {
		row.CreatedAt = at
	}
	row.UpdatedAt = at

	b := &pgx.Batch{}
	b.Queue(insertOperationSQL, insertOperationArgs(&row)...)
	queueSteps(b, row.ID, c.Steps, row.Fence, messageID(c.Claim.Delivery), at)
	queueRecords(b, row.ID, c, at)
	return translate("create", l.pool.SendBatch(ctx, b).Close())
}

// apply costs one round trip and one commit (see Ledger). The first statement
// locks the row and checks the expected state and the fence; if that fails,
// it raises and nothing else in the batch takes effect.
func (l *Ledger) apply(ctx context.Context, c *gate.Change) error {
	id, at := c.OperationID, orNow(c.At)
	var d *gate.Delivery
	if c.Claim != nil {
		d = c.Claim.Delivery
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT ackgate_lock_operation($1, $2, $3, $4)`, id, c.Expect, c.Fence, c.Claim != nil)
	queueSteps(b, id, c.Steps, c.Fence, messageID(d), at)
	sql, args := updateFor(c, at)
	b.Queue(sql, args...)
	queueRecords(b, id, c, at)
	return translate("apply", l.pool.SendBatch(ctx, b).Close())
}

// updateFor is the UPDATE of the operation row for one named change: the
// columns that change writes, and no others.
func updateFor(c *gate.Change, at time.Time) (string, []any) {
	var set []string
	args := []any{c.OperationID}
	col := func(name, cast string, v any) {
		args = append(args, v)
		set = append(set, fmt.Sprintf("%s = $%d::%s", name, len(args), cast))
	}
	col("updated_at", "timestamptz", at)
	switch {
	case c.Claim != nil:
		col("fence", "bigint", c.Fence)
		col("owner", "text", c.Claim.Owner)
		col("lease_start", "timestamptz", at)
		col("lease_deadline", "timestamptz", c.Claim.LeaseDeadline)
		col("lease_extensions", "integer", 0)
		col("trace_id", "text", c.Claim.TraceID)
	case c.Settle != nil:
		col("lease_extensions", "integer", c.Settle.LeaseExtensions)
	}
	switch c.Kind {
	case gate.ChangeConfirm:
		col("result_id", "text", c.ResultID)
		col("evidence_at", "timestamptz", at)
	case gate.ChangeIndeterminate:
		col("lane", "text", c.Lane)
	case gate.ChangeAcked:
		col("acked_at", "timestamptz", at)
	}
	if c.Kind != gate.ChangeAcked {
		col("reason", "text", c.Reason)
	}
	return "UPDATE operations SET " + strings.Join(set, ", ") + " WHERE id = $1", args
}

const (
	setStateSQL = `UPDATE operations SET state = $2 WHERE id = $1`
	// seq is assigned by the ledger's trigger.
	insertTransitionSQL = `
INSERT INTO transitions (operation_id, from_state, to_state, at, fence, message_id, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7)`
)

// queueSteps moves the state column one edge at a time, each followed by its
// log entry, so that the guard trigger judges every edge of the path and not
// only where it ends (pending_effect -> reserved -> pending_effect is two edges,
// and no change at all to a single UPDATE). A step from "" is the INSERT itself.
func queueSteps(b *pgx.Batch, id string, steps []gate.Step, fence int64, messageID string, at time.Time) {
	for _, s := range steps {
		if s.From != "" {
			b.Queue(setStateSQL, id, s.To)
		}
		b.Queue(insertTransitionSQL, id, nullIfEmpty(string(s.From)), s.To, at, fence, messageID, s.Reason)
	}
}

const (
	// Inserting a delivery and counting it is one statement, so the count can
	// never disagree with the rows. No row comes back when the operation is
	// missing.
	insertDeliverySQL = `
WITH counted AS (
	UPDATE operations SET delivery_count = delivery_count + 1 WHERE id = $1 RETURNING id
)
INSERT INTO deliveries (operation_id, broker, source, message_id, broker_attempt, received_at,
	decision, reason, anomaly, trace_id, owner)
SELECT id, $2::text, $3::text, $4::text, $5::integer, $6::timestamptz, $7::text, $8::text,
	$9::text, $10::text, $11::text
FROM counted
RETURNING id`

	// A lease-taking delivery is answered once, by its owner token.
	answerDeliverySQL = `
UPDATE deliveries SET decision = $3, reason = CASE WHEN $4::text = '' THEN reason ELSE $4::text END
WHERE operation_id = $1 AND owner = $2 AND decision = ''`

	// The same for attempts. first_attempt_at anchors the provider's dedupe
	// window, which only an effect call opens.
	insertAttemptSQL = `
WITH counted AS (
	UPDATE operations SET attempt_count = attempt_count + 1,
		first_attempt_at = CASE WHEN $3::text = 'effect'
			THEN coalesce(first_attempt_at, $6::timestamptz) ELSE first_attempt_at END
	WHERE id = $1 RETURNING id
)
INSERT INTO attempts (operation_id, n, kind, idempotency_key, fence, started_at)
SELECT id, $2::integer, $3::text, $4::text, $5::bigint, $6::timestamptz FROM counted`

	// An outcome is recorded once, for an attempt that was started.
	finishAttemptSQL = `
WITH finished AS (
	UPDATE attempts SET finished_at = $3, outcome = $4, status_code = $5, result_id = $6, reason = $7
	WHERE operation_id = $1::text AND n = $2::integer AND finished_at IS NULL
	RETURNING n
)
SELECT ackgate_require(EXISTS (SELECT 1 FROM finished),
	'operation ' || $1::text || ': no unfinished attempt ' || $2::integer)`

	insertDeadLetterSQL = `
INSERT INTO dead_letters (operation_id, reason, at) VALUES ($1, $2, $3)
ON CONFLICT (operation_id) DO NOTHING`
)

func deliveryArgs(opID string, d *gate.Delivery) []any {
	return []any{opID, d.Broker, d.Source, d.MessageID, d.BrokerAttempt, d.ReceivedAt, d.Decision,
		d.Reason, d.Anomaly, d.TraceID, d.Owner}
}

// queueRecords appends what a change records besides the operation row.
func queueRecords(b *pgx.Batch, id string, c *gate.Change, at time.Time) {
	if c.Claim != nil && c.Claim.Delivery != nil {
		b.Queue(insertDeliverySQL, deliveryArgs(id, c.Claim.Delivery)...)
	}
	if s := c.Settle; s != nil {
		if a := s.Answer; a != nil && a.Owner != "" {
			b.Queue(answerDeliverySQL, id, a.Owner, a.Decision, a.Reason)
		}
		if a := s.Finish; a != nil {
			finished := at
			if a.FinishedAt != nil {
				finished = *a.FinishedAt
			}
			b.Queue(finishAttemptSQL, id, a.N, finished, a.Outcome, a.StatusCode, a.ResultID, a.Reason)
		}
	}
	if a := c.Start; a != nil {
		b.Queue(insertAttemptSQL, id, a.N, a.Kind, a.IdempotencyKey, c.Fence, cmp.Or(a.StartedAt, at))
	}
	queueDeadLetter(b, id, c.DeadLetter, at)
}

func queueDeadLetter(b *pgx.Batch, id string, dl *gate.DeadLetter, at time.Time) {
	if dl != nil {
		b.Queue(insertDeadLetterSQL, id, dl.Reason, cmp.Or(dl.At, at))
	}
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
	row.State = gate.StateReceived
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
			queueSteps(b, row.ID, []gate.Step{
				{Transition: gate.Transition{From: "", To: gate.StateReceived}},
				{Transition: gate.Transition{From: gate.StateReceived, To: gate.StateConflicting}, Reason: row.Reason},
			}, 0, messageID(c.Delivery), at)
		}
		if c.Delivery != nil {
			b.Queue(insertDeliverySQL, deliveryArgs(row.ID, c.Delivery)...)
		}
		queueDeadLetter(b, row.ID, c.DeadLetter, at)
		b.Queue(`SELECT `+operationColumns+` FROM operations o WHERE o.id = $1`, row.ID).
			QueryRow(func(r pgx.Row) error { return r.Scan(operationFields(&stored)...) })
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return nil, translate("record conflict", err)
	}
	return &stored, nil
}

// RecordDelivery costs one round trip: the insert and the count are one
// statement. gate.ErrNotFound when the operation does not exist.
func (l *Ledger) RecordDelivery(ctx context.Context, d *gate.Delivery) error {
	var id int64
	err := l.pool.QueryRow(ctx, insertDeliverySQL, deliveryArgs(d.OperationID, d)...).Scan(&id)
	return translate("record delivery", err)
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

func messageID(d *gate.Delivery) string {
	if d == nil {
		return ""
	}
	return d.MessageID
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
