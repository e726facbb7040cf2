// Command purgebench measures the retention purge against live deliveries:
// it seeds a database of its own with expired, settled operations (each the
// one row a real acknowledged operation leaves), then pushes
// deliveries through an in-process gateway, first alone for a baseline and
// then while recovery.Purger removes the seeded evidence in its batches, and
// reports the deliveries' latency in both phases and the purge's rate.
//
// It is a command rather than a go test benchmark because one run takes
// minutes and is read by a person (docs/operations.md keeps the figures),
// not asserted. Everything it starts is its own: a database created and
// dropped on the Postgres server given, and a private redis-server.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/internal/wiring"
	"github.com/ackgate/ackgate/recovery"
	"github.com/ackgate/ackgate/telemetry"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "purgebench:", err)
		os.Exit(1)
	}
}

type options struct {
	n, seedChunk, batch, c int
	baseline               time.Duration
	postgres, redisBin     string
	keepDB                 bool
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("purgebench", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.n, "n", 1000000, "expired operations to seed and purge")
	fs.IntVar(&o.seedChunk, "seed-chunk", 50000, "operations seeded per transaction")
	fs.IntVar(&o.batch, "batch", 500, "operations per purge statement (GATEWAY_PURGE_BATCH)")
	fs.IntVar(&o.c, "c", 4, "deliveries in flight")
	fs.DurationVar(&o.baseline, "baseline", 30*time.Second, "how long deliveries run alone before the purge")
	fs.StringVar(&o.postgres, "postgres", "postgres://ackgate:ackgate@127.0.0.1:5432/ackgate?sslmode=disable",
		"Postgres server on which the run's own database is created (the role needs CREATEDB)")
	fs.StringVar(&o.redisBin, "redis-server", "redis-server", "redis-server binary for a private instance")
	fs.BoolVar(&o.keepDB, "keep-db", false, "keep the run's database")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.n < 1 || o.batch < 1 || o.c < 1 || o.seedChunk < 1 {
		return errors.New("-n, -batch, -c and -seed-chunk must be positive")
	}

	dbURL, drop, err := createDatabase(ctx, o.postgres, o.keepDB)
	if err != nil {
		return err
	}
	defer drop()
	redisAddr, stopRedis, err := startRedis(o.redisBin)
	if err != nil {
		return err
	}
	defer stopRedis()

	down, err := serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Result-Id", "r-"+r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusCreated)
	}))
	if err != nil {
		return err
	}
	defer down.Close()

	vars := map[string]string{
		"GATEWAY_DATABASE_URL": dbURL, "GATEWAY_REDIS_URL": "redis://" + redisAddr,
		"GATEWAY_ADMIN_TOKEN": "purgebench-token-0123456789", "GATEWAY_INSTANCE_ID": "purgebench",
		"GATEWAY_LOG_LEVEL": "warn",
	}
	getenv := func(k string) string { return vars[k] }
	s, err := config.LoadSettings(getenv)
	if err != nil {
		return err
	}
	routes, err := config.ParseRoutes(fmt.Appendf(nil, `routes:
  - name: live
    broker: pubsub
    auth: none
    shape: idempotent
    dedupe_window: 24h
    effect:
      url: http://%s/effects
      result_id_header: X-Result-Id
`, down.Addr))
	if err != nil {
		return err
	}
	if err := migrate(ctx, dbURL); err != nil {
		return err
	}
	tel, err := telemetry.WithPrometheus(sdktrace.NewTracerProvider(), resource.Empty())
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	gw, err := wiring.New(ctx, wiring.Options{Settings: s, Routes: routes, Getenv: getenv, Telemetry: tel, Logger: log})
	if err != nil {
		return err
	}
	defer gw.Close()
	ingest, err := serve(gw.Ingest)
	if err != nil {
		return err
	}
	defer ingest.Close()

	host, _ := os.Hostname()
	cpu := cpuModel()
	fmt.Fprintf(out, "purgebench: %d expired operations, purge batch %d, %d deliveries in flight\n", o.n, o.batch, o.c)
	fmt.Fprintf(out, "machine: %s, %d CPUs (%s), load average %s\n", host, numCPU(), cpu, loadAvg())

	began := time.Now()
	if err := seed(ctx, gw, o.n, o.seedChunk); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	fmt.Fprintf(out, "seeded %d operations (%d rows) in %s\n", o.n, o.n, time.Since(began).Round(time.Millisecond))

	// Warm the gateway's pools and caches before measuring.
	d := &driver{url: "http://" + ingest.Addr + "/v1/push/pubsub/live"}
	d.runFor(ctx, o.c, 3*time.Second)

	base := d.runFor(ctx, o.c, o.baseline)
	fmt.Fprintln(out, "baseline (no purge):", base)

	p, err := recovery.NewPurger(recovery.PurgerOptions{Store: gw.Maintenance, Forget: gw.Reservations,
		Batch: o.batch, Every: time.Hour, Routes: routes, Logger: log})
	if err != nil {
		return err
	}
	pctx, stopDeliveries := context.WithCancel(ctx)
	during := make(chan stats, 1)
	go func() { during <- d.runUntil(pctx, o.c) }()
	locks := make(chan lockSamples, 1)
	go func() { locks <- sampleLockWaits(pctx, gw) }()
	start := time.Now()
	var purged, batches int
	for {
		n, err := p.Batch(ctx)
		if err != nil {
			stopDeliveries()
			<-during
			return fmt.Errorf("purge: %w", err)
		}
		purged += n
		batches++
		if n < o.batch {
			break
		}
	}
	took := time.Since(start)
	stopDeliveries()
	dur := <-during
	lw := <-locks
	fmt.Fprintln(out, "during the purge:   ", dur)
	fmt.Fprintf(out, "lock waits: %d of %d samples of pg_stat_activity (every 20ms) saw a backend waiting on a lock, at most %d at once\n",
		lw.waiting, lw.samples, lw.most)
	fmt.Fprintf(out, "purge: %d operations in %d batches, %s, %.0f operations/s\n",
		purged, batches, took.Round(time.Millisecond), float64(purged)/took.Seconds())
	var left int
	if err := gw.Pool.QueryRow(ctx, `SELECT count(*) FROM operations WHERE route = 'bench'`).Scan(&left); err != nil {
		return err
	}
	if left != 0 || purged != o.n {
		return fmt.Errorf("purge removed %d of %d seeded operations; %d left", purged, o.n, left)
	}
	return nil
}

