package storage

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

// The operator console's lanes. Every query here walks an index in the
// order it returns rows and stops after one page (or, for counts, at a
// cap), so a ledger of millions of operations costs a page, not a scan
// (TestLaneQueriesUseIndexes, BenchmarkLanesMillion): a lane is read from
// the lanes' index (operations_lanes), which only operations off the common
// path enter, and open work not swept into it yet from the rows past the
// sweep's cursor (inState).

// LaneCountCap is where lane counts stop counting: beyond it an operator
// needs to know "a lot", not the figure, and counting further would read
// the whole lane.
const LaneCountCap = 10000

// laneCols are a lane entry's columns. The dead letter is the latest.
const laneCols = `o.seq, o.id, o.route, o.state, o.key, o.fingerprint, o.shape, coalesce(o.conflict_of, ''),
	o.attempt_count, o.delivery_count, o.reason, o.lane, o.trace_id, o.created_at, o.updated_at,
	dl.at, coalesce(dl.reason, '')`

// LanePage returns one page of a lane, oldest first, keyset-paginated on
// the operations' time order.
func (l *Ledger) LanePage(ctx context.Context, f adminapi.LaneFilter) (adminapi.LanePage, error) {
	sql, args, limit, err := laneQuery(f)
	if err != nil {
		return adminapi.LanePage{}, err
	}
	rows, err := l.pool.Query(ctx, sql, args...)
	if err != nil {
		return adminapi.LanePage{}, translate("lane", err)
	}
	var seqs []int64
	entries, err := collect(rows, []adminapi.LaneEntry{}, func(e *adminapi.LaneEntry) []any {
		seqs = append(seqs, 0)
		return []any{&seqs[len(seqs)-1], &e.ID, &e.Route, &e.State, &e.Key, &e.Fingerprint, &e.Shape, &e.ConflictOf,
			&e.AttemptCount, &e.DeliveryCount, &e.Reason, &e.Lane, &e.TraceID, &e.CreatedAt, &e.UpdatedAt,
			&e.DeadLetterAt, &e.DeadLetterReason}
	})
	if err != nil {
		return adminapi.LanePage{}, translate("lane", err)
	}
	page := adminapi.LanePage{Entries: entries}
	if len(entries) > limit {
		page.Entries = entries[:limit]
		page.Next = encodeSeq(seqs[limit-1])
	}
	return page, nil
}

// laneQuery is LanePage's statement, apart so that a test can EXPLAIN
// exactly what runs.
func laneQuery(f adminapi.LaneFilter) (string, []any, int, error) {
	if !f.State.Valid() {
		return "", nil, 0, fmt.Errorf("storage: lane: %w: unknown state %q", adminapi.ErrInvalidFilter, gate.Bound(string(f.State), 64))
	}
	for name, v := range map[string]string{"route": f.Route, "message_id": f.MessageID} {
		if why := gate.Unstorable(v); why != "" {
			return "", nil, 0, fmt.Errorf("storage: lane: %w: %s %s", adminapi.ErrInvalidFilter, name, why)
		}
	}
	limit := pageLimit(f.Limit)
	w := &where{}
	if f.Route != "" {
		w.add("o.route = " + w.arg(f.Route))
	}
	if f.MessageID != "" {
		w.add(messageCondition(w, f.MessageID, f.ByMessage))
	}
	if f.Cursor != "" {
		seq, err := decodeSeq(f.Cursor)
		if err != nil {
			return "", nil, 0, fmt.Errorf("storage: lane: %w: %v", adminapi.ErrInvalidFilter, err)
		}
		w.add("o.seq > " + w.arg(seq))
	}
	lim := w.arg(limit + 1)
	var parts []string
	for _, cond := range inState("o", f.State) {
		// The latest dead letter of each row of the page, by its own index.
		parts = append(parts, `(SELECT `+laneCols+` FROM operations o
		LEFT JOIN LATERAL (SELECT at, reason FROM dead_letters WHERE operation_id = o.id ORDER BY id DESC LIMIT 1) dl ON true
		WHERE `+w.and(cond)+` ORDER BY o.seq LIMIT `+lim+`)`)
	}
	sql := parts[0]
	if len(parts) > 1 {
		sql = `SELECT * FROM (` + strings.Join(parts, " UNION ALL ") + `) u ORDER BY u.seq LIMIT ` + lim
	}
	return sql, w.args, limit, nil
}

