package storage

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

// DefaultPoisonPerRoute caps the poison records kept per route. Redeliveries
// of a kept message only count; distinct messages beyond the cap are not
// kept, so a route that receives garbage without end (auth: none, or a
// publisher gone wrong) cannot grow the table without end either.
const DefaultPoisonPerRoute = 10000

// PoisonLog is the Postgres table of messages that could never be processed
// (migrations/0009_poison_messages.sql).
type PoisonLog struct {
	pool     *pgxpool.Pool
	perRoute int
}

// NewPoisonLog uses pool for every call; the pool belongs to the caller.
// perRoute caps the records per route; 0 means DefaultPoisonPerRoute.
func NewPoisonLog(pool *pgxpool.Pool, perRoute int) *PoisonLog {
	if perRoute <= 0 {
		perRoute = DefaultPoisonPerRoute
	}
	return &PoisonLog{pool: pool, perRoute: perRoute}
}

// recordPoisonSQL counts a redelivery of a kept message, or keeps a new one
// while its route has room; one statement, one commit. It answers whether the
// message is on record. A message another delivery inserts at the same moment
// is counted by ON CONFLICT; two new messages racing for a route's last place
// may both take it, which overshoots the cap by little.
const recordPoisonSQL = `
WITH seen AS (
	UPDATE poison_messages SET count = count + 1, last_seen = greatest(last_seen, $6), reason = $5,
		acked = $7, message_id = CASE WHEN $4 = '' THEN message_id ELSE $4 END
	WHERE route = $1 AND fingerprint = $2
	RETURNING 1
), kept AS (
	INSERT INTO poison_messages (route, fingerprint, broker, message_id, reason, first_seen, last_seen, acked)
	SELECT $1, $2, $3, $4, $5, $6, $6, $7
	WHERE NOT EXISTS (SELECT 1 FROM seen)
		AND (SELECT count(*) FROM (SELECT 1 FROM poison_messages WHERE route = $1 LIMIT $8) room) < $8
	ON CONFLICT (route, fingerprint) DO UPDATE SET count = poison_messages.count + 1,
		last_seen = greatest(poison_messages.last_seen, excluded.last_seen), reason = excluded.reason,
		acked = excluded.acked
	RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM seen) OR EXISTS (SELECT 1 FROM kept)`

// Record keeps p, or counts it again when its route already has it. kept is
// false when the route's records are full and p is not among them.
func (l *PoisonLog) Record(ctx context.Context, p *gate.Poison) (kept bool, err error) {
	if p.Route == "" || p.Fingerprint == "" {
		return false, errors.New("storage: record poison: the record needs its route and fingerprint")
	}
	err = l.pool.QueryRow(ctx, recordPoisonSQL, p.Route, p.Fingerprint, string(p.Broker),
		p.MessageID, p.Reason, orNow(p.At), p.Acked, l.perRoute).Scan(&kept)
	return kept, translate("record poison", err)
}

// List returns poison records, the most recently first seen first, with a
// cursor for the next page ("" when there is none). Paging is keyset on
// (first_seen, route, fingerprint), which redeliveries do not change.
func (l *PoisonLog) List(ctx context.Context, f adminapi.PoisonFilter) ([]adminapi.PoisonRecord, string, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	limit = min(limit, maxListLimit)
	if gate.Unstorable(f.Route) != "" {
		return nil, "", fmt.Errorf("storage: list poison: %w: route", adminapi.ErrInvalidFilter)
	}
	sql := `SELECT route, fingerprint, broker, message_id, reason, count, first_seen, last_seen, acked
		FROM poison_messages WHERE ($1 = '' OR route = $1)`
	args := []any{f.Route}
	if f.Cursor != "" {
		at, route, fp, err := decodePoisonCursor(f.Cursor)
		if err != nil {
			return nil, "", fmt.Errorf("storage: list poison: %w: %v", adminapi.ErrInvalidFilter, err)
		}
		sql += ` AND (first_seen, route, fingerprint) < ($2, $3, $4)`
		args = append(args, at, route, fp)
	}
	args = append(args, limit+1)
	sql += ` ORDER BY first_seen DESC, route DESC, fingerprint DESC LIMIT $` + strconv.Itoa(len(args))
	rows, err := l.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, "", translate("list poison", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (adminapi.PoisonRecord, error) {
		var p adminapi.PoisonRecord
		err := r.Scan(&p.Route, &p.Fingerprint, &p.Broker, &p.MessageID, &p.Reason, &p.Count, &p.FirstSeen, &p.LastSeen, &p.Acked)
		return p, err
	})
	if err != nil {
		return nil, "", translate("list poison", err)
	}
	if len(out) <= limit {
		return out, "", nil
	}
	out = out[:limit]
	last := out[limit-1]
	return out, encodePoisonCursor(last.FirstSeen, last.Route, last.Fingerprint), nil
}

// A poison cursor is opaque to clients: first_seen in microseconds (what
// Postgres keeps), route and fingerprint, none of which holds a colon.
func encodePoisonCursor(at time.Time, route, fp string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at.UnixMicro(), 10) + ":" + route + ":" + fp))
}

func decodePoisonCursor(s string) (time.Time, string, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return time.Time{}, "", "", errors.New("malformed cursor")
	}
	parts := strings.Split(string(raw), ":")
	if len(parts) != 3 || parts[1] == "" || parts[2] == "" || gate.Unstorable(string(raw)) != "" {
		return time.Time{}, "", "", errors.New("malformed cursor")
	}
	micros, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil {
		return time.Time{}, "", "", errors.New("malformed cursor")
	}
	return time.UnixMicro(micros), parts[1], parts[2], nil
}
