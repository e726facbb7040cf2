package storage

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/jackc/pgx/v5"
)

// recordSQL reads an operation's row for its record: what the gate reads,
// and the first delivery and the log's length, which the record builds its
// history from.
var recordSQL = expandColumns(`
SELECT {{operation o}}, o.broker, o.source, o.message_id, o.broker_attempt, o.publish_time,
	o.d1_decision, o.d1_reason, o.d1_anomaly, o.log_count
FROM operations o WHERE o.id = $1`)

// Get returns the record of an operation or conflict record by id, or
// gate.ErrNotFound: the row and whatever side rows exist, read in one
// repeatable-read snapshot so the counts on the row agree with the rows
// listed.
func (l *Ledger) Get(ctx context.Context, id string) (*adminapi.Record, error) {
	if gate.Unstorable(id) != "" {
		// No id the ledger holds can be spelt so; asking would fail the query.
		return nil, fmt.Errorf("storage: get: %w", gate.ErrNotFound)
	}
	var (
		s        scannedOperation
		first    gate.Delivery
		logCount int
		further  []gate.Delivery
		attempts []gate.Attempt
		log      []adminapi.Event
		rec      = &adminapi.Record{DeadLetters: []gate.DeadLetter{}, Interventions: []gate.Intervention{},
			LeaseEvents: []adminapi.LeaseEvent{}}
	)
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	b.Queue(recordSQL, id).QueryRow(func(r pgx.Row) error {
		return r.Scan(append(s.fields(), &first.Broker, &first.Source, &first.MessageID, &first.BrokerAttempt,
			&first.PublishTime, &first.Decision, &first.Reason, &first.Anomaly, &logCount)...)
	})
	b.Queue(`SELECT n, broker, source, message_id, broker_attempt, received_at, publish_time, trace_id, found,
		fence, decision, reason, anomaly
		FROM deliveries WHERE operation_id = $1 ORDER BY n`, id).
		Query(func(rows pgx.Rows) error {
			var err error
			further, err = collect(rows, further, func(d *gate.Delivery) []any {
				d.OperationID = id
				return []any{&d.N, &d.Broker, &d.Source, &d.MessageID, &d.BrokerAttempt, &d.ReceivedAt,
					&d.PublishTime, &d.TraceID, &d.Found, &d.Fence, &d.Decision, &d.Reason, &d.Anomaly}
			})
			return err
		})
	b.Queue(`SELECT `+strings.Join(attemptCols, ", ")+` FROM attempts WHERE operation_id = $1 ORDER BY n`, id).
		Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var a scannedAttempt
				if err := rows.Scan(a.fields()...); err != nil {
					return err
				}
				attempts = append(attempts, *a.attempt(""))
			}
			return rows.Err()
		})
	b.Queue(`SELECT seq, from_state, to_state, at, fence, message_id, reason
		FROM transitions WHERE operation_id = $1 ORDER BY seq`, id).
		Query(func(rows pgx.Rows) error {
			var err error
			log, err = collect(rows, log, func(e *adminapi.Event) []any {
				return []any{&e.Seq, &e.From, &e.To, &e.At, &e.Fence, &e.MessageID, &e.Reason}
			})
			return err
		})
	b.Queue(`SELECT reason, at FROM dead_letters WHERE operation_id = $1 ORDER BY id`, id).
		Query(func(rows pgx.Rows) error {
			var err error
			rec.DeadLetters, err = collect(rows, rec.DeadLetters, func(d *gate.DeadLetter) []any {
				d.OperationID = id
				return []any{&d.Reason, &d.At}
			})
			return err
		})
	b.Queue(`SELECT `+interventionCols+` FROM interventions WHERE operation_id = $1 ORDER BY id`, id).
		Query(func(rows pgx.Rows) error {
			var err error
			rec.Interventions, err = collect(rows, rec.Interventions, interventionFields)
			return err
		})
	b.Queue(`SELECT kind, fence, at FROM lease_events WHERE operation_id = $1 ORDER BY id`, id).
		Query(func(rows pgx.Rows) error {
			var err error
			rec.LeaseEvents, err = collect(rows, rec.LeaseEvents, func(e *adminapi.LeaseEvent) []any {
				return []any{&e.Kind, &e.Fence, &e.At}
			})
			return err
		})
	br := l.pool.SendBatch(ctx, b)
	err := br.Close()
	// Read-only: ending it either way discards nothing.
	if tx := br.Tx(); tx != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
	}
	if err != nil {
		return nil, translate("get", err)
	}

	op := s.op
	first.OperationID, first.N, first.ReceivedAt, first.TraceID = id, 1, op.CreatedAt, op.TraceID
	if op.ConflictOf == "" {
		first.Fence = 1
	}
	rec.Deliveries = append([]gate.Delivery{first}, further...)
	rec.Attempts = []gate.Attempt{}
	if a1 := s.first(); a1 != nil {
		rec.Attempts = append(rec.Attempts, *a1)
	}
	for _, a := range attempts {
		a.IdempotencyKey = op.IdempotencyKey
		rec.Attempts = append(rec.Attempts, a)
	}
	var latest *gate.Attempt
	for i := len(rec.Attempts) - 1; i >= 0; i-- {
		if rec.Attempts[i].Kind == gate.AttemptEffect {
			latest = &rec.Attempts[i]
			break
		}
	}
	rec.Operation = *s.operation(latest)
	rec.Events = history(&rec.Operation, logCount, log)
	return rec, nil
}

