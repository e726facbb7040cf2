package handlers_test

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"strings"
	"sync/atomic"
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

// statementCounter counts the statements a pool sends, alone or in a
// batch, and its round trips: what the gateway asks of Postgres.
type statementCounter struct{ n, trips atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	c.trips.Add(1)
	return ctx
}
func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.trips.Add(1)
	return ctx
}
func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.n.Add(1)
}
func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// tableCounts is what Postgres counted for one table: rows inserted,
// updated (and of those, HOT), and scans of any kind, which is where a
// trigger's query or an extra read would show.
type tableCounts struct{ ins, upd, hot, scans int64 }

// cost is what one phase cost, counted by the servers where they count it:
// Postgres transactions (xact_commit), statements sent (the pool's own
// count), rows and scans per table, index entries written, Redis commands.
type cost struct {
	xacts, statements int64
	// trips are the pool's round trips, each a transaction of its own: the
	// client's count of what xacts counts on the server.
	trips        int64
	tables       map[string]tableCounts
	indexEntries int64
	redis        int
}

// rows is the rows a phase wrote to table: inserted, updated, HOT.
func (c cost) rows(table string) tableCounts {
	t := c.tables[table]
	t.scans = 0
	return t
}

// minus is c less what b counted, table by table.
func (c cost) minus(b cost) cost {
	d := cost{xacts: c.xacts - b.xacts, statements: c.statements - b.statements, trips: c.trips - b.trips,
		indexEntries: c.indexEntries - b.indexEntries,
		redis:        c.redis - b.redis, tables: map[string]tableCounts{}}
	for name, t := range c.tables {
		o := b.tables[name]
		d.tables[name] = tableCounts{t.ins - o.ins, t.upd - o.upd, t.hot - o.hot, t.scans - o.scans}
	}
	return d
}

// sideRows is every row written to a table other than operations.
func (c cost) sideRows() map[string]tableCounts {
	out := map[string]tableCounts{}
	for name, t := range c.tables {
		if name != "operations" && (t.ins != 0 || t.upd != 0) {
			out[name] = t
		}
	}
	return out
}

