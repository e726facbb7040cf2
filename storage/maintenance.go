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
// It is the reconciler's bookkeeping, not a step of the operation, so it is
// no change of the ledger's: it moves no state and no fence.
var claimDueSQL = expandColumns(`
UPDATE operations AS o SET next_check_at = now() + $3::bigint * interval '1 microsecond'
WHERE o.seq = ANY (ARRAY(
	SELECT seq FROM operations
	WHERE waiting = 'effect_indeterminate' AND route = $1 AND shape IN ('lookup', 'handoff')
		AND coalesce(next_check_at, updated_at + $2::bigint * interval '1 microsecond') <= now()
	ORDER BY coalesce(next_check_at, updated_at + $2::bigint * interval '1 microsecond'), seq
	LIMIT $4
	FOR UPDATE SKIP LOCKED))
RETURNING {{operation o}}`)

// ClaimDue claims up to limit indeterminate operations of lookup route
// route that are due for a check: never checked and unchanged for interval,
// or past their next_check_at. Their next check moves horizon ahead, which
// must outlast the lookup the caller is about to make.
func (m *Maintenance) ClaimDue(ctx context.Context, route string, interval, horizon time.Duration, limit int) ([]gate.Operation, error) {
	rows, err := m.pool.Query(ctx, claimDueSQL, route, interval.Microseconds(), horizon.Microseconds(), limit)
	if err != nil {
		return nil, translate("claim due checks", err)
	}
	ops := []gate.Operation{}
	for rows.Next() {
		var s scannedOperation
		if err := rows.Scan(s.fields()...); err != nil {
			rows.Close()
			return nil, translate("claim due checks", err)
		}
		ops = append(ops, *s.operation(nil))
	}
	return ops, translate("claim due checks", rows.Err())
}

// purgeSQL deletes up to $1 settled operations whose retention has run out,
// oldest first along the operations' time order, with everything that
// hangs off them (side rows go by ON DELETE CASCADE).
//
// An original stays while one of its conflict records is still retained;
// when it goes, its conflict records go with it in the same statement (and
// are named), and a conflict record whose original stays goes on its own.
const purgeSQL = `
WITH doomed AS (
	SELECT o.seq, o.id FROM operations o
	WHERE o.retain_until < now() AND o.state IN ` + settledStates + `
		AND NOT EXISTS (SELECT 1 FROM operations c WHERE c.conflict_of = o.id AND c.retain_until >= now())
	ORDER BY o.seq
	LIMIT $1
	FOR UPDATE SKIP LOCKED
), gone AS (
	DELETE FROM operations o USING doomed WHERE o.seq = doomed.seq
	RETURNING o.id, o.route
), records AS (
	DELETE FROM operations c USING gone
	WHERE c.conflict_of = gone.id AND c.seq NOT IN (SELECT seq FROM doomed)
	RETURNING c.id, c.route
)
SELECT id, route FROM gone UNION ALL SELECT id, route FROM records`

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
	var id, route string
	_, err = pgx.ForEachRow(rows, []any{&id, &route}, func() error {
		out[route] = append(out[route], id)
		return nil
	})
	return out, translate("purge", err)
}

// KeptOpen counts, per route, the operations past their retention that the
// purge keeps because they are not settled: an open, indeterminate or
// confirmed-but-unacknowledged operation is still the only thing that tells
// a redelivery it is not new. Open work that old has been swept into the
// lanes, so the count reads the lanes' index.
func (m *Maintenance) KeptOpen(ctx context.Context) (map[string]int64, error) {
	rows, err := m.pool.Query(ctx, `SELECT route, count(*) FROM operations
		WHERE waiting IN ('open', 'effect_indeterminate') AND retain_until < now() GROUP BY route`)
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
	sql, routes := purgePoisonSQL(false), any(route)
	if others != nil {
		sql, routes = purgePoisonSQL(true), others
	}
	tag, err := m.pool.Exec(ctx, sql, routes, cutoff, limit)
	if err != nil {
		return 0, translate("purge poison", err)
	}
	return tag.RowsAffected(), nil
}

// purgePoisonSQL deletes poison records of route $1 (with others, of every
// route but those in $1) last seen before $2, at most $3 of them. It goes
// by ctid from an array built once, like the outbox's claims (outbox.go):
// a join to the locking subquery can run it once per row
// (TestPoisonPurgeLocksOncePerPass).
func purgePoisonSQL(others bool) string {
	which := "route = $1"
	if others {
		which = "route <> ALL($1)"
	}
	return `DELETE FROM poison_messages WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM poison_messages WHERE ` + which + ` AND last_seen < $2
		LIMIT $3 FOR UPDATE SKIP LOCKED))`
}

// LaneStat is how many operations of a route wait in one lane state, and
// since when the oldest of them exists.
type LaneStat struct {
	Route  string
	State  gate.State
	N      int64
	Oldest time.Time
}

// LaneStats counts every lane of every route in one statement, from the
// lanes' index: open work off the common path (swept or logged), the
// indeterminate lane and the terminal one. Conflict records are history,
// not work, and are not counted. It is what the lane gauges' background
// refresh runs; nothing runs it per scrape.
func (m *Maintenance) LaneStats(ctx context.Context) ([]LaneStat, error) {
	rows, err := m.pool.Query(ctx, `SELECT route, state, count(*), min(created_at) FROM operations
		WHERE waiting IN ('open', 'effect_indeterminate', 'terminal_failure')
		GROUP BY route, state ORDER BY route, state`)
	if err != nil {
		return nil, translate("lane stats", err)
	}
	out, err := collect(rows, []LaneStat{}, func(s *LaneStat) []any { return []any{&s.Route, &s.State, &s.N, &s.Oldest} })
	return out, translate("lane stats", err)
}

// sweepSQL moves open work that outlived every owner's bound into the
// lanes (waiting = 'open'), reading each row once: the rows between the
// sweep's cursor and the newest seq the ledger had reached $1 ago (a mark
// of an earlier pass), and then notes where the ledger is now for a later
// pass. Replicas running it at once queue on the cursor's row.
const sweepSQL = `
WITH cursor AS (
	SELECT seq FROM sweep_cursor FOR UPDATE
), upto AS (
	SELECT max(m.seq) AS seq FROM sweep_marks m WHERE m.at <= now() - $1::bigint * interval '1 microsecond'
), swept AS (
	UPDATE operations o SET waiting = 'open'
	FROM cursor, upto
	WHERE o.seq > cursor.seq AND o.seq <= upto.seq AND o.waiting IS NULL AND o.state <> 'acknowledged'
	RETURNING o.seq
), moved AS (
	UPDATE sweep_cursor SET seq = upto.seq FROM upto, cursor WHERE upto.seq > cursor.seq
), marked AS (
	INSERT INTO sweep_marks (at, seq)
	SELECT now(), coalesce((SELECT seq FROM operations ORDER BY seq DESC LIMIT 1), 0)
	ON CONFLICT (at) DO NOTHING
), forgotten AS (
	DELETE FROM sweep_marks m USING upto WHERE m.seq < upto.seq
)
SELECT count(*) FROM swept`

// Sweep moves open work older than after (the longest any owner may still
// be at work: every route's ack deadline plus its lease extension) into the
// lanes, so the lanes and their gauges see work no owner finished, and
// returns how many operations it moved.
func (m *Maintenance) Sweep(ctx context.Context, after time.Duration) (int64, error) {
	var n int64
	err := m.pool.QueryRow(ctx, sweepSQL, after.Microseconds()).Scan(&n)
	return n, translate("sweep", err)
}