// history is an operation's transitions in order: the steps of its
// creation, then either its log (once it left the common path, every step
// is there) or the common path's evidence and ack, whose times and fence
// the row holds. A step written by the row alone has the reason the gate
// gives it on the common path.
func history(op *gate.Operation, logCount int, log []adminapi.Event) []adminapi.Event {
	born := op.State
	switch {
	case logCount > 0 && len(log) > 0:
		born = log[0].From
	case op.State.Confirmed():
		born = gate.StatePendingEffect
	}
	var path []gate.State
	switch born {
	case gate.StatePendingEffect:
		path = []gate.State{gate.StateReceived, gate.StateReserved, gate.StatePendingEffect}
	default:
		path = []gate.State{gate.StateReceived, born}
	}
	var fence int64
	if op.ConflictOf == "" {
		fence = 1
	}
	created := gate.ReasonNewOperation
	if born == op.State && logCount == 0 {
		created = op.Reason
	}
	out := make([]adminapi.Event, 0, len(path)+len(log)+3)
	var from gate.State
	for _, to := range path {
		out = append(out, adminapi.Event{From: from, To: to, At: op.CreatedAt, Fence: fence, Reason: created})
		from = to
	}
	if logCount > 0 {
		out = append(out, log...)
	} else {
		if op.EvidenceAt != nil {
			for _, to := range []gate.State{gate.StateEffectConfirmed, gate.StateAckPending} {
				out = append(out, adminapi.Event{From: from, To: to, At: *op.EvidenceAt, Fence: op.Fence, Reason: op.Reason})
				from = to
			}
		}
		if op.AckedAt != nil {
			out = append(out, adminapi.Event{From: from, To: gate.StateAcknowledged, At: *op.AckedAt, Fence: op.Fence,
				Reason: gate.ReasonAckWritten})
		}
	}
	for i := range out {
		out[i].Seq = i + 1
	}
	return out
}

