package soak

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ackgate/ackgate/internal/testenv"
)

// buildGateway builds the gateway binary the soak runs, as `make build` would.
func buildGateway(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gateway")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/ackgate/ackgate/cmd/gateway").CombinedOutput()
	if err != nil {
		t.Fatalf("build gateway: %v\n%s", err, out)
	}
	return bin
}

// The short soak of `make test`, for real: two gateway processes, a private
// Redis, a fresh database, one SIGKILL, one Redis restart that loses its
// data, every downstream fault. Every invariant must be 0, and every
// published payload must be accounted for exactly once.
func TestShortSoak(t *testing.T) {
	t.Parallel()
	cfg := ShortConfig()
	rep := runShort(t, cfg)
	if rep.Broker.Duplicates == 0 {
		t.Fatal("no duplicate delivery happened: the run proved nothing of them")
	}
}

// runShort runs cfg against a fresh database and holds the report to what
// every short run must show.
func runShort(t *testing.T, cfg Config) *Report {
	t.Helper()
	cfg.Gateway = buildGateway(t)
	cfg.Postgres = testenv.DatabaseURL(t)
	cfg.WorkDir = t.TempDir()
	var progress testenv.SyncBuffer
	cfg.Progress = &progress

	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("%v\nprogress:\n%s", err, progress.String())
	}
	var out bytes.Buffer
	rep.Print(&out)
	t.Logf("short soak:\n%s", out.String())
	if n := rep.Verdict.Violations(); n != 0 {
		t.Fatalf("%d invariant violation(s); progress:\n%s", n, progress.String())
	}
	if kills := rep.Kills[0] + rep.Kills[1]; kills != cfg.Kills || rep.RedisRestarts != cfg.RedisRestarts || rep.PostgresRestarts != 0 {
		t.Fatalf("faults carried out: %d kills, %d Redis restarts, %d Postgres restarts; want %d, %d, 0",
			kills, rep.RedisRestarts, rep.PostgresRestarts, cfg.Kills, cfg.RedisRestarts)
	}
	v := rep.Verdict
	accounted := v.AckedWithEvidence + v.DeadLettered + v.Indeterminate + v.Terminal + v.Conflicting + v.Pending + v.ConfirmedUnacked + v.AckedUnrecorded +
		v.HandedOffConfirmed + v.HandedOffParked + v.HandedOffTerminal + v.HandedOffOpen
	if accounted != rep.Publications || rep.Publications < rep.Messages+rep.Reused || v.AckedWithEvidence == 0 || rep.Messages != cfg.Messages {
		t.Fatalf("accounted for %d of %d payloads (%d acked with evidence)", accounted, rep.Publications, v.AckedWithEvidence)
	}
	// Both commit shapes did their work: handoffs the relay confirmed, and
	// local rows committed with their evidence.
	if v.HandedOffConfirmed == 0 || v.LocalCommitted == 0 || v.LocalRows == 0 {
		t.Fatalf("handoffs confirmed %d, local payloads committed %d with %d rows: the new shapes proved nothing",
			v.HandedOffConfirmed, v.LocalCommitted, v.LocalRows)
	}
	injected := 0
	for _, rec := range rep.Downstream {
		injected += rec.Counts.Injected5xx + rec.Counts.LostResponses + rec.Counts.SlowResponses
	}
	if injected == 0 {
		t.Fatal("no downstream fault happened: the run proved nothing")
	}
	if v.Orphans != 0 {
		t.Fatalf("%d ledger records belong to no published message", v.Orphans)
	}
	// Each of the operator's resolutions and replays is an intervention in
	// its operation's record, and the lanes' counts add up to it.
	o := rep.Operator
	if v.ResolvedHappened != o.Happened || v.ResolvedNotHappened != o.NotHappened || v.ResolvedAbandoned != o.Abandoned || v.Replayed != o.Replay {
		t.Fatalf("the operator did %+v; the ledger shows happened %d, not_happened %d, abandoned %d, replayed %d",
			o, v.ResolvedHappened, v.ResolvedNotHappened, v.ResolvedAbandoned, v.Replayed)
	}
	return rep
}

func TestFaultPlanSpreadsFaultsApart(t *testing.T) {
	t.Parallel()
	ev := faultPlan(8, 2, 1)
	if len(ev) != 11 {
		t.Fatalf("%d events", len(ev))
	}
	count := map[string]int{}
	for i, e := range ev {
		count[e.kind]++
		if e.at <= 0 || e.at >= 1 {
			t.Fatalf("event %d at %.3f, outside publication", i, e.at)
		}
		if i > 0 && e.at <= ev[i-1].at {
			t.Fatalf("events %d and %d at %.3f and %.3f: not apart", i-1, i, ev[i-1].at, e.at)
		}
	}
	if count["kill"] != 8 || count["redis"] != 2 || count["postgres"] != 1 {
		t.Fatalf("kinds %v", count)
	}
	if ev := faultPlan(1, 1, 0); len(ev) != 2 || ev[0].kind != "kill" || ev[1].kind != "redis" {
		t.Fatalf("short plan %+v", ev)
	}
}

func TestConfigRefusesToRestartASharedPostgres(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.Postgres = testenv.DefaultDatabaseURL
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "private") {
		t.Fatalf("Run with Postgres restarts on a given database: %v", err)
	}
}

func TestRedisRestartLosesItsData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		bin = "/usr/bin/redis-server"
	}
	var log testenv.SyncBuffer
	r, err := startRedis(ctx, bin, "127.0.0.1", t.TempDir(), &log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.stop)
	addr := r.addr()
	if got := redisCommand(t, addr, "SET k v"); got != "+OK" {
		t.Fatalf("SET answered %q", got)
	}
	if err := r.restart(ctx); err != nil {
		t.Fatal(err)
	}
	if r.addr() != addr {
		t.Fatalf("restarted on %s, not %s", r.addr(), addr)
	}
	if got := redisCommand(t, addr, "GET k"); got != "$-1" {
		t.Fatalf("GET after the restart answered %q, want nil: the data must be gone", got)
	}
}

// redisCommand sends one inline command and returns the first line of the
// answer without its CRLF.
func redisCommand(t *testing.T, addr, cmd string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte(cmd + "\r\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimRight(line, "\r\n")
}

// A private cluster is what lets the full soak crash Postgres without
// touching anyone else's: committed rows survive the crash and a restart on
// the same port.
func TestPrivatePostgresSurvivesACrash(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	binDir, err := pgBinDir("")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pg, err := startPostgres(ctx, binDir, "127.0.0.1", f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.cleanup)
	url, err := createDatabase(ctx, pg.url("postgres"), "soak")
	if err != nil {
		t.Fatal(err)
	}
	exec1 := func(sql string) int {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if strings.HasPrefix(sql, "SELECT") {
			if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
		return 0
	}
	exec1("CREATE TABLE t (n int)")
	exec1("INSERT INTO t VALUES (42)")
	if err := pg.restart(ctx); err != nil {
		t.Fatal(err)
	}
	if n := exec1("SELECT n FROM t"); n != 42 {
		t.Fatalf("after the crash the committed row reads %d", n)
	}
}
