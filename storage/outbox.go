package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/jackc/pgx/v5"
)

// The relay's queue. An entry is due while its operation's effect question
// is open (received, reserved or pending_effect) and its next_attempt_at has
// come; taking it pushes next_attempt_at past the time one pass can take,
// inside the same statement that locks it (SKIP LOCKED), so relays polling
// at once in any number of replicas never take the same entry. The
// operation's lease and fence still guard everything the pass writes.
//
// Each statement below that locks entries and then writes them finds them
// again by key from an array its locking subquery builds once
// (operation_id = ANY (ARRAY(...))), never by joining that subquery to the
// outbox. Joined, the plan rests on what Postgres believes of the outbox's
// size: analyzed while empty (drained between bursts, as an outbox mostly
// is), it scans the whole outbox and runs the locking subquery once per
// entry, and a burst of 2,000 handoffs took the relay 12 s instead of 1.5.

// claimedEntry is what a claim of outbox entries returns of each, in the
// order scanOutboxEntry reads it.
const claimedEntry = `RETURNING e.operation_id, e.route, e.publication_id, e.broker, e.source, e.message_id, e.publish_time,
	e.ordering_key, e.attributes, e.data, e.sealed_with, e.sealed_pointers, e.created_at, e.next_attempt_at, e.passes`

// claimOutboxSQL takes up to $2 due entries of routes $1, oldest due
// first, holding each for $3 seconds.
const claimOutboxSQL = `
UPDATE outbox e SET next_attempt_at = now() + make_interval(secs => $3), passes = e.passes + 1
WHERE e.operation_id = ANY (ARRAY(
	SELECT e2.operation_id FROM outbox e2 JOIN operations o ON o.id = e2.operation_id
	WHERE e2.delivered_at IS NULL AND e2.next_attempt_at <= now() AND e2.route = ANY($1)
	  AND o.state IN ('received', 'reserved', 'pending_effect')
	ORDER BY e2.next_attempt_at
	LIMIT $2
	FOR UPDATE OF e2 SKIP LOCKED))
` + claimedEntry

// ClaimOutbox takes up to limit due entries of routes for one relay pass,
// holding each for horizon.
func (l *Ledger) ClaimOutbox(ctx context.Context, routes []string, limit int, horizon time.Duration) ([]*gate.OutboxEntry, error) {
	rows, err := l.pool.Query(ctx, claimOutboxSQL, routes, limit, horizon.Seconds())
	if err != nil {
		return nil, translate("claim outbox", err)
	}
	out, err := pgx.CollectRows(rows, l.scanOutboxEntry)
	return out, translate("claim outbox", err)
}

// claimEachSQL takes, in one statement, up to $2[i] due entries of route
// $1[i] for every i: each route's own LIMIT, oldest due first, every entry
// locked with SKIP LOCKED and pushed $3 seconds ahead as in ClaimOutbox. One
// statement per relay round, however many routes and entries it takes.
const claimEachSQL = `
UPDATE outbox e SET next_attempt_at = now() + make_interval(secs => $3), passes = e.passes + 1
WHERE e.operation_id = ANY (ARRAY(
	SELECT c.operation_id FROM unnest($1::text[], $2::int[]) AS w(route, n)
	CROSS JOIN LATERAL (
		SELECT e2.operation_id FROM outbox e2 JOIN operations o ON o.id = e2.operation_id
		WHERE e2.delivered_at IS NULL AND e2.next_attempt_at <= now() AND e2.route = w.route
		  AND o.state IN ('received', 'reserved', 'pending_effect')
		ORDER BY e2.next_attempt_at
		LIMIT w.n
		FOR UPDATE OF e2 SKIP LOCKED) c))
` + claimedEntry