// collect appends one T per row, scanning into the fields fields names.
func collect[T any](rows pgx.Rows, out []T, fields func(*T) []any) ([]T, error) {
	defer rows.Close()
	for rows.Next() {
		var v T
		if err := rows.Scan(fields(&v)...); err != nil {
			return out, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

const (
	defaultListLimit = 50
	maxListLimit     = 500
)

// listSQL is the row List returns, with the seq its cursor keys on.
var listSQL = expandColumns(`SELECT o.seq, {{operation o}}, {{attempt la}} FROM operations o
LEFT JOIN LATERAL (
	SELECT * FROM attempts a
	WHERE o.attempt_count > 1 AND a.operation_id = o.id AND a.kind = 'effect'
	ORDER BY a.n DESC LIMIT 1
) la ON true`)

// List returns operations and conflict records, newest first, with a cursor
// for the next page ("" when there is none). Paging is keyset on the
// operations' time order, so pages stay stable while new operations arrive.
func (l *Ledger) List(ctx context.Context, f adminapi.ListFilter) ([]gate.Operation, string, error) {
	limit := pageLimit(f.Limit)
	for name, v := range map[string]string{"route": f.Route, "message_id": f.MessageID, "key": f.Key} {
		if why := gate.Unstorable(v); why != "" {
			return nil, "", fmt.Errorf("storage: list: %w: %s %s", adminapi.ErrInvalidFilter, name, why)
		}
	}
	w := &where{}
	if f.Route != "" {
		w.add("o.route = " + w.arg(f.Route))
	}
	if f.Key != "" {
		// A key names one operation per route (the id is derived from it)
		// and the conflict records that reused it.
		ids := w.arg(f.ByKey)
		w.add("(o.id = ANY(" + ids + ") OR o.conflict_of = ANY(" + ids + "))")
	}
	if f.MessageID != "" {
		w.add(messageCondition(w, f.MessageID, f.ByMessage))
	}
	if f.Cursor != "" {
		seq, err := decodeSeq(f.Cursor)
		if err != nil {
			return nil, "", fmt.Errorf("storage: list: %w: %v", adminapi.ErrInvalidFilter, err)
		}
		w.add("o.seq < " + w.arg(seq))
	}
	var parts []string
	if f.State != "" {
		s := gate.State(f.State)
		if !s.Valid() {
			return nil, "", fmt.Errorf("storage: list: %w: unknown state %q", adminapi.ErrInvalidFilter, gate.Bound(f.State, 64))
		}
		for _, cond := range inState("o", s) {
			parts = append(parts, listSQL+` WHERE `+w.and(cond))
		}
	} else {
		parts = []string{listSQL + w.where()}
	}
	sql := unionNewestFirst(parts, w.arg(limit+1)) // one more tells whether another page exists

	rows, err := l.pool.Query(ctx, sql, w.args...)
	if err != nil {
		return nil, "", translate("list", err)
	}
	var seqs []int64
	ops := []gate.Operation{}
	for rows.Next() {
		var (
			seq int64
			s   scannedOperation
			la  scannedAttempt
		)
		if err := rows.Scan(append(append([]any{&seq}, s.fields()...), la.fields()...)...); err != nil {
			rows.Close()
			return nil, "", translate("list", err)
		}
		seqs = append(seqs, seq)
		ops = append(ops, *s.operation(la.attempt(s.op.IdempotencyKey)))
	}
	if err := rows.Err(); err != nil {
		return nil, "", translate("list", err)
	}
	if len(ops) <= limit {
		return ops, "", nil
	}
	return ops[:limit], encodeSeq(seqs[limit-1]), nil
}

// unionNewestFirst orders the rows of parts (each a SELECT of listSQL's
// columns) newest first and keeps limit: each part is ordered and limited
// on its own, so each walks its index backwards and stops early.
func unionNewestFirst(parts []string, limit string) string {
	if len(parts) == 1 {
		return parts[0] + ` ORDER BY o.seq DESC LIMIT ` + limit
	}
	for i, p := range parts {
		parts[i] = `(` + p + ` ORDER BY o.seq DESC LIMIT ` + limit + `)`
	}
	return `SELECT * FROM (` + strings.Join(parts, " UNION ALL ") + `) u ORDER BY u.seq DESC LIMIT ` + limit
}

// messageCondition matches operations that message id m reached: on routes
// keyed on the message id, the operations byMessage names (their ids are
// derived from it) and their conflict records; on other routes, the first
// delivery's message id; on any route, a further delivery's.
func messageCondition(w *where, m string, byMessage []string) string {
	arg, ids := w.arg(m), w.arg(byMessage)
	// The further deliveries' operations are gathered into an array before
	// the scan (ARRAY(...) is computed once), so that every arm of the OR is
	// an index condition and the planner can combine the arms' indexes; a
	// subquery left as an arm would have it walk the table testing each row.
	return `(o.id = ANY(` + ids + ` || ARRAY(SELECT d.operation_id FROM deliveries d WHERE d.message_id = ` + arg + `))
		OR o.conflict_of = ANY(` + ids + `)
		OR (o.key_source <> 'message_id' AND o.message_id = ` + arg + `))`
}

// where gathers a query's conditions and their arguments.
type where struct {
	conds []string
	args  []any
}

func (w *where) arg(v any) string {
	w.args = append(w.args, v)
	return "$" + strconv.Itoa(len(w.args))
}

func (w *where) add(cond string) { w.conds = append(w.conds, cond) }

func (w *where) where() string {
	if len(w.conds) == 0 {
		return ""
	}
	return ` WHERE ` + strings.Join(w.conds, " AND ")
}

// and is w's conditions with extra ones.
func (w *where) and(extra ...string) string {
	return strings.Join(append(slices.Clone(w.conds), extra...), " AND ")
}

// inState is the conditions, one per index to read, that find operations
// of alias in state s. A lane's operations are in the lanes' index under
// its name; open work is there as 'open' once it left the common path, and
// otherwise young enough that the sweep has not reached it (sweep.go), so
// it is found past the sweep's cursor; acknowledged work is everywhere
// else. The caller checked s against gate.States, so it is written as a
// literal: a bound parameter could not prove the lanes' partial index.
func inState(alias string, s gate.State) []string {
	state := alias + ".state = '" + string(s) + "'"
	switch s {
	case gate.StateEffectIndeterminate, gate.StateTerminalFailure, gate.StateConflicting:
		return []string{alias + ".waiting = '" + string(s) + "' AND " + state}
	case gate.StateAcknowledged:
		return []string{state}
	}
	return []string{
		alias + ".waiting = 'open' AND " + state,
		alias + ".waiting IS NULL AND " + state + " AND " + youngerThanTheSweep(alias),
	}
}

// youngerThanTheSweep bounds a read to the rows past the sweep's cursor.
// The planner cannot know the cursor when it plans (it is a subquery, and
// a parameter in a cached generic plan would be no better), and it guesses
// a third of the table for a one-sided bound, enough to prefer reading the
// table whole. The second bound, every seq there can be, changes no answer;
// it makes the pair a range, which the planner guesses narrow, so the read
// is an index range scan from the cursor on (TestLaneQueriesUseIndexes).
func youngerThanTheSweep(alias string) string {
	return alias + ".seq > (SELECT seq FROM sweep_cursor) AND " + alias + ".seq <= 9223372036854775807"
}

// The cursors are opaque to clients.

func encodeSeq(seq int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte("s" + strconv.FormatInt(seq, 10)))
}

func decodeSeq(s string) (int64, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(raw) < 2 || raw[0] != 's' {
		return 0, fmt.Errorf("malformed cursor")
	}
	n, err := strconv.ParseInt(string(raw[1:]), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("malformed cursor")
	}
	return n, nil
}

// encodeCursor keys a page on a time and an id, for the listings ordered
// by a time of their own (the outbox, poison messages). created_at is
// stored with microsecond precision, so microseconds round-trip exactly.
func encodeCursor(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at.UnixMicro(), 10) + ":" + id))
}

func decodeCursor(s string) (time.Time, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("malformed cursor")
	}
	micros, id, ok := strings.Cut(string(raw), ":")
	n, err := strconv.ParseInt(micros, 10, 64)
	if !ok || err != nil || id == "" || gate.Unstorable(id) != "" {
		return time.Time{}, "", fmt.Errorf("malformed cursor")
	}
	return time.UnixMicro(n), id, nil
}

func pageLimit(n int) int {
	if n <= 0 {
		return defaultListLimit
	}
	return min(n, maxListLimit)
}
