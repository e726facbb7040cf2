package storage

import (
	"context"
	"fmt"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

// deadLettersColumns are a terminal record's row. The per-row subqueries
// run only for the rows of one page, each on an index of its own table.
const deadLettersColumns = `o.seq, o.id, o.route, o.key, o.state, coalesce(o.conflict_of, ''), o.idempotency_key,
	o.attempt_count, o.created_at, o.reason,
	EXISTS (SELECT 1 FROM dead_letters dl WHERE dl.operation_id = o.id),
	coalesce((SELECT max(t.at) FROM transitions t WHERE t.operation_id = o.id AND t.to_state = o.state), o.updated_at),
	o.message_id`

// DeadLetters lists the terminal records, terminal_failure operations and
// conflict records, newest operation first, keyset-paginated like List.
// Who took each out of circulation is read from the ledger, not from the
// route's current policy: the gateway when it wrote a dead letter row,
// else the broker, which the gateway keeps refusing the message to.
func (l *Ledger) DeadLetters(ctx context.Context, f adminapi.DeadLetterFilter) ([]adminapi.DeadLetterEntry, string, error) {
	sql, args, limit, err := deadLettersQuery(f)
	if err != nil {
		return nil, "", err
	}
	rows, err := l.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, "", translate("dead letters", err)
	}
	type row struct {
		adminapi.DeadLetterEntry
		seq       int64
		byGateway bool
	}
	found, err := collect(rows, []row{}, func(r *row) []any {
		return []any{&r.seq, &r.OperationID, &r.Route, &r.Key, &r.State, &r.ConflictOf, &r.IdempotencyKey, &r.AttemptCount,
			&r.CreatedAt, &r.Reason, &r.byGateway, &r.Since, &r.MessageID}
	})
	if err != nil {
		return nil, "", translate("dead letters", err)
	}
	out := make([]adminapi.DeadLetterEntry, len(found))
	for i, r := range found {
		e := r.DeadLetterEntry
		e.Replayable = e.State == gate.StateTerminalFailure && e.ConflictOf == ""
		e.DeadLetteredBy = adminapi.DeadLetteredByBroker
		if r.byGateway {
			e.DeadLetteredBy = adminapi.DeadLetteredByGateway
		}
		out[i] = e
	}
	if len(out) <= limit {
		return out, "", nil
	}
	return out[:limit], encodeSeq(found[limit-1].seq), nil
}

// deadLettersQuery is the listing's SQL and arguments for f, and the page
// size it asks one row more than.
//
// The terminal records sit in the lanes' index under two lanes, each by
// route and then time. A page of one route is the newest of its two lanes;
// a page of every route walks the index once per (lane, route) present,
// found by skipping from one to the next, and takes the newest of each.
// Either way the rows read are a page per lane and route, never the whole
// terminal history, which can grow large.
func deadLettersQuery(f adminapi.DeadLetterFilter) (string, []any, int, error) {
	limit := pageLimit(f.Limit)
	if why := gate.Unstorable(f.Route); why != "" {
		return "", nil, 0, fmt.Errorf("storage: dead letters: %w: route %s", adminapi.ErrInvalidFilter, why)
	}
	w := &where{}
	if f.Cursor != "" {
		seq, err := decodeSeq(f.Cursor)
		if err != nil {
			return "", nil, 0, fmt.Errorf("storage: dead letters: %w: %v", adminapi.ErrInvalidFilter, err)
		}
		w.add("o.seq < " + w.arg(seq))
	}
	lim := w.arg(limit + 1) // one more tells whether another page exists
	newest := func(lane, route string) string {
		return `(SELECT ` + deadLettersColumns + ` FROM operations o
			WHERE ` + w.and("o.waiting = "+lane, "o.route = "+route) + `
			ORDER BY o.seq DESC LIMIT ` + lim + `)`
	}
	var sql string
	if f.Route != "" {
		route := w.arg(f.Route)
		sql = newest("'terminal_failure'", route) + ` UNION ALL ` + newest("'conflicting'", route)
	} else {
		sql = `WITH RECURSIVE lanes(waiting, route) AS (
			(SELECT waiting, route FROM operations WHERE waiting IN ('conflicting', 'terminal_failure')
			 ORDER BY waiting, route LIMIT 1)
			UNION ALL
			SELECT n.waiting, n.route FROM lanes l CROSS JOIN LATERAL (
				SELECT waiting, route FROM operations
				WHERE waiting IN ('conflicting', 'terminal_failure') AND (waiting, route) > (l.waiting, l.route)
				ORDER BY waiting, route LIMIT 1) n
		)
		SELECT o.* FROM lanes CROSS JOIN LATERAL ` + newest("lanes.waiting", "lanes.route") + ` o`
	}
	sql = `SELECT * FROM (` + sql + `) page ORDER BY page.seq DESC LIMIT ` + lim
	return sql, w.args, limit, nil
}