// seed inserts n acknowledged operations whose retention ran out a day ago,
// each as a fresh message that was acked leaves it: one operations row
// with its first delivery and attempt, nothing beside it. One transaction
// per chunk; the ledger's guards judge every row as they would a live write.
func seed(ctx context.Context, gw *wiring.Gateway, n, chunk int) error {
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		_, err := gw.Pool.Exec(ctx, `
INSERT INTO operations (created_at, retain_until, fingerprint_version, id, route, tenant, key_source, key, scope_key,
	fingerprint, shape, dead_letter_policy, contract_version, idempotency_key, broker, source, message_id, fence,
	owner, lease_start, attempt_count, a1_fence, a1_contract, a1_started_at, a1_finished_at, a1_outcome, a1_status,
	a1_result_id, d1_decision, result_id, evidence_at, state, acked_at, updated_at)
SELECT now() - interval '9 days', now() - interval '1 day', 1, 'op_bench_' || g, 'bench', 'default', 'message_id',
	'm-' || g, 'default/bench/message_id:/m-' || g, 'fp-' || g, 'idempotent', 'broker', 'bench', 'ik-' || g,
	'pubsub', 'projects/p/subscriptions/s', 'm-' || g, 1, 'seed', now() - interval '9 days', 1, 1, 'bench',
	now() - interval '9 days', now() - interval '9 days', 'confirmed', 201, 'r-' || g, 'ack', 'r-' || g,
	now() - interval '9 days', 'pending_effect', NULL, now() - interval '9 days'
FROM generate_series($1::int, $2::int) g`, lo, hi)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "purgebench: seeded %d of %d\n", hi, n)
	}
	// The rows are born in pending_effect (the ledger's first state for an
	// operation), then settled the way the gateway settles them: evidence,
	// then the ack, each in its own statement.
	for _, step := range []string{
		`UPDATE operations SET state = 'ack_pending' , evidence_at = now() - interval '9 days' WHERE route = 'bench' AND state = 'pending_effect'`,
		`UPDATE operations SET state = 'acknowledged', acked_at = now() - interval '9 days' WHERE route = 'bench' AND state = 'ack_pending'`,
	} {
		if _, err := gw.Pool.Exec(ctx, step); err != nil {
			return err
		}
	}
	_, err := gw.Pool.Exec(ctx, `VACUUM ANALYZE operations`)
	return err
}