// The budget of a delivery, counted by the servers themselves. A new
// operation costs, before its ack, two statements (the claim that creates
// it, the change that records its evidence), each its own commit, and one
// Redis round trip (the lease the ledger gave it); after the ack, one more
// statement (the ack mark) and the lease's release. Its row is written
// three times and nothing else is: no side row, two index entries (the
// primary key and the id), both updates HOT, and no table read but the
// operation's own, by its key. A redelivery of acknowledged work costs one
// statement, the claim that finds it and records it, and nothing else.
//
// Postgres's count of a database's commits includes autovacuum's, which
// may visit a database at any moment; a run in which the server counted
// transactions the pool never made is measured again on a fresh database,
// and after three such runs the pool's round trips, each a transaction of
// its own, are the count.
func TestRoundTripBudget(t *testing.T) {
	t.Parallel()
	var b budget
	for attempt := 1; ; attempt++ {
		var clean bool
		b, clean = measureBudget(t)
		if clean {
			break
		}
		if attempt == 3 {
			// Every transaction the gateway makes is one of its pool's
			// round trips, so their count stands in for the server's.
			t.Logf("in %d runs the server's count of commits included autovacuum's; the pool's round trips are the count", attempt)
			for _, c := range []*cost{&b.fresh, &b.post, &b.again, &b.againPost, &b.shared} {
				c.xacts = c.trips
			}
			break
		}
		t.Logf("run %d: the server counted transactions the gateway did not make (autovacuum); measuring again", attempt)
	}
	fresh, post, again, againPost, shared := b.fresh, b.post, b.again, b.againPost, b.shared
	for name, c := range map[string]cost{"new operation before its ack": fresh, "after its ack": post,
		"redelivery of acknowledged work": again, "after the redelivery's ack": againPost} {
		t.Logf("%s: %d statements, %d transactions, %d Redis commands, %d index entries, operations %+v, side rows %+v",
			name, c.statements, c.xacts, c.redis, c.indexEntries, c.tables["operations"], c.sideRows())
	}
	if fresh.statements != 2 || fresh.xacts != 2 || fresh.redis != 1 {
		t.Errorf("new operation before its ack: %d statements, %d transactions, %d Redis commands; budget: 2, 2, 1",
			fresh.statements, fresh.xacts, fresh.redis)
	}
	if got := fresh.rows("operations"); got != (tableCounts{ins: 1, upd: 1, hot: 1}) || len(fresh.sideRows()) != 0 {
		t.Errorf("new operation before its ack wrote operations %+v and side rows %+v; budget: one insert and one HOT update, nothing else",
			got, fresh.sideRows())
	}
	if fresh.indexEntries != 2 {
		t.Errorf("new operation wrote %d index entries; budget: 2 (primary key and id)", fresh.indexEntries)
	}
	if post.statements != 1 || post.xacts != 1 || post.redis != 1 || post.rows("operations") != (tableCounts{upd: 1, hot: 1}) ||
		len(post.sideRows()) != 0 || post.indexEntries != 0 {
		t.Errorf("after the ack: %d statements, %d transactions, %d Redis commands, operations %+v, side rows %+v, %d index entries; "+
			"budget: the ack mark (one HOT update) and the lease's release", post.statements, post.xacts, post.redis,
			post.rows("operations"), post.sideRows(), post.indexEntries)
	}
	// Only the operation's own table is read, by its key: a statement's
	// conflict check and its compare-and-set.
	for name, c := range map[string]cost{"new": fresh, "ack": post, "redelivery": again} {
		for table, tc := range c.tables {
			if table != "operations" && tc.scans != 0 {
				t.Errorf("%s: %d scans of %s; no statement of the budget reads it", name, tc.scans, table)
			}
		}
	}
	if fresh.tables["operations"].scans != 2 || post.tables["operations"].scans != 1 {
		t.Errorf("scans of operations: %d before the ack, %d after; want 2 (claim, evidence) and 1 (ack mark)",
			fresh.tables["operations"].scans, post.tables["operations"].scans)
	}
	if again.statements != 1 || again.xacts != 1 || again.redis != 0 {
		t.Errorf("redelivery of acknowledged work: %d statements, %d transactions, %d Redis commands; budget: 1, 1, 0",
			again.statements, again.xacts, again.redis)
	}
	if got := again.rows("operations"); got != (tableCounts{upd: 1, hot: 1}) ||
		!maps.Equal(again.sideRows(), map[string]tableCounts{"deliveries": {ins: 1}}) {
		t.Errorf("redelivery wrote operations %+v and side rows %+v; want its count on the row (HOT) and its delivery beside it",
			got, again.sideRows())
	}
	if againPost.statements != 0 || againPost.redis != 0 {
		t.Errorf("after the redelivery's ack: %d statements, %d Redis commands; it was answered by its claim", againPost.statements, againPost.redis)
	}
	if b.calls != 2 {
		t.Errorf("downstream calls = %d, want 2 (warm-up and m-new)", b.calls)
	}

	// Under load the after-answer queue shares commits: a batch of acks
	// costs one statement per shared commit and one Redis command.
	t.Logf("after the ack, %d results through the background queue: %d batches, %d shared commits, "+
		"%d statements, %d Postgres transactions, %d Redis commands; operations %+v", budgetBatch, b.batches, b.commits,
		shared.statements, shared.xacts, shared.redis, shared.tables["operations"])
	if b.queued != budgetBatch || b.inline != 0 {
		t.Errorf("queued %d, inline %d; want all %d queued", b.queued, b.inline, budgetBatch)
	}
	if shared.xacts != b.commits || shared.statements != b.commits || b.commits < 1 || b.commits > budgetBatch {
		t.Errorf("%d transactions and %d statements for %d shared commits of %d ack marks; budget: one each per shared commit",
			shared.xacts, shared.statements, b.commits, budgetBatch)
	}
	if int64(shared.redis) != b.batches || b.batches < 1 || b.batches > budgetBatch {
		t.Errorf("%d Redis commands for %d batches; budget: one lease release command per batch", shared.redis, b.batches)
	}
	if got := shared.rows("operations"); got != (tableCounts{upd: budgetBatch, hot: budgetBatch}) || len(shared.sideRows()) != 0 {
		t.Errorf("after %d acks: operations %+v, side rows %+v; want %d HOT updates and nothing else", budgetBatch, got,
			shared.sideRows(), budgetBatch)
	}
}

