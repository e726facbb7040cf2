package storage

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/jackc/pgx/v5"
)

// Get returns the record of an operation or conflict record by id, or
// gate.ErrNotFound. Its parts are read in one repeatable-read snapshot, so the
// counts on the operation agree with the rows listed.
func (l *Ledger) Get(ctx context.Context, id string) (*adminapi.Record, error) {
	if gate.Unstorable(id) != "" {
		// No id the ledger holds can be spelt so; asking would fail the query.
		return nil, fmt.Errorf("storage: get: %w", gate.ErrNotFound)
	}
	rec := &adminapi.Record{
		Deliveries:  []gate.Delivery{},
		Attempts:    []gate.Attempt{},
		Events:      []adminapi.Event{},
		DeadLetters: []gate.DeadLetter{},

		Interventions: []gate.Intervention{},
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	b.Queue(`SELECT `+operationColumns+` FROM operations o WHERE o.id = $1`, id).
		QueryRow(func(r pgx.Row) error { return r.Scan(operationFields(&rec.Operation)...) })
	b.Queue(`SELECT broker, source, message_id, broker_attempt, received_at, decision, reason, anomaly, trace_id, owner,
		publish_time
		FROM deliveries WHERE operation_id = $1 ORDER BY id`, id).
		Query(func(rows pgx.Rows) error {
			var err error
			rec.Deliveries, err = collect(rows, rec.Deliveries, func(d *gate.Delivery) []any {
				d.OperationID = id
				return []any{&d.Broker, &d.Source, &d.MessageID, &d.BrokerAttempt, &d.ReceivedAt,
					&d.Decision, &d.Reason, &d.Anomaly, &d.TraceID, &d.Owner, &d.PublishTime}
			})
			return err
		})
	b.Queue(`SELECT n, kind, idempotency_key, fence, started_at, finished_at, outcome, status_code, result_id, reason
		FROM attempts WHERE operation_id = $1 ORDER BY n`, id).
		Query(func(rows pgx.Rows) error {
			var err error
			rec.Attempts, err = collect(rows, rec.Attempts, func(a *gate.Attempt) []any {
				return []any{&a.N, &a.Kind, &a.IdempotencyKey, &a.Fence, &a.StartedAt, &a.FinishedAt,
					&a.Outcome, &a.StatusCode, &a.ResultID, &a.Reason}
			})
			return err
		})
	b.Queue(`SELECT seq, coalesce(from_state, ''), to_state, at, fence, message_id, reason
		FROM transitions WHERE operation_id = $1 ORDER BY seq`, id).
		Query(func(rows pgx.Rows) error {
			var err error
			rec.Events, err = collect(rows, rec.Events, func(e *adminapi.Event) []any {
				return []any{&e.Seq, &e.From, &e.To, &e.At, &e.Fence, &e.MessageID, &e.Reason}
			})
			return err
		})
	b.Queue(`SELECT reason, at FROM dead_letters WHERE operation_id = $1`, id).
		Query(func(rows pgx.Rows) error {
			var err error
			rec.DeadLetters, err = collect(rows, rec.DeadLetters, func(d *gate.DeadLetter) []any {
				d.OperationID = id
				return []any{&d.Reason, &d.At}
			})
			return err
		})

	b.Queue(`SELECT kind, actor, reason, result_id, from_state, to_state, fence, at
		FROM manual_interventions WHERE operation_id = $1 ORDER BY seq`, id).
		Query(func(rows pgx.Rows) error {
			var err error
			rec.Interventions, err = collect(rows, rec.Interventions, interventionFields)
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
	for i := len(rec.Attempts) - 1; i >= 0; i-- {
		if rec.Attempts[i].Kind == gate.AttemptEffect {
			rec.LastAttempt = &rec.Attempts[i]
			break
		}
	}
	return rec, nil
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

// List returns operations and conflict records, newest first, with a cursor
// for the next page ("" when there is none). Paging is keyset on (created_at,
// id), so pages stay stable while new operations arrive.
func (l *Ledger) List(ctx context.Context, f adminapi.ListFilter) ([]gate.Operation, string, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	limit = min(limit, maxListLimit)

	for name, v := range map[string]string{"route": f.Route, "message_id": f.MessageID, "key": f.Key} {
		if why := gate.Unstorable(v); why != "" {
			return nil, "", fmt.Errorf("storage: list: %w: %s %s", adminapi.ErrInvalidFilter, name, why)
		}
	}
	var (
		where []string
		args  []any
	)
	cond := func(sql string, values ...any) {
		for _, v := range values {
			args = append(args, v)
			sql = strings.Replace(sql, "$?", "$"+strconv.Itoa(len(args)), 1)
		}
		where = append(where, sql)
	}
	if f.Route != "" {
		cond("o.route = $?", f.Route)
	}
	if f.State != "" {
		if !gate.State(f.State).Valid() {
			return nil, "", fmt.Errorf("storage: list: %w: unknown state %q", adminapi.ErrInvalidFilter, f.State)
		}
		cond(inState("o", gate.State(f.State)))
	}
	if f.Key != "" {
		cond("o.key = $?", f.Key)
	}
	if f.MessageID != "" {
		cond("EXISTS (SELECT 1 FROM deliveries d WHERE d.operation_id = o.id AND d.message_id = $?)", f.MessageID)
	}
	if f.Cursor != "" {
		at, id, err := decodeCursor(f.Cursor)
		if err != nil {
			return nil, "", fmt.Errorf("storage: list: %w: %v", adminapi.ErrInvalidFilter, err)
		}
		cond("(o.created_at, o.id) < ($?, $?)", at, id)
	}
	sql := `SELECT ` + operationColumns + ` FROM operations o`
	if len(where) > 0 {
		sql += ` WHERE ` + strings.Join(where, " AND ")
	}
	args = append(args, limit+1) // one more tells whether another page exists
	sql += ` ORDER BY o.created_at DESC, o.id DESC LIMIT $` + strconv.Itoa(len(args))

	rows, err := l.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, "", translate("list", err)
	}
	ops, err := collect(rows, []gate.Operation{}, operationFields)
	if err != nil {
		return nil, "", translate("list", err)
	}
	if len(ops) <= limit {
		return ops, "", nil
	}
	ops = ops[:limit]
	last := ops[limit-1]
	return ops, encodeCursor(last.CreatedAt, last.ID), nil
}

// The cursor is opaque to clients. created_at is stored with microsecond
// precision, so microseconds round-trip exactly.
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
