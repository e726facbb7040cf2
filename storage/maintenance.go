package storage

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackgate/ackgate/gate"
)

// Maintenance holds the queries of the work every replica does beside the
// push path (package recovery): claiming indeterminate operations for the
// reconciler, purging expired evidence, and counting the lanes. Each is one
// short statement, safe to run from every replica at once: rows are taken
// with FOR UPDATE SKIP LOCKED, so two replicas never work the same row and
// neither waits for the other.
type Maintenance struct {
	pool *pgxpool.Pool
}

// NewMaintenance uses pool for every call; the pool belongs to the caller.
func NewMaintenance(pool *pgxpool.Pool) *Maintenance { return &Maintenance{pool: pool} }

// settledStates may be purged once their retention has run out. Everything
// else is open work: its evidence is what keeps a late redelivery from
// looking new, so it is never purged automatically (see KeptOpen).
const settledStates = `('acknowledged', 'terminal_failure', 'conflicting')`

// claimDueSQL takes up to $4 indeterminate operations of lookup route $1
// whose check is due (the first one $2 after the operation last changed)
// and moves their next check $3 ahead, so that no other replica takes them
// until this one's lookup is over. The operation's own lease still guards
// the write: the claim only spares the lookup endpoint a second question.
const claimDueSQL = `
UPDATE operations AS o SET next_check_at = now() + $3::bigint * interval '1 microsecond'
FROM (
	SELECT id FROM operations
	WHERE waiting = 'effect_indeterminate' AND state = 'effect_indeterminate' AND conflict_of IS NULL AND shape IN ('lookup', 'handoff') AND route = $1
		AND coalesce(next_check_at, updated_at + $2::bigint * interval '1 microsecond') <= now()
	ORDER BY coalesce(next_check_at, updated_at + $2::bigint * interval '1 microsecond'), id
	LIMIT $4
	FOR UPDATE SKIP LOCKED
) due
WHERE o.id = due.id
RETURNING ` + operationColumns

// ClaimDue claims up to limit indeterminate operations of lookup route
// route that are due for a check: never checked and unchanged for interval,
// or past their next_check_at. Their next check moves horizon ahead, which
// must outlast the lookup the caller is about to make.
func (m *Maintenance) ClaimDue(ctx context.Context, route string, interval, horizon time.Duration, limit int) ([]gate.Operation, error) {
	rows, err := m.pool.Query(ctx, claimDueSQL, route, interval.Microseconds(), horizon.Microseconds(), limit)
	if err != nil {
		return nil, translate("claim due checks", err)
	}
	ops, err := collect(rows, []gate.Operation{}, operationFields)
	return ops, translate("claim due checks", err)
}

// purgeSQL deletes up to $1 settled operations whose retention has run out,
// oldest first, with everything that hangs off them (deliveries, attempts,
// transitions, dead letters and interventions go by ON DELETE CASCADE).
//
// Conflict records go with their original when it goes (by the cascade,
// and the RETURNING names them), or on their own when their original stays.
// An original stays while one of its conflict records is still retained:
// the cascade would have to delete that record too, and the retention guard
// would refuse the whole batch. A conflict record whose original goes in
// this pass is left to the cascade, so that it is removed, and counted,
// once.
const purgeSQL = `
WITH doomed AS (
	SELECT o.id FROM operations o
	WHERE o.retain_until < now() AND o.state IN ` + settledStates + `
		AND NOT EXISTS (SELECT 1 FROM operations c WHERE c.conflict_of = o.id AND c.retain_until >= now())
		AND (o.conflict_of IS NULL OR NOT EXISTS (SELECT 1 FROM operations orig
			WHERE orig.id = o.conflict_of AND orig.retain_until < now() AND orig.state IN ` + settledStates + `
				AND NOT EXISTS (SELECT 1 FROM operations c WHERE c.conflict_of = orig.id AND c.retain_until >= now())))
	ORDER BY o.retain_until
	LIMIT $1
	FOR UPDATE SKIP LOCKED
)
DELETE FROM operations o USING doomed WHERE o.id = doomed.id
RETURNING o.id, o.route, ARRAY(SELECT c.id FROM operations c WHERE c.conflict_of = o.id)`