// LaneTotals counts, per route, the operations in each of states and the
// undelivered outbox entries, each up to LaneCountCap. It asks one
// bounded question per route and lane, in one round trip, rather than
// grouping the table: a GROUP BY would read every row of every lane.
func (l *Ledger) LaneTotals(ctx context.Context, routes []string, states []gate.State) ([]adminapi.LaneCount, error) {
	for _, s := range states {
		if !s.Valid() {
			return nil, fmt.Errorf("storage: lane totals: %w: unknown state %q", adminapi.ErrInvalidFilter, gate.Bound(string(s), 64))
		}
	}
	var out []adminapi.LaneCount
	b := &pgx.Batch{}
	count := func(route, lane, sql string) {
		i := len(out)
		out = append(out, adminapi.LaneCount{Route: route, Lane: lane})
		b.Queue(sql, route, LaneCountCap+1).QueryRow(func(r pgx.Row) error {
			if err := r.Scan(&out[i].N); err != nil {
				return err
			}
			if out[i].N > LaneCountCap {
				out[i].N, out[i].Capped = LaneCountCap, true
			}
			return nil
		})
	}
	for _, route := range routes {
		if why := gate.Unstorable(route); why != "" {
			return nil, fmt.Errorf("storage: lane totals: %w: route %s", adminapi.ErrInvalidFilter, why)
		}
		for _, s := range states {
			count(route, string(s), laneCountSQL(s))
		}
		count(route, adminapi.LaneOutbox, outboxCountSQL)
	}
	if len(out) == 0 {
		return out, nil
	}
	if err := l.pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, translate("lane totals", err)
	}
	return out, nil
}

// laneCountSQL counts one route's operations in state s, up to $2. The
// state was checked against gate.States by the caller.
func laneCountSQL(s gate.State) string {
	var parts []string
	for _, cond := range inState("o", s) {
		parts = append(parts, `SELECT 1 FROM operations o WHERE o.route = $1 AND `+cond)
	}
	return `SELECT count(*) FROM (` + strings.Join(parts, " UNION ALL ") + ` LIMIT $2) lane`
}

const outboxCountSQL = `SELECT count(*) FROM (SELECT 1 FROM outbox WHERE route = $1 AND delivered_at IS NULL LIMIT $2) lane`

// OutboxPage returns one page of undelivered outbox entries, the soonest
// due first, keyset-paginated on (next_attempt_at, operation_id). It reads
// ids and schedule only: the message an entry carries is never selected.
func (l *Ledger) OutboxPage(ctx context.Context, f adminapi.OutboxFilter) (adminapi.OutboxPage, error) {
	if why := gate.Unstorable(f.Route); why != "" {
		return adminapi.OutboxPage{}, fmt.Errorf("storage: outbox: %w: route %s", adminapi.ErrInvalidFilter, why)
	}
	limit := pageLimit(f.Limit)
	where := []string{"delivered_at IS NULL"}
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if f.Route != "" {
		where = append(where, "route = "+arg(f.Route))
	}
	if f.Cursor != "" {
		at, id, err := decodeCursor(f.Cursor)
		if err != nil {
			return adminapi.OutboxPage{}, fmt.Errorf("storage: outbox: %w: %v", adminapi.ErrInvalidFilter, err)
		}
		where = append(where, "(next_attempt_at, operation_id) > ("+arg(at)+", "+arg(id)+")")
	}
	// The operation's state is read by primary key for the page's rows only.
	rows, err := l.pool.Query(ctx, `SELECT e.operation_id, e.route, e.publication_id, e.created_at, e.next_attempt_at,
			e.passes, (SELECT o.state FROM operations o WHERE o.id = e.operation_id)
		FROM (SELECT operation_id, route, publication_id, created_at, next_attempt_at, passes
			FROM outbox WHERE `+strings.Join(where, " AND ")+`
			ORDER BY next_attempt_at, operation_id LIMIT `+arg(limit+1)+`) e
		ORDER BY e.next_attempt_at, e.operation_id`, args...)
	if err != nil {
		return adminapi.OutboxPage{}, translate("outbox", err)
	}
	entries, err := collect(rows, []adminapi.OutboxRow{}, func(e *adminapi.OutboxRow) []any {
		return []any{&e.OperationID, &e.Route, &e.PublicationID, &e.CreatedAt, &e.NextAttemptAt, &e.Passes, &e.State}
	})
	if err != nil {
		return adminapi.OutboxPage{}, translate("outbox", err)
	}
	page := adminapi.OutboxPage{Entries: entries}
	if len(entries) > limit {
		page.Entries = entries[:limit]
		last := page.Entries[limit-1]
		page.Next = encodeCursor(last.NextAttemptAt, last.OperationID)
	}
	return page, nil
}
