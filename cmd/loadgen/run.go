package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ackgate/ackgate/storage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// bench is everything one invocation sets up, and tears down at the end.
type bench struct {
	cfg    config
	runID  string
	dir    string
	stderr io.Writer

	obs        *pgxpool.Pool // observer, on the server's base database
	obsQueries atomic.Int64
	dbURL      string // the run's own database (op table; the ledger too when the gateway is ours)
	dbName     string

	gwDBName string // database whose transactions count as the gateway's; "" when unknown
	// How the gateway was started, for the handoff phase's own gateway.
	gwBin, gwServeURL, redisAddr string
	gwBase                       string
	gwPID                        int
	gw                           *gatewayProcess
	redis                        *redis.Client // the gateway's Redis, for commandstats; nil when unknown
	redisPID                     int

	down    *downstream
	handoff *handoffEffects // the relay's calls at the downstream
	fwd     *forwarder

	cleanup []func(context.Context) error
}

// execute runs every phase and prints the report to stdout; progress goes to
// stderr.
func execute(ctx context.Context, cfg config, stdout, stderr io.Writer) (*report, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.MaxDuration, fmt.Errorf("-max-duration %s reached", cfg.MaxDuration))
	defer cancel()
	b := &bench{cfg: cfg, runID: "lg" + randomHex(4), stderr: stderr}
	if cfg.Quiet {
		b.stderr = io.Discard
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for i := len(b.cleanup) - 1; i >= 0; i-- {
			if err := b.cleanup[i](cctx); err != nil {
				fmt.Fprintln(stderr, "loadgen: cleanup:", err)
			}
		}
	}()
	if err := b.setup(ctx); err != nil {
		return nil, err
	}
	rep := &report{cfg: cfg, started: time.Now()}
	if err := rep.describeMachine(ctx, b); err != nil {
		return nil, err
	}

	phases := []struct {
		name    string
		n, c    int
		systems []string
	}{
		{"main", cfg.N, cfg.C, allSystems},
		{"c1", cfg.N1, 1, allSystems},
		// The forwarder runs as a process of its own here, so that its
		// peak RSS is the gateway's baseline.
		{"mem", cfg.MemN, cfg.MemC, []string{sysForwarder, sysAckgate}},
	}
	for _, ph := range phases {
		if ph.n == 0 {
			continue
		}
		pr := phaseResult{name: ph.name, n: ph.n, c: ph.c}
		for _, sys := range ph.systems {
			if !cfg.runs(sys) {
				continue
			}
			b.progress("%s phase: %s, %d messages at %d in flight", ph.name, sys, ph.n, ph.c)
			sr, err := b.measure(ctx, ph.name, sys, ph.n, ph.c)
			if err != nil {
				return nil, fmt.Errorf("%s phase, %s: %w", ph.name, sys, err)
			}
			pr.systems = append(pr.systems, sr)
		}
		if len(pr.systems) > 0 {
			rep.phases = append(rep.phases, pr)
		}
	}
	if cfg.HandoffN > 0 && b.gwBin != "" {
		b.progress("handoff phase: %d messages at %d in flight", cfg.HandoffN, cfg.C)
		hr, err := b.handoffPhase(ctx)
		if err != nil {
			return nil, fmt.Errorf("handoff phase: %w", err)
		}
		rep.handoff = &hr
	}
	rep.finished = time.Now()
	rep.loadAfter = loadAverage()
	rep.print(stdout)
	return rep, nil
}

func (b *bench) progress(format string, args ...any) {
	fmt.Fprintf(b.stderr, "loadgen: "+format+"\n", args...)
}

func (b *bench) onCleanup(f func(context.Context) error) { b.cleanup = append(b.cleanup, f) }

