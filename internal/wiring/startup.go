package wiring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/storage"
)

// A gateway starts whether or not Postgres and Redis answer. In a failover
// or a database restart every replica would otherwise crash-loop at once,
// and a restart loop answers nothing, not even the readiness probe that tells
// the load balancer to send deliveries elsewhere. Instead the process comes
// up, /readyz answers 503 naming what is missing, each delivery is nacked
// (the gate cannot record it, and the broker redelivers), and both clients
// connect by themselves once the service is back: pgxpool dials on demand,
// and go-redis redials a broken connection.
//
// What cannot heal by waiting still stops the start: a URL that does not
// parse, and a server that answered and refused the login or the database.

// startupProbe bounds the one look at each service during start-up, so a
// service that does not answer delays the listeners by at most this much.
const startupProbe = 5 * time.Second

// openPool builds the ledger's pool without requiring a connection
// (storage.NewPool), with the start-up ping reduced to a probe whose
// failure is logged rather than fatal, except for the refusals listed in
// fatalAtStart. answered says whether Postgres answered the probe.
func openPool(ctx context.Context, databaseURL string, log *slog.Logger, opts ...storage.PoolOption) (pool *pgxpool.Pool, answered bool, err error) {
	pool, err = storage.NewPool(ctx, databaseURL, opts...)
	if err != nil {
		return nil, false, err
	}
	pctx, cancel := context.WithTimeout(ctx, startupProbe)
	defer cancel()
	err = pool.Ping(pctx)
	switch {
	case err == nil:
		return pool, true, nil
	case fatalAtStart(err):
		pool.Close()
		return nil, false, fmt.Errorf("storage: open pool: %w", err)
	}
	log.Warn("postgres does not answer at start; serving anyway: /readyz answers 503 and deliveries are nacked until it does",
		"err", err)
	return pool, false, nil
}

// hasLocal says whether any route runs a local statement.
func hasLocal(routes []*gate.Route) bool {
	for _, r := range routes {
		if r.Shape == gate.ShapeLocal {
			return true
		}
	}
	return false
}

// fatalAtStart reports a Postgres answer that waiting will not change: the
// server is up and refuses this login or this database. Anything else (no
// route, connection refused, a timeout, a server starting up or in
// recovery, no read-write host among several) may be an outage or a
// failover in progress.
func fatalAtStart(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "28000", // invalid_authorization_specification (pg_hba refused it)
		"28P01", // invalid_password
		"3D000": // invalid_catalog_name: no such database
		return true
	}
	return false
}

// ClusterStateReload is how stale a Redis Cluster client's map of slots to
// primaries may get. go-redis refreshes it on a MOVED answer, and otherwise
// only every ClusterStateReloadInterval (60 s by default): a primary that
// dies answers nothing, not MOVED, so the client would keep dialling it,
// and every delivery whose key hashes there would be nacked, for up to a
// minute after its replica took over (the failover drill measured 49 s).
// One CLUSTER SLOTS a second, sent only while commands flow, is nothing
// beside a delivery's own commands.
const ClusterStateReload = time.Second

// RedisClient is the gateway's Redis client for o: as
// redis.NewUniversalClient builds it, with a Cluster client's slot map
// refreshed every ClusterStateReload.
func RedisClient(o *redis.UniversalOptions) redis.UniversalClient {
	if o.MasterName == "" && (len(o.Addrs) > 1 || o.IsClusterMode) {
		co := o.Cluster()
		co.ClusterStateReloadInterval = ClusterStateReload
		return redis.NewClusterClient(co)
	}
	return redis.NewUniversalClient(o)
}

// probeRedis looks at Redis once, to say in the log at start that it is
// missing; the client connects whenever it can.
func probeRedis(ctx context.Context, rdb redis.UniversalClient, log *slog.Logger) {
	pctx, cancel := context.WithTimeout(ctx, startupProbe)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		log.Warn("redis does not answer at start; serving anyway: /readyz answers 503 and deliveries are nacked until it does",
			"err", err)
	}
}
