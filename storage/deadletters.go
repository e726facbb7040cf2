package storage

import (
	"context"
	"fmt"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

// deadLettersColumns are a terminal record's row. The per-row subqueries
// run only for the rows of one page, each on an index of its own table.
const deadLettersColumns = `o.id, o.route, o.key, o.state, coalesce(o.conflict_of, ''), o.idempotency_key,
	o.attempt_count, o.created_at, o.reason,
	EXISTS (SELECT 1 FROM dead_letters dl WHERE dl.operation_id = o.id),
	coalesce((SELECT max(t.at) FROM transitions t WHERE t.operation_id = o.id AND t.to_state = o.state), o.updated_at),
	coalesce((SELECT d.message_id FROM deliveries d WHERE d.operation_id = o.id ORDER BY d.id LIMIT 1), '')`

// DeadLetters lists the terminal records, terminal_failure operations and
// conflict records, newest operation first, keyset-paginated on
// (created_at, id) like List. Who took each out of circulation is read
// from the ledger, not from the route's current policy: the gateway when it
// wrote a dead letter row, else the broker, which the gateway keeps
// refusing the message to.
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
		byGateway bool
	}
	found, err := collect(rows, []row{}, func(r *row) []any {
		return []any{&r.OperationID, &r.Route, &r.Key, &r.State, &r.ConflictOf, &r.IdempotencyKey, &r.AttemptCount,
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
	out = out[:limit]
	last := out[limit-1]
	return out, encodeCursor(last.CreatedAt, last.OperationID), nil
}

// deadLettersQuery is the listing's SQL and arguments for f, and the page
// size it asks one row more than.
func deadLettersQuery(f adminapi.DeadLetterFilter) (string, []any, int, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	limit = min(limit, maxListLimit)
	if why := gate.Unstorable(f.Route); why != "" {
		return "", nil, 0, fmt.Errorf("storage: dead letters: %w: route %s", adminapi.ErrInvalidFilter, why)
	}
	// The condition repeats the predicate of the partial indexes of
	// migrations 0012 and 0016 word for word, so the planner walks one of
	// them backwards instead of sorting the terminal history, which can
	// grow large. waiting is the state for exactly these two states.
	sql := `SELECT ` + deadLettersColumns + ` FROM operations o
		WHERE o.waiting IN ('terminal_failure', 'conflicting')`
	args := []any{}
	if f.Route != "" {
		args = append(args, f.Route)
		sql += ` AND o.route = $1`
	}
	if f.Cursor != "" {
		at, id, err := decodeCursor(f.Cursor)
		if err != nil {
			return "", nil, 0, fmt.Errorf("storage: dead letters: %w: %v", adminapi.ErrInvalidFilter, err)
		}
		args = append(args, at, id)
		sql += fmt.Sprintf(` AND (o.created_at, o.id) < ($%d, $%d)`, len(args)-1, len(args))
	}
	args = append(args, limit+1) // one more tells whether another page exists
	sql += fmt.Sprintf(` ORDER BY o.created_at DESC, o.id DESC LIMIT $%d`, len(args))

	return sql, args, limit, nil
}