func (b *bench) setup(ctx context.Context) error {
	cfg := b.cfg
	dir, err := os.MkdirTemp("", "loadgen-")
	if err != nil {
		return err
	}
	b.dir = dir
	b.onCleanup(func(context.Context) error { return os.RemoveAll(dir) })

	b.obs, err = pgxpool.New(ctx, cfg.PostgresURL)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	b.onCleanup(func(context.Context) error { b.obs.Close(); return nil })
	if err := b.obs.Ping(ctx); err != nil {
		return fmt.Errorf("postgres at -postgres-url is unreachable: %w (start it with scripts/services.sh)", err)
	}

	b.dbName = "ackgate_loadgen_" + b.runID[2:]
	dbURL, drop, err := createDatabase(ctx, cfg.PostgresURL, b.dbName)
	if err != nil {
		return err
	}
	b.dbURL = dbURL
	if cfg.KeepDB {
		b.progress("keeping database %s", b.dbName)
	} else {
		b.onCleanup(drop)
	}
	if err := b.createOpTable(ctx); err != nil {
		return err
	}

	b.down, err = startDownstream(cfg.DownstreamAddr)
	if err != nil {
		return fmt.Errorf("downstream: %w", err)
	}
	b.onCleanup(b.down.close)
	b.handoff = &handoffEffects{}
	b.down.mux.HandleFunc("POST /handoff", b.handoff.handle)
	b.fwd, err = startForwarder(b.down.url)
	if err != nil {
		return fmt.Errorf("forwarder: %w", err)
	}
	b.onCleanup(b.fwd.close)

	if cfg.Target != "" {
		return b.useTarget(ctx)
	}
	if !cfg.runs(sysAckgate) && !cfg.runs(sysBare) {
		return nil
	}
	if err := b.startRedis(ctx); err != nil {
		return err
	}
	if !cfg.runs(sysAckgate) {
		return nil
	}
	return b.startGateway(ctx)
}