// ClaimOutboxEach takes up to want[route] due entries of each route in one
// statement, holding each for horizon: a relay that keeps a limit per
// downstream claims what each has room for in one round trip. Routes with
// no room (0 or less) are left out.
func (l *Ledger) ClaimOutboxEach(ctx context.Context, want map[string]int, horizon time.Duration) ([]*gate.OutboxEntry, error) {
	routes := make([]string, 0, len(want))
	limits := make([]int32, 0, len(want))
	for r, n := range want {
		if n > 0 {
			routes = append(routes, r)
			limits = append(limits, int32(min(n, math.MaxInt32)))
		}
	}
	if len(routes) == 0 {
		return nil, nil
	}
	rows, err := l.pool.Query(ctx, claimEachSQL, routes, limits, horizon.Seconds())
	if err != nil {
		return nil, translate("claim outbox", err)
	}
	out, err := pgx.CollectRows(rows, l.scanOutboxEntry)
	return out, translate("claim outbox", err)
}

// scanOutboxEntry reads one claimed entry with its message, its private
// values opened. One that does not open is returned without its data and
// with the reason (Unopened), for the relay to leave alone.
func (l *Ledger) scanOutboxEntry(r pgx.CollectableRow) (*gate.OutboxEntry, error) {
	var (
		e         gate.OutboxEntry
		m         gate.Message
		published *time.Time
		attrs     []byte
		passes    int
		sealed    sealedEntry
	)
	if err := r.Scan(&e.OperationID, &e.Route, &e.PublicationID, &m.Broker, &m.Source, &m.MessageID,
		&published, &m.OrderingKey, &attrs, &sealed.data, &sealed.sealedWith, &sealed.pointers,
		&e.CreatedAt, &e.NextAttemptAt, &passes); err != nil {
		return nil, err
	}
	var err error
	if m.Data, err = l.openEntry(e.OperationID, sealed); err != nil {
		m.Data, e.Unopened = nil, err
	}
	e.Private = sealed.pointers
	if published != nil {
		m.PublishTime = *published
	}
	if len(attrs) > 0 {
		if err := json.Unmarshal(attrs, &m.Attributes); err != nil {
			return nil, fmt.Errorf("outbox %s: attributes: %w", e.OperationID, err)
		}
	}
	e.Message, e.Passes = &m, passes
	return &e, nil
}

// RescheduleOutbox sets when entry id is due again, after a pass that left
// its operation open (a documented failure, a busy lease), unless the
// entry's schedule moved since the pass claimed it: claimed is the
// next_attempt_at the claim set. An operator's retry-now while the pass
// ran stands (the pass's backoff would otherwise undo it, and the
// intervention row would record a retry that never came), and so does the
// claim of another relay that took the entry once the horizon ran out.
func (l *Ledger) RescheduleOutbox(ctx context.Context, id string, claimed, at time.Time) error {
	_, err := l.pool.Exec(ctx, `UPDATE outbox SET next_attempt_at = $3
WHERE operation_id = $1 AND delivered_at IS NULL AND next_attempt_at = $2`, id, claimed, at)
	return translate("reschedule outbox", err)
}

// sweepOutboxSQL marks up to $1 entries of evidenced operations delivered.
const sweepOutboxSQL = `
UPDATE outbox e SET delivered_at = now(), data = NULL, attributes = NULL
WHERE e.operation_id = ANY (ARRAY(
	SELECT e2.operation_id FROM outbox e2 JOIN operations o ON o.id = e2.operation_id
	WHERE e2.delivered_at IS NULL AND o.state IN ('effect_confirmed', 'ack_pending', 'acknowledged')
	LIMIT $1
	FOR UPDATE OF e2 SKIP LOCKED))`

// SweepOutbox marks delivered, and empties, the entries whose effect is now
// evidenced, however it got there (the relay, a reconciling lookup, an
// operator): the outbox keeps a message only until its effect is known.
// Entries of terminal or indeterminate operations keep theirs, for a replay.
func (l *Ledger) SweepOutbox(ctx context.Context, limit int) (int, error) {
	tag, err := l.pool.Exec(ctx, sweepOutboxSQL, limit)
	if err != nil {
		return 0, translate("sweep outbox", err)
	}
	return int(tag.RowsAffected()), nil
}

