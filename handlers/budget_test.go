package handlers_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/downstream"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
)

// The budget of a delivery, counted by the servers themselves: Postgres's
// pg_stat_database.xact_commit for the gateway's database, and Redis
// top-level commands seen by MONITOR. A new operation may cost one read plus
// two commits and one Redis round trip before its ack; a redelivery of a
// confirmed operation one read and nothing else. After the ack, the
// background queue (gate.AfterAnswer) marks a batch of acks in the ledger's
// shared commits and releases the batch's leases in one Redis command.
func TestRoundTripBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testenv.DatabaseURL(t)
	if err := storage.Migrate(ctx, dbURL); err != nil {
		t.Fatal(err)
	}
	dbName := databaseName(t, dbURL)
	// Observe from another database, so the observer's own queries are not counted.
	obs, err := pgx.Connect(ctx, testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { obs.Close(ctx) })

	redisAddr := testenv.Redis(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { rdb.Close() })
	redisCommands := testenv.CountRedisCommands(t, redisAddr)

	down := newEffectServer(t, true)
	routes, err := config.ParseRoutes([]byte(strings.ReplaceAll("routes:\n"+routeYAML("orders", "idempotent", "broker", ""), "{{DOWN}}", down.URL())))
	if err != nil {
		t.Fatal(err)
	}
	route := routes[0]
	effects := downstream.New(downstream.Options{})
	t.Cleanup(effects.CloseIdleConnections)
	g := &gate.Gate{Reservations: storage.NewReservations(rdb), Effects: effects, Owner: "budget", Now: time.Now,
		NewToken: func() string { return "t" }}

	// Each phase gets a fresh one-connection pool that is closed afterwards:
	// a backend flushes its statistics when it exits, so the count is exact
	// once it has left pg_stat_activity. Exec mode sends each query as one
	// extended-protocol exchange, without separate prepare transactions, and
	// pings are off so the pool adds nothing of its own.
	var pool *pgxpool.Pool
	open := func() {
		cfg, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 1
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		g.Ledger = storage.NewLedger(pool)
	}
	xacts := func() int64 {
		pool.Close()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var backends int
			if err := obs.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, dbName).Scan(&backends); err != nil {
				t.Fatal(err)
			}
			if backends == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d backends still on %s", backends, dbName)
			}
			time.Sleep(10 * time.Millisecond)
		}
		var n int64
		if err := obs.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = $1`, dbName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// rows reads, from the gateway's own database, how often the operations
	// row was written and how many log entries exist. The statistics are the
	// ones the closed backends flushed, so read them after xacts.
	// The connection is its own and closed before the next count of
	// transactions begins, so it is never counted as the gateway's.
	type rowCounts struct{ opWrites, logEntries int64 }
	rows := func() rowCounts {
		var c rowCounts
		stats, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer stats.Close(ctx)
		err = stats.QueryRow(ctx, `SELECT
			(SELECT n_tup_ins + n_tup_upd FROM pg_stat_user_tables WHERE relname = 'operations'),
			(SELECT count(*) FROM transitions)`).Scan(&c.opWrites, &c.logEntries)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// phase runs f on a fresh pool and returns the transactions and Redis
	// commands it cost, less what merely connecting costs.
	var connectCost int64
	var lastRows rowCounts
	phase := func(f func()) (int64, int) {
		before := rows()
		base := xacts()
		r0 := redisCommands()
		open()
		f()
		r1 := redisCommands()
		n := xacts() - base - connectCost
		after := rows()
		lastRows = rowCounts{after.opWrites - before.opWrites, after.logEntries - before.logEntries}
		return n, r1 - r0
	}
	open()
	connectCost, _ = phase(func() {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c.Release()
	})

	deliver := func(id string) *gate.Result {
		res, err := g.Deliver(ctx, route, &gate.Message{Broker: gate.BrokerPubSub, Source: "s", MessageID: id, Data: []byte("x")})
		if err != nil || res.Decision != gate.Ack {
			t.Fatalf("deliver %s: %+v %v", id, res, err)
		}
		return res
	}
	// Warm up: load the reservation script into Redis.
	phase(func() { deliver("warm").Finish(ctx, nil, true) })

	var res *gate.Result
	newTx, newRedis := phase(func() { res = deliver("m-new") })
	newRows := lastRows
	postTx, postRedis := phase(func() { res.Finish(ctx, nil, true) })
	postRows := lastRows
	againTx, againRedis := phase(func() { res = deliver("m-new") })
	againRows := lastRows

	// The gateway runs that work in the background, in batches: the ack
	// marks of a batch share the ledger's commits and its leases go in one
	// Redis command. How the queued results fall into batches and commits
	// depends on timing, so the budget is stated per batch and per commit.
	const k = 8
	batch := make([]*gate.Result, k)
	phase(func() {
		for i := range batch {
			batch[i] = deliver(fmt.Sprintf("m-batch-%d", i))
		}
	})
	var (
		after            *gate.AfterAnswer
		commits, batches int64
		queued, inline   int64
	)
	batchTx, batchRedis := phase(func() {
		after = gate.NewAfterAnswer(g.Reservations, nil, gate.AfterAnswerOptions{})
		before, _ := g.Ledger.(*storage.Ledger).GroupCommitStats()
		for _, r := range batch {
			after.Finish(ctx, r, true)
		}
		if err := after.Close(ctx); err != nil {
			t.Fatal(err)
		}
		now, _ := g.Ledger.(*storage.Ledger).GroupCommitStats()
		commits = int64(now - before)
		queued, inline, batches = after.Counts()
	})
	batchRows := lastRows
	t.Logf("after the ack, %d results through the background queue: %d batches, %d shared commits, "+
		"%d Postgres transactions, %d Redis commands; rows %+v", k, batches, commits, batchTx, batchRedis, batchRows)
	if queued != k || inline != 0 {
		t.Errorf("queued %d, inline %d; want all %d queued", queued, inline, k)
	}
	if batchTx != commits || commits < 1 || commits > k {
		t.Errorf("%d transactions for %d shared commits of %d ack marks; budget: one per shared commit", batchTx, commits, k)
	}
	if int64(batchRedis) != batches || batches < 1 || batches > k {
		t.Errorf("%d Redis commands for %d batches; budget: one lease release command per batch", batchRedis, batches)
	}
	if batchRows != (rowCounts{k, k}) {
		t.Errorf("operations row writes and log entries after %d acks: %+v, want {%d %d}", k, batchRows, k, k)
	}

	t.Logf("new operation before its ack: %d Postgres transactions (1 read + commits), %d Redis commands", newTx, newRedis)
	t.Logf("after the ack (ack recorded, lease released): %d Postgres transactions, %d Redis commands", postTx, postRedis)
	t.Logf("redelivery of a confirmed operation before its ack: %d Postgres transactions, %d Redis commands", againTx, againRedis)
	if newTx != 3 || newRedis != 1 {
		t.Errorf("new operation cost %d transactions and %d Redis commands; budget: 1 read + 2 commits, 1 Redis round trip", newTx, newRedis)
	}
	t.Logf("operations row writes / log entries: new %+v, after the ack %+v, redelivery %+v", newRows, postRows, againRows)
	// One write of the row per step, whatever the length of its path: the
	// claim's INSERT (received -> reserved -> pending_effect) and the
	// settlement's UPDATE (-> effect_confirmed -> ack_pending); after the ack
	// one UPDATE (-> acknowledged). The redelivery writes nothing before its
	// answer (its own delivery row follows the response).
	if newRows != (rowCounts{2, 5}) || postRows != (rowCounts{1, 1}) || againRows != (rowCounts{0, 0}) {
		t.Errorf("operations row writes and log entries: new %+v, want {2 5}; after the ack %+v, want {1 1}; "+
			"redelivery %+v, want none", newRows, postRows, againRows)
	}
	if postTx != 1 || postRedis != 1 {
		t.Errorf("after the ack, on the delivery's goroutine: %d transactions and %d Redis commands; budget: 1 commit, 1 release", postTx, postRedis)
	}
	if againTx != 1 || againRedis != 0 {
		t.Errorf("redelivery cost %d transactions and %d Redis commands; budget: 1 read, nothing else", againTx, againRedis)
	}
	if down.effectCalls.Load() != 2+k {
		t.Errorf("downstream calls = %d, want %d (warm-up, m-new and the batch)", down.effectCalls.Load(), 2+k)
	}
}

func databaseName(t *testing.T, dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" {
		t.Fatalf("no database name in %s", u.Redacted())
	}
	return name
}