func (b *bench) createOpTable(ctx context.Context) error {
	pool, err := pgxpool.New(ctx, b.dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	_, err = pool.Exec(ctx, opTable)
	return err
}

// startRedis gives the gateway and the bare pipeline their Redis: the one
// at -redis-addr, or a private redis-server whose counters nothing else
// touches.
func (b *bench) startRedis(ctx context.Context) error {
	cfg := b.cfg
	b.redisAddr = cfg.RedisAddr
	if b.redisAddr == "" {
		p, addr, err := startRedis(ctx, b.dir)
		if err != nil {
			return err
		}
		b.onCleanup(func(context.Context) error { return p.stop() })
		b.redisAddr, b.redisPID = addr, p.pid()
	}
	b.redis = redis.NewClient(&redis.Options{Addr: b.redisAddr})
	b.onCleanup(func(context.Context) error { return b.redis.Close() })
	return nil
}

func (b *bench) startGateway(ctx context.Context) error {
	cfg := b.cfg
	redisAddr := b.redisAddr

	bin := cfg.GatewayBin
	if bin == "" {
		b.progress("building ./cmd/gateway")
		var err error
		if bin, err = buildGateway(ctx, b.dir); err != nil {
			return err
		}
	}
	gwURL, err := withQuery(b.dbURL, cfg.GatewayDBParams)
	if err != nil {
		return err
	}
	b.gwBin, b.gwServeURL = bin, gwURL
	g, err := startGateway(ctx, bin, b.dir, b.dbURL, gwURL, redisAddr, b.down.url, cfg.GatewayLogLevel, cfg.GatewayMemoryLimit, "")
	if err != nil {
		return err
	}
	b.onCleanup(func(context.Context) error { return g.stop() })
	b.gw, b.gwBase, b.gwPID, b.gwDBName = g, g.ingest, g.pid(), b.dbName
	b.progress("gateway pid %d on %s, database %s, redis %s", b.gwPID, b.gwBase, b.dbName, redisAddr)
	return nil
}

// useTarget measures a gateway someone else started: only what its flags
// make visible.
func (b *bench) useTarget(ctx context.Context) error {
	cfg := b.cfg
	b.gwBase, b.gwPID = cfg.Target, cfg.TargetPID
	if cfg.TargetDBURL != "" {
		name, err := databaseName(cfg.TargetDBURL)
		if err != nil {
			return fmt.Errorf("-target-database-url: %w", err)
		}
		b.gwDBName = name
	}
	if cfg.RedisAddr != "" {
		if err := b.startRedis(ctx); err != nil {
			return err
		}
	}
	resp, err := probe.Get(cfg.Target + "/readyz")
	if err != nil {
		return fmt.Errorf("-target: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("-target: /readyz answered %s", resp.Status)
	}
	b.progress("target gateway %s; its routes must call the downstream at %s", cfg.Target, b.down.url)
	return nil
}

// systemResult is one system's figures in one phase.
type systemResult struct {
	system          string
	run             driveResult
	lat, againLat   latencies
	pg              pgCounters
	pgKnown         bool
	redis           commandStats // nil: not measured
	cpu             cpuUse
	peakRSS         int64 // the gateway's (or the forwarder process's) VmHWM during the phase; 0: not measured
	downstreamCalls int64
	waits           waitCounts
	tables          tableWrites // rows written in the run's database; nil: not measured
	// WAL per message: the median over windows of about a second, less the
	// background the rest of the cluster wrote just before the phase.
	walNet     float64
	walWindows int
	background background
	// Databases others created or dropped while the phase ran: each
	// creation copies a template through the WAL.
	dbsCreated, dbsDropped int
	pgPool                 int // the op's connections
	// vacuum is what the VACUUM before the phase took; zero when none ran.
	vacuum maintenance
}

// maintenance is one VACUUM (ANALYZE) of the run's database: how long it
// took and the WAL it wrote.
type maintenance struct {
	took time.Duration
	wal  int64
}

func (s systemResult) msgsPerSec() float64 {
	if s.run.elapsed <= 0 {
		return 0
	}
	return float64(s.run.acked) / s.run.elapsed.Seconds()
}

// measure runs one system through one phase: a warm-up, then the measured
// messages between two readings of every counter, each taken with the
// database quiet.
func (b *bench) measure(ctx context.Context, phase, system string, n, c int) (systemResult, error) {
	cfg := b.cfg
	sr := systemResult{system: system}
	client := newPushClient(c, cfg.RequestTimeout)
	defer client.CloseIdleConnections()

	var send sender
	var op *opSender
	counted := b.dbName // whose transactions this system's are
	rssPID := 0         // whose peak RSS the phase reads; 0: none
	servingPID := b.gwPID
	redeliver, sns := cfg.Redeliver, cfg.SNS
	switch system {
	case sysOp:
		pool, err := b.opPool(ctx, c)
		if err != nil {
			return sr, err
		}
		op = &opSender{pool: pool}
		send, sr.pgPool = op, c
		// The op has no broker: every message is a fresh operation.
		redeliver, sns = 0, 0
	case sysForwarder:
		base := b.fwd.url
		if phase == "mem" {
			p, err := startForwarderProcess(ctx, b.down.url)
			if err != nil {
				return sr, err
			}
			defer p.stop()
			base, rssPID = p.url, p.pid
		}
		send = &pushSender{base: base, route: "loadgen", snsRoute: "loadgen-sns", client: client}
	case sysBare:
		p, err := startChild(ctx, "bare", bareEnv+"="+strings.Join([]string{b.dbURL, b.redisAddr, b.down.url}, " "))
		if err != nil {
			return sr, err
		}
		defer p.stop()
		send = &pushSender{base: p.url, route: "loadgen", snsRoute: "loadgen-sns", client: client}
		rssPID, servingPID = p.pid, p.pid
	case sysAckgate:
		route, snsRoute := "loadgen", "loadgen-sns"
		if cfg.Target != "" {
			route, snsRoute = cfg.TargetRoute, cfg.TargetSNSRoute
		}
		send = &pushSender{base: b.gwBase, route: route, snsRoute: snsRoute, client: client}
		counted, rssPID = b.gwDBName, b.gwPID
	}
	closeOp := func() {
		if op != nil {
			op.pool.Close()
		}
	}
	defer closeOp()

	if phase == "mem" {
		b.down.delay.Store(int64(cfg.MemDelay))
		defer b.down.delay.Store(0)
	}

	gen := newGenerator(b.runID, phase+"-"+system, cfg.PayloadBytes, sns)
	if cfg.Warmup > 0 {
		warm := make([]message, cfg.Warmup)
		wgen := newGenerator(b.runID, phase+"-"+system+"-warm", cfg.PayloadBytes, sns)
		for i := range warm {
			warm[i] = wgen.message(i)
		}
		if r := drive(ctx, send, warm, min(c, cfg.Warmup), 0, cfg.RequestTimeout, nil); r.failed() > 0 {
			return sr, fmt.Errorf("warm-up: %d of %d not acknowledged: %v", r.failed(), len(warm), r.failures)
		}
	}
	msgs := make([]message, n)
	for i := range msgs {
		msgs[i] = gen.message(i)
	}

	// What earlier phases' writes owe the run's tables is done now. Left to
	// autovacuum, it lands wherever the launcher's next round of the
	// database (one a minute) falls: in three of four full runs the bare
	// pipeline's and the ledger's throughput-phase vacuums landed in the
	// last latency phase, ackgate's, adding a third to its WAL per message
	// and a tail to its latency.
	if cfg.Vacuum && b.dbURL != "" {
		v, err := b.vacuum(ctx)
		if err != nil {
			return sr, err
		}
		sr.vacuum = v
	}
	// Start from a quiet database with the warm-up's statistics published.
	// The op gets a fresh pool, as the gateway's connections are fresh too.
	if op != nil {
		closeOp()
		pool, err := b.opPool(ctx, c)
		if err != nil {
			return sr, err
		}
		op.pool = pool
	}
	if err := b.quiesce(ctx, counted); err != nil {
		return sr, err
	}
	var tables0 tableWrites
	if counted == b.dbName {
		t, err := b.readTables(ctx)
		if err != nil {
			return sr, err
		}
		tables0 = t
	}
	if cfg.Idle > 0 {
		// What the rest of the cluster writes while this tool writes
		// nothing, to take out of the phase's WAL.
		var none atomic.Int64
		stop := sample(ctx, b.obs, "", &b.obsQueries, &none, nil)
		if err := sleep(ctx, cfg.Idle); err != nil {
			stop()
			return sr, err
		}
		sr.background = backgroundRate(stop().wal, walWindow)
	} else {
		sr.background = backgroundRate(nil, walWindow)
	}
	pg0, err := b.readPG(ctx, counted)
	if err != nil {
		return sr, err
	}
	var redis0 commandStats
	if b.redis != nil {
		if redis0, err = readRedis(ctx, b.redis); err != nil {
			return sr, err
		}
	}
	calls0 := b.down.calls.Load()
	if rssPID > 0 {
		if err := resetPeakRSS(rssPID); err != nil {
			b.progress("cannot reset %s's peak RSS (%v): VmHWM is its peak since it started", system, err)
		}
	}
	dbs0, err := b.databases(ctx)
	if err != nil {
		return sr, err
	}
	cpu0, cpuErr := readCPU()
	var done atomic.Int64
	label := phase + " " + system
	stopSampling := sample(ctx, b.obs, counted, &b.obsQueries, &done, func(d int64) {
		b.progress("%s: %d/%d", label, d, n)
	})

	sr.run = drive(ctx, send, msgs, c, redeliver, cfg.RequestTimeout, &done)

	cpu1, cpuErr1 := readCPU()
	smp := stopSampling()
	sr.waits = smp.waits
	sr.walNet, sr.walWindows = medianWALPerMessage(smp.wal, walWindow, 10, sr.background.median)
	if cpuErr == nil && cpuErr1 == nil {
		sr.cpu = cpuBetween(cpu0, cpu1, servingPID, b.redisPID)
	}
	if rssPID > 0 {
		if sr.peakRSS, err = procStatus(rssPID, "VmHWM"); err != nil {
			b.progress("%s peak RSS: %v", system, err)
		}
	}
	closeOp()
	if err := b.quiesce(ctx, counted); err != nil {
		return sr, err
	}
	pg1, err := b.readPG(ctx, counted)
	if err != nil {
		return sr, err
	}
	sr.pg, sr.pgKnown = pg1.sub(pg0), counted != ""
	if tables0 != nil {
		tables1, err := b.readTables(ctx)
		if err != nil {
			return sr, err
		}
		sr.tables = tables1.sub(tables0)
	}
	if b.redis != nil {
		redis1, err := readRedis(ctx, b.redis)
		if err != nil {
			return sr, err
		}
		sr.redis = redis1.sub(redis0)
	}
	sr.downstreamCalls = b.down.calls.Load() - calls0
	dbs1, err := b.databases(ctx)
	if err != nil {
		return sr, err
	}
	for oid := range dbs1 {
		if _, ok := dbs0[oid]; !ok {
			sr.dbsCreated++
		}
	}
	for oid := range dbs0 {
		if _, ok := dbs1[oid]; !ok {
			sr.dbsDropped++
		}
	}
	sr.lat, sr.againLat = summarize(sr.run.fresh), summarize(sr.run.again)
	if ctx.Err() != nil {
		return sr, context.Cause(ctx)
	}
	return sr, nil
}

// databases is the set of database OIDs on the server.
func (b *bench) databases(ctx context.Context) (map[uint32]struct{}, error) {
	b.obsQueries.Add(1)
	rows, err := b.obs.Query(ctx, `SELECT oid FROM pg_database`)
	if err != nil {
		return nil, err
	}
	oids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		return nil, err
	}
	set := make(map[uint32]struct{}, len(oids))
	for _, o := range oids {
		set[o] = struct{}{}
	}
	return set, nil
}

func (b *bench) opPool(ctx context.Context, conns int) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(b.dbURL)
	if err != nil {
		return nil, err
	}
	pc.MaxConns, pc.MinConns = int32(conns), 0
	// The op plans as the gateway's pool does, so that neither side is
	// measured with a plan cached while its table was small.
	storage.PlanAsLookups(pc.ConnConfig.RuntimeParams)
	return pgxpool.NewWithConfig(ctx, pc)
}