// budgetBatch is how many acks the after-answer queue takes at once in the
// budget's last phase.
const budgetBatch = 8

// budget is one run's measurements.
type budget struct {
	fresh, post, again, againPost, shared cost
	calls                                 int64
	commits, batches, queued, inline      int64
}

// measureBudget runs the budget's phases on a database, Redis and
// downstream of their own, and says whether every phase's count of
// transactions was the gateway's alone.
func measureBudget(t *testing.T) (budget, bool) {
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
	defer obs.Close(ctx)

	// Autovacuum visits a new database within seconds of its creation; its
	// transactions count as the database's. Measure after that visit: once
	// the count has stood still for a while.
	var last int64 = -1
	for still, deadline := time.Now(), time.Now().Add(30*time.Second); time.Since(still) < 3*time.Second && time.Now().Before(deadline); {
		var n int64
		if err := obs.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = $1`, dbName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != last {
			last, still = n, time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}

	redisAddr := testenv.Redis(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	redisCommands := testenv.CountRedisCommands(t, redisAddr)

	down := newEffectServer(t, true)
	routes, err := config.ParseRoutes([]byte(strings.ReplaceAll("routes:\n"+routeYAML("orders", "idempotent", "broker", ""), "{{DOWN}}", down.URL())))
	if err != nil {
		t.Fatal(err)
	}
	route := routes[0]
	effects := downstream.New(downstream.Options{})
	defer effects.CloseIdleConnections()
	g := &gate.Gate{Reservations: storage.NewReservations(rdb), Effects: effects, Owner: "budget", Now: time.Now,
		NewToken: func() string { return "t" }}

	// Each phase gets a fresh one-connection pool that is closed afterwards:
	// a backend flushes its statistics when it exits, so the count is exact
	// once it has left pg_stat_activity. Exec mode sends each statement as
	// one extended-protocol exchange, without separate prepare transactions,
	// and pings are off so the pool adds nothing of its own.
	var (
		pool       *pgxpool.Pool
		statements statementCounter
	)
	open := func() {
		cfg, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 1
		storage.PlanAsLookups(cfg.ConnConfig.RuntimeParams) // as the gateway's own sessions plan
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		cfg.ConnConfig.Tracer = &statements
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		g.Ledger = storage.NewLedger(pool)
	}
	// leave waits until no backend but the one with pid (0: none) is on the
	// database, asked by the observer so that waiting adds nothing to the
	// database's own counts.
	leave := func(pid uint32) {
		for deadline := time.Now().Add(30 * time.Second); ; {
			var others int
			if err := obs.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> $2`,
				dbName, pid).Scan(&others); err != nil {
				t.Fatal(err)
			}
			if others == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d backends still on %s", others, dbName)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	closePool := func() {
		pool.Close()
		leave(0)
	}
	// read takes the database's counters through a connection of its own,
	// whose statements and scans land in the next reading (the idle phase
	// measures them, to be subtracted); xact_commit is read from the
	// observer.
	//
	// The reading connection of the reading before may still be on its way
	// out (closing a pgx connection does not wait for its backend), and its
	// scans count only once it has gone: read waits for every other backend
	// of the database to leave first, or a phase would count them sometimes
	// and the idle phase's subtraction would not match.
	read := func() cost {
		var c cost
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		leave(conn.PgConn().PID())
		if err := obs.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = $1`, dbName).Scan(&c.xacts); err != nil {
			t.Fatal(err)
		}
		rows, err := conn.Query(ctx, `SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd,
			coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables`)
		if err != nil {
			t.Fatal(err)
		}
		c.tables = map[string]tableCounts{}
		var (
			name string
			tc   tableCounts
		)
		if _, err := pgx.ForEachRow(rows, []any{&name, &tc.ins, &tc.upd, &tc.hot, &tc.scans}, func() error {
			c.tables[name] = tc
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		c.indexEntries = indexEntries(t, conn)
		c.redis = redisCommands()
		return c
	}
	phase := func(f func()) cost {
		before := read()
		s0, r0 := statements.n.Load(), statements.trips.Load()
		open()
		f()
		closePool()
		after := read()
		after.statements, after.trips = statements.n.Load()-s0, statements.trips.Load()-r0
		before.statements, before.trips = 0, 0
		return after.minus(before)
	}

	deliver := func(id string) *gate.Result {
		res, err := g.Deliver(ctx, route, &gate.Message{Broker: gate.BrokerPubSub, Source: "s", MessageID: id, Data: []byte("x")})
		if err != nil || res.Decision != gate.Ack {
			t.Fatalf("deliver %s: %+v %v", id, res, err)
		}
		return res
	}
	// Warm up: load the reservation script into Redis.
	phase(func() { deliver("warm").Finish(ctx, nil, true) })
	// What opening a connection and reading the counters cost on their own:
	// subtracted from every phase below.
	idle := phase(func() {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c.Release()
	})
	clean := idle.xacts >= 0
	measure := func(f func()) cost {
		c := phase(f).minus(idle)
		clean = clean && c.xacts == c.trips
		return c
	}

	var b budget
	var res *gate.Result
	b.fresh = measure(func() { res = deliver("m-new") })
	b.post = measure(func() { res.Finish(ctx, nil, true) })
	b.again = measure(func() { res = deliver("m-new") })
	b.againPost = measure(func() { res.Finish(ctx, nil, true) })
	b.calls = down.effectCalls.Load()

	batch := make([]*gate.Result, budgetBatch)
	phase(func() {
		for i := range batch {
			batch[i] = deliver(fmt.Sprintf("m-batch-%d", i))
		}
	})
	b.shared = measure(func() {
		after := gate.NewAfterAnswer(g.Reservations, nil, gate.AfterAnswerOptions{})
		before, _ := g.Ledger.(*storage.Ledger).GroupCommitStats()
		for _, r := range batch {
			after.Finish(ctx, r, true)
		}
		if err := after.Close(ctx); err != nil {
			t.Fatal(err)
		}
		now, _ := g.Ledger.(*storage.Ledger).GroupCommitStats()
		b.commits = int64(now - before)
		b.queued, b.inline, b.batches = after.Counts()
	})
	return b, clean
}

// indexEntries counts the entries the database's indexes hold for the
// rows their predicates admit. Over a phase with no delete and no update
// that left its page (the budget checks both), the difference is the
// entries the phase wrote.
func indexEntries(t *testing.T, conn *pgx.Conn) int64 {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT c.relname, coalesce(pg_get_expr(i.indpred, i.indrelid), 'true')
		FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relname <> 'goose_db_version'`)
	if err != nil {
		t.Fatal(err)
	}
	type index struct{ table, pred string }
	var all []index
	var ix index
	if _, err := pgx.ForEachRow(rows, []any{&ix.table, &ix.pred}, func() error {
		all = append(all, ix)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, ix := range all {
		var n int64
		if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{ix.table}.Sanitize()+
			` WHERE `+ix.pred).Scan(&n); err != nil {
			t.Fatal(err)
		}
		total += n
	}
	return total
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