// OutboxStat is one route's undelivered entries: how many, since when the
// oldest waits, and since when the oldest of those the relay may take now
// has been due (zero when none is due): how far the relay is behind.
type OutboxStat struct {
	Route     string
	Depth     int64
	Oldest    time.Time
	OldestDue time.Time
}

// OutboxStats reads the depth of each route's outbox from the index of
// undelivered entries, and the oldest due time among the entries a relay
// could claim now (their operation still open, their time come).
func (l *Ledger) OutboxStats(ctx context.Context) ([]OutboxStat, error) {
	rows, err := l.pool.Query(ctx, `SELECT e.route, count(*), min(e.created_at),
			min(e.next_attempt_at) FILTER (WHERE e.next_attempt_at <= now()
				AND o.state IN ('received', 'reserved', 'pending_effect'))
		FROM outbox e JOIN operations o ON o.id = e.operation_id
		WHERE e.delivered_at IS NULL GROUP BY e.route ORDER BY e.route`)
	if err != nil {
		return nil, translate("outbox stats", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxStat, error) {
		var (
			s   OutboxStat
			due *time.Time
		)
		err := r.Scan(&s.Route, &s.Depth, &s.Oldest, &due)
		if due != nil {
			s.OldestDue = *due
		}
		return s, err
	})
	return out, translate("outbox stats", err)
}

// retryOutboxSQL makes an undelivered entry due now, when its operation is
// still open, and records who asked, in one statement: the schedule never
// moves without its intervention row. An entry already due keeps its
// earlier time, and its place in the relay's order. It answers the state
// the entry's operation was found in, and whether the entry was made due.
const retryOutboxSQL = `
WITH e AS (
	SELECT e.operation_id, o.state, o.fence FROM outbox e JOIN operations o ON o.id = e.operation_id
	WHERE e.operation_id = $1 AND e.delivered_at IS NULL
	FOR UPDATE OF e
), due AS (
	UPDATE outbox x SET next_attempt_at = least(x.next_attempt_at, statement_timestamp())
	FROM e WHERE x.operation_id = e.operation_id AND e.state IN ('received', 'reserved', 'pending_effect')
	RETURNING x.operation_id
), kept AS (
	INSERT INTO interventions (operation_id, kind, actor, reason, from_state, to_state, fence, at)
	SELECT e.operation_id, 'retry_now', $2, $3, e.state, e.state, e.fence, statement_timestamp()
	FROM e JOIN due ON due.operation_id = e.operation_id
)
SELECT e.state, EXISTS (SELECT 1 FROM due) FROM e`

// RetryOutbox makes operation id's undelivered outbox entry due at once,
// for the next relay pass, and records the operator's request as a
// retry_now intervention. It holds no lease: it changes only when the
// relay may take the entry up, and the pass still takes the operation's
// lease before any call. Errors: gate.ErrNotFound when there is no
// undelivered entry, gate.ErrRefused when its operation is no longer open
// (the relay would leave the entry alone however due it was), and
// gate.ErrInvalidResolution for an actor or reason the ledger must not keep.
func (l *Ledger) RetryOutbox(ctx context.Context, id, actor, reason string) error {
	if err := (gate.Resolution{Kind: gate.OutboxRetryNow, Actor: actor, Reason: reason}).Check(); err != nil {
		return err
	}
	var (
		state gate.State
		due   bool
	)
	err := l.pool.QueryRow(ctx, retryOutboxSQL, id, actor, reason).Scan(&state, &due)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("storage: retry outbox: %w: no undelivered outbox entry for %s", gate.ErrNotFound, id)
	case err != nil:
		return translate("retry outbox", err)
	case !due:
		return fmt.Errorf("%w: %s is %s: the relay takes up only entries of open operations", gate.ErrRefused, id, state)
	}
	return nil
}