func (b *bench) readPG(ctx context.Context, db string) (pgCounters, error) {
	b.obsQueries.Add(1)
	c, err := readPG(ctx, b.obs, db)
	c.othersXacts -= b.obsQueries.Load()
	return c, err
}

// quiesce waits until database db is quiet and its statistics are
// published. Postgres publishes a backend's counts when it goes idle, at most
// once a second, or within about 10 s after its last activity, and at once
// when it exits. In the run's own database every backend is this tool's or
// its gateway's, so once none has been busy for a moment they are ended and
// the counts are exact. Autovacuum is left alone: what a phase's own writes
// make it do during the phase counts in it (what earlier phases owed was
// done before it, by measure's VACUUM). The gateway's pool notices the
// ended connections when it next takes one (it checks any connection idle
// for more than a second) and opens new ones, which the pause at the end
// ensures. An external gateway's database is only waited on, for -settle.
func (b *bench) quiesce(ctx context.Context, db string) error {
	if db == "" {
		return nil
	}
	if db != b.dbName {
		return sleep(ctx, b.cfg.Settle)
	}
	// Post-ack bookkeeping may still be running after the last answer.
	const quietFor = 300 * time.Millisecond
	deadline := time.Now().Add(time.Minute)
	quietSince := time.Now()
	for {
		busy, err := b.connections(ctx, db, `state IS DISTINCT FROM 'idle'`)
		if err != nil {
			return err
		}
		if busy > 0 {
			quietSince = time.Now()
		} else if time.Since(quietSince) >= quietFor {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("database %s still busy after a minute", db)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	b.obsQueries.Add(1)
	if _, err := b.obs.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()`, db); err != nil {
		return fmt.Errorf("ending idle connections to %s: %w", db, err)
	}
	if err := b.waitGone(ctx, db); err != nil {
		return err
	}
	return sleep(ctx, 1200*time.Millisecond)
}

// vacuum runs VACUUM (ANALYZE) over the run's own database on a
// connection of its own, and reads what it took and wrote.
func (b *bench) vacuum(ctx context.Context) (maintenance, error) {
	var m maintenance
	before, err := b.readPG(ctx, b.dbName)
	if err != nil {
		return m, err
	}
	start := time.Now()
	conn, err := pgx.Connect(ctx, b.dbURL)
	if err != nil {
		return m, fmt.Errorf("vacuum: %w", err)
	}
	_, err = conn.Exec(ctx, `VACUUM (ANALYZE)`)
	conn.Close(ctx)
	if err != nil {
		return m, fmt.Errorf("vacuum: %w", err)
	}
	m.took = time.Since(start)
	after, err := b.readPG(ctx, b.dbName)
	m.wal = after.sub(before).walBytes
	return m, err
}

// connections counts the client backends connected to db that match cond.
func (b *bench) connections(ctx context.Context, db, cond string) (int, error) {
	b.obsQueries.Add(1)
	var n int
	err := b.obs.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = $1 AND backend_type = 'client backend' AND `+cond, db).Scan(&n)
	return n, err
}

// waitGone waits until no client is connected to db any more: a backend
// publishes its statistics as it exits.
func (b *bench) waitGone(ctx context.Context, db string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		left, err := b.connections(ctx, db, "true")
		if err != nil {
			return err
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d connections to %s did not end", left, db)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// readTables reads the run's database's row counters, which only a
// connection to that database can see. The connection is closed and gone
// before this returns, so its own transaction is published at once and never
// lands in a phase.
func (b *bench) readTables(ctx context.Context) (tableWrites, error) {
	cc, err := pgx.ParseConfig(b.dbURL)
	if err != nil {
		return nil, err
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables`)
	t := tableWrites{}
	if err == nil {
		for rows.Next() {
			var name string
			var w rowWrites
			if err = rows.Scan(&name, &w.ins, &w.upd, &w.hot, &w.del); err != nil {
				break
			}
			t[name] = w
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return nil, fmt.Errorf("pg_stat_user_tables: %w", err)
	}
	return t, b.waitGone(ctx, b.dbName)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return errors.Join(ctx.Err(), context.Cause(ctx))
	}
}