type lockSamples struct{ samples, waiting, most int }

// sampleLockWaits polls pg_stat_activity until ctx ends, counting the
// samples in which some backend of the run's database (a delivery's write,
// or a purge batch) waited on a heavyweight lock.
func sampleLockWaits(ctx context.Context, gw *wiring.Gateway) lockSamples {
	var s lockSamples
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return s
		case <-t.C:
		}
		var n int
		err := gw.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		if err != nil {
			continue
		}
		s.samples++
		if n > 0 {
			s.waiting++
		}
		s.most = max(s.most, n)
	}
}

// driver pushes unique messages to the gateway and times each answer.
type driver struct {
	url  string
	next atomic.Int64
}

func (d *driver) runFor(ctx context.Context, c int, dur time.Duration) stats {
	ctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	return d.runUntil(ctx, c)
}

func (d *driver) runUntil(ctx context.Context, c int) stats {
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: c}}
	var (
		mu   sync.Mutex
		all  []time.Duration
		bad  int
		wg   sync.WaitGroup
		from = time.Now()
	)
	for range c {
		wg.Go(func() {
			var mine []time.Duration
			var failed int
			for ctx.Err() == nil {
				id := "live-" + strconv.FormatInt(d.next.Add(1), 10)
				body := fmt.Sprintf(`{"message":{"data":%q,"messageId":%q},"subscription":"projects/p/subscriptions/s"}`,
					base64.StdEncoding.EncodeToString([]byte(id)), id)
				t0 := time.Now()
				resp, err := client.Post(d.url, "application/json", strings.NewReader(body))
				if err != nil {
					failed++
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusNoContent {
					failed++
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			all = append(all, mine...)
			bad += failed
			mu.Unlock()
		})
	}
	wg.Wait()
	return summarize(all, bad, time.Since(from))
}

type stats struct {
	n, failed     int
	p50, p99, max time.Duration
	perSecond     float64
	elapsed       time.Duration
}

func summarize(d []time.Duration, failed int, elapsed time.Duration) stats {
	s := stats{n: len(d), failed: failed, elapsed: elapsed}
	if len(d) == 0 {
		return s
	}
	slices.Sort(d)
	q := func(p float64) time.Duration { return d[min(len(d)-1, int(p*float64(len(d))))] }
	s.p50, s.p99, s.max = q(0.50), q(0.99), d[len(d)-1]
	s.perSecond = float64(len(d)) / elapsed.Seconds()
	return s
}

func (s stats) String() string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
	return fmt.Sprintf("%d deliveries acked in %s (%.0f/s), latency p50 %s p99 %s max %s, %d not acked",
		s.n, s.elapsed.Round(time.Millisecond), s.perSecond, ms(s.p50), ms(s.p99), ms(s.max), s.failed)
}

// createDatabase makes a database of this run's own on the server at base.
func createDatabase(ctx context.Context, base string, keep bool) (string, func(), error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "ackgate_purgebench_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", nil, err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() {
		if keep {
			fmt.Fprintln(os.Stderr, "purgebench: kept database", name)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if c, err := pgx.Connect(ctx, base); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			c.Close(ctx)
		}
	}
	return u.String(), drop, nil
}

// startRedis runs a private redis-server without persistence on a free port.
func startRedis(bin string) (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "purgebench-redis-")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("redis-server: %w", err)
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		os.RemoveAll(dir)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, errors.New("redis-server did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// server is a loopback HTTP server.
type server struct {
	Addr string
	srv  *http.Server
}

func serve(h http.Handler) (*server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &server{Addr: l.Addr().String(), srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}}
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

// Close waits for the handlers still running, so that a delivery's work
// after its answer is done before the gateway's connections close.
func (s *server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if s.srv.Shutdown(ctx) != nil {
		_ = s.srv.Close()
	}
}

func numCPU() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return max(1, strings.Count(string(b), "processor\t:"))
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