// PurgeBatch deletes up to limit expired settled operations in one short
// transaction and returns their ids by route, with the conflict records
// that went with them. Fewer than limit means nothing more is expired right
// now (or another replica holds the rest).
func (m *Maintenance) PurgeBatch(ctx context.Context, limit int) (map[string][]string, error) {
	rows, err := m.pool.Query(ctx, purgeSQL, limit)
	if err != nil {
		return nil, translate("purge", err)
	}
	out := map[string][]string{}
	var (
		id, route string
		cascaded  []string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &route, &cascaded}, func() error {
		out[route] = append(out[route], id)
		out[route] = append(out[route], cascaded...)
		return nil
	})
	return out, translate("purge", err)
}

// KeptOpen counts, per route, the operations past their retention that the
// purge keeps because they are not settled: an open, indeterminate or
// confirmed-but-unacknowledged operation is still the only thing that tells
// a redelivery it is not new.
func (m *Maintenance) KeptOpen(ctx context.Context) (map[string]int64, error) {
	rows, err := m.pool.Query(ctx, `SELECT route, count(*) FROM operations
		WHERE retain_until < now() AND state NOT IN `+settledStates+` GROUP BY route`)
	if err != nil {
		return nil, translate("kept open", err)
	}
	out := map[string]int64{}
	var (
		route string
		n     int64
	)
	_, err = pgx.ForEachRow(rows, []any{&route, &n}, func() error {
		out[route] = n
		return nil
	})
	return out, translate("kept open", err)
}

// PurgePoison deletes up to limit poison records of route last seen before
// cutoff. With others set, it deletes those of every route not in others
// instead (routes that left the routes file), under the same cutoff.
func (m *Maintenance) PurgePoison(ctx context.Context, route string, others []string, cutoff time.Time, limit int) (int64, error) {
	q := `DELETE FROM poison_messages WHERE (route, fingerprint) IN (
		SELECT route, fingerprint FROM poison_messages WHERE route = $1 AND last_seen < $2
		LIMIT $3 FOR UPDATE SKIP LOCKED)`
	args := []any{route, cutoff, limit}
	if others != nil {
		q = `DELETE FROM poison_messages WHERE (route, fingerprint) IN (
			SELECT route, fingerprint FROM poison_messages WHERE route <> ALL($1) AND last_seen < $2
			LIMIT $3 FOR UPDATE SKIP LOCKED)`
		args[0] = others
	}
	tag, err := m.pool.Exec(ctx, q, args...)
	if err != nil {
		return 0, translate("purge poison", err)
	}
	return tag.RowsAffected(), nil
}

// laneWaiting selects the states an operation waits in: open work, the
// indeterminate lane and the terminal one. Settled, acknowledged work and
// conflict records are history, not lanes, and are not counted; the partial
// index operations_waiting (migration 0016) holds these and conflict
// records only, so the count reads the index, never the whole table.
const laneWaiting = `('open', 'effect_indeterminate', 'terminal_failure')`

// LaneStat is how many operations of a route wait in one lane state, and
// since when the oldest of them exists.
type LaneStat struct {
	Route  string
	State  gate.State
	N      int64
	Oldest time.Time
}

// LaneStats counts every lane of every route in one statement. It is what
// the lane gauges' background refresh runs; nothing runs it per scrape.
func (m *Maintenance) LaneStats(ctx context.Context) ([]LaneStat, error) {
	rows, err := m.pool.Query(ctx, `SELECT route, state, count(*), min(created_at) FROM operations
		WHERE waiting IN `+laneWaiting+` AND conflict_of IS NULL
		GROUP BY route, state ORDER BY route, state`)
	if err != nil {
		return nil, translate("lane stats", err)
	}
	out, err := collect(rows, []LaneStat{}, func(s *LaneStat) []any { return []any{&s.Route, &s.State, &s.N, &s.Oldest} })
	return out, translate("lane stats", err)
}
