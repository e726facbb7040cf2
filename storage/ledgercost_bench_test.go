package storage

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
)

// BenchmarkLedgerCost measures what the ledger itself costs Postgres per
// fresh message, apart from the gateway, Redis and HTTP: each round sends
// 16 fresh messages' three changes (claim with the effect attempt,
// confirmation with the answer, ack) as the gateway's group commit does at
// 16 in flight, three shared statements, on a database of its own. It
// sends the same batches change by change through ackgate_write on a
// schema at migration 0016 (how every batch went before 0017) and whole
// through ackgate_write_batch on one at 0017, one after the other, so that
// -count interleaves the two, and reports the set-based figures as ratios
// of the per-change ones (ratio-*: below 1 is cheaper).
//
// Reported per message: the CPU of the writing backend (from /proc, so
// other databases' load counts only as contention), WAL records and bytes
// of the statements (EXPLAIN ANALYZE's WAL counters, commit records not
// included), bytes counted only over statements that wrote no full-page
// image (a checkpoint anywhere on the cluster makes the next touch of
// every page write one, so those are reported apart), and the rows written
// with the share of updates that were HOT.
//
//	go test -run '^$' -bench LedgerCost -benchtime 200x ./storage/
func BenchmarkLedgerCost(b *testing.B) {
	// A batch of one is what a delivery alone sends; sixteen, what group
	// commit gathers at 16 in flight. The set-based statement's fixed cost
	// is shared by the batch, so the two can compare differently.
	for _, size := range []int{1, 4, 8, 16} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) { benchmarkLedgerCost(b, size) })
	}
}

func benchmarkLedgerCost(b *testing.B, batch int) {
	subjects := []*costSubject{newCostSubject(b, 16, writeSQL, batch), newCostSubject(b, 17, writeBatchSQL, batch)}
	// A ledger in service has statistics: without them the cached plans
	// of a fresh database can read a whole index where one entry is asked
	// for, a cost no running gateway pays for long. So some rounds go
	// first, then ANALYZE, which also makes every session plan again.
	for round := range costWarmUp {
		for _, c := range subjects {
			c.round(fmt.Sprintf("w%05d", round), time.Now().UTC())
		}
	}
	for _, c := range subjects {
		if _, err := c.conn.Exec(c.ctx, `ANALYZE`); err != nil {
			b.Fatal(err)
		}
		c.reset()
		c.begin()
	}
	round := 0
	for b.Loop() {
		round++
		at := time.Now().UTC()
		// Alternate which schema goes first, so neither always follows the
		// other's commits.
		for i := range subjects {
			c := subjects[(i+round)%len(subjects)]
			c.round(fmt.Sprintf("r%05d", round), at)
		}
	}
	b.StopTimer()
	var figures []costFigures
	for _, c := range subjects {
		figures = append(figures, c.end())
	}
	base, set := figures[0], figures[1]
	b.ReportMetric(set.cpu/base.cpu, "ratio-pg-cpu")
	b.ReportMetric(set.wall/base.wall, "ratio-wall")
	b.ReportMetric(set.walRecords/base.walRecords, "ratio-wal-records")
	b.ReportMetric(set.walBytes/base.walBytes, "ratio-wal-B")
	b.ReportMetric(set.rows/base.rows, "ratio-rows")
}

// costFigures are a subject's figures per message.
type costFigures struct{ cpu, wall, walRecords, walBytes, rows float64 }

const costWarmUp = 20

var costKinds = []string{"claim", "confirm", "acked"}

// costSubject is one database at one schema version and what its writes
// have cost so far.
type costSubject struct {
	b       *testing.B
	ctx     context.Context
	version int64
	sql     string // the shared statement a batch goes in
	batch   int    // messages per batch
	conn    *pgx.Conn
	pid     int

	records, fpis     [3]int64
	cleanBytes, clean [3]int64 // bytes and messages of statements without a full-page image
	messages          int
	cpu, elapsed      time.Duration
	size              int64
	writes            map[string]writes
}

func newCostSubject(b *testing.B, version int64, sql string, batch int) *costSubject {
	ctx := context.Background()
	url := testenv.DatabaseURL(b)
	if err := migrateTo(ctx, url, version); err != nil {
		b.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close(ctx) })
	c := &costSubject{b: b, ctx: ctx, version: version, sql: sql, batch: batch, conn: conn}
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&c.pid); err != nil {
		b.Fatal(err)
	}
	return c
}

func (c *costSubject) dbSize() int64 {
	var n int64
	if err := c.conn.QueryRow(c.ctx, `SELECT pg_database_size(current_database())`).Scan(&n); err != nil {
		c.b.Fatal(err)
	}
	return n
}

// reset forgets what the warm-up cost.
func (c *costSubject) reset() {
	c.records, c.fpis, c.cleanBytes, c.clean = [3]int64{}, [3]int64{}, [3]int64{}, [3]int64{}
	c.messages, c.cpu, c.elapsed = 0, 0, 0
}

func (c *costSubject) begin() {
	c.size = c.dbSize()
	c.writes = tableWrites(c.b, c.ctx, c.conn)
}

// round sends c.batch fresh messages' three changes, three statements,
// and counts what the backend spent on them.
func (c *costSubject) round(name string, at time.Time) {
	claims, confirms, acks := make([]*gate.Change, c.batch), make([]*gate.Change, c.batch), make([]*gate.Change, c.batch)
	for i := range c.batch {
		claims[i], confirms[i], acks[i] = freshMessage(c.b, fmt.Sprintf("%s-%02d", name, i), at)
	}
	cpu := backendCPU(c.b, c.pid)
	start := time.Now()
	c.send(0, claims)
	c.send(1, confirms)
	c.send(2, acks)
	c.elapsed += time.Since(start)
	c.cpu += backendCPU(c.b, c.pid) - cpu
	c.messages += c.batch
}

func (c *costSubject) send(k int, changes []*gate.Change) {
	wires := make([]string, len(changes))
	for i, ch := range changes {
		w, err := encode(ch)
		if err != nil {
			c.b.Fatal(err)
		}
		wires[i] = string(w)
	}
	var raw []byte
	if err := c.conn.QueryRow(c.ctx, `EXPLAIN (ANALYZE, WAL, TIMING OFF, SUMMARY OFF, FORMAT JSON) `+c.sql, wires).Scan(&raw); err != nil {
		c.b.Fatal(err)
	}
	var plan []struct {
		Plan struct {
			Records int64 `json:"WAL Records"`
			FPI     int64 `json:"WAL FPI"`
			Bytes   int64 `json:"WAL Bytes"`
		}
	}
	if err := json.Unmarshal(raw, &plan); err != nil || len(plan) != 1 {
		c.b.Fatalf("plan %s: %v", raw, err)
	}
	p := plan[0].Plan
	c.records[k] += p.Records
	c.fpis[k] += p.FPI
	if p.FPI == 0 {
		c.cleanBytes[k] += p.Bytes
		c.clean[k] += int64(len(changes))
	}
}

// end reports the subject's figures per message.
func (c *costSubject) end() costFigures {
	b, n := c.b, float64(c.messages)
	if c.messages == 0 {
		return costFigures{}
	}
	// EXPLAIN shows no answers, so the rows say whether every change
	// was applied: every message ends acknowledged.
	var open int
	if err := c.conn.QueryRow(c.ctx, `SELECT count(*) FROM operations WHERE state <> 'acknowledged'`).Scan(&open); err != nil || open != 0 {
		b.Fatalf("schema %04d: %d operations not acknowledged (%v)", c.version, open, err)
	}
	after := tableWrites(b, c.ctx, c.conn)
	v := fmt.Sprintf("@%04d", c.version)
	b.ReportMetric(float64(c.dbSize()-c.size)/n, "disk-B/msg"+v)
	b.ReportMetric(float64(c.cpu.Microseconds())/n, "pg-cpu-µs/msg"+v)
	b.ReportMetric(float64(c.elapsed.Microseconds())/n, "wall-µs/msg"+v)
	var rec, fpi int64
	var bytesPerMsg float64
	for k := range costKinds {
		rec += c.records[k]
		fpi += c.fpis[k]
		if c.clean[k] > 0 {
			bytesPerMsg += float64(c.cleanBytes[k]) / float64(c.clean[k])
		}
	}
	b.ReportMetric(float64(rec)/n, "wal-records/msg"+v)
	b.ReportMetric(bytesPerMsg, "wal-B/msg"+v)
	b.ReportMetric(float64(fpi)/n, "wal-fpi/msg"+v)
	var ins, upd, hot int64
	var detail []string
	for _, t := range []string{"operations", "transitions", "deliveries", "attempts"} {
		d := after[t].minus(c.writes[t])
		ins += d.ins
		upd += d.upd
		hot += d.hot
		detail = append(detail, fmt.Sprintf("%s %.2f ins %.2f upd (%d%% HOT)", t, float64(d.ins)/n, float64(d.upd)/n, percent(d.hot, d.upd)))
	}
	b.ReportMetric(float64(ins+upd)/n, "rows/msg"+v)
	b.ReportMetric(float64(percent(hot, upd)), "hot-%"+v)
	b.Logf("schema %04d (backend pid %d), %d messages: %s; WAL by change (records, bytes without FPI per message): %s",
		c.version, c.pid, c.messages, strings.Join(detail, ", "), walDetail(costKinds, c.records, c.cleanBytes, c.clean, n))
	return costFigures{cpu: float64(c.cpu.Microseconds()) / n, wall: float64(c.elapsed.Microseconds()) / n,
		walRecords: float64(rec) / n, walBytes: bytesPerMsg, rows: float64(ins+upd) / n}
}

func walDetail(kinds []string, records, cleanBytes, clean [3]int64, n float64) string {
	var out []string
	for k, name := range kinds {
		b := int64(0)
		if clean[k] > 0 {
			b = cleanBytes[k] / clean[k]
		}
		out = append(out, fmt.Sprintf("%s %.1f, %d B", name, float64(records[k])/n, b))
	}
	return strings.Join(out, "; ")
}

func percent(part, whole int64) int64 {
	if whole == 0 {
		return 0
	}
	return part * 100 / whole
}

// freshMessage is the gateway's three changes for a new message whose
// effect is confirmed and acked.
func freshMessage(b testing.TB, name string, at time.Time) (claim, confirm, ack *gate.Change) {
	path := func(from gate.State, to ...gate.State) []gate.Step {
		edges, err := gate.Path(from, to...)
		if err != nil {
			b.Fatal(err)
		}
		out := make([]gate.Step, len(edges))
		for i, e := range edges {
			out[i] = gate.Step{Transition: e, Reason: "to " + string(e.To)}
		}
		return out
	}
	op := &gate.Operation{ID: "op_" + name, ScopeKey: "bench/loadgen/message_id:/" + name, Tenant: "bench",
		Route: "loadgen", KeySource: gate.KeyMessageID, Key: name, Fingerprint: "v1:" + name,
		FingerprintVersion: 1, Shape: gate.ShapeIdempotent, DeadLetterPolicy: gate.DeadLetterGateway,
		ContractVersion: "v1", IdempotencyKey: "ik_" + name, CreatedAt: at, RetainUntil: at.AddDate(0, 0, 7)}
	d := &gate.Delivery{Broker: gate.BrokerPubSub, Source: "projects/p/subscriptions/loadgen", MessageID: name,
		ReceivedAt: at, Owner: "owner-1", TraceID: "0af7651916cd43dd8448eb211c80319c"}
	w := gate.Claiming(nil, op, gate.Lease{Owner: "owner-1", Fence: 1, Expires: at.Add(30 * time.Second)}, d, d.TraceID)
	claim = gate.StartChange(w, path("", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect),
		&gate.Attempt{N: 1, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, Fence: 1, StartedAt: at},
		"new operation", at)
	fin := &gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "res-" + name}
	s := gate.Settling(&gate.Operation{ID: op.ID, State: gate.StatePendingEffect}, 1, fin,
		&gate.Answer{Owner: "owner-1", Decision: gate.Ack, Reason: "confirmed"},
		gate.LeaseFacts{Deadline: at.Add(30 * time.Second)})
	confirm = gate.ConfirmChange(s, path(gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending),
		"res-"+name, "confirmed", at)
	ack = gate.AckedChange(op.ID, gate.StateAckPending, 1, path(gate.StateAckPending, gate.StateAcknowledged), at)
	return claim, confirm, ack
}

type writes struct{ ins, upd, hot int64 }

func (w writes) minus(o writes) writes { return writes{w.ins - o.ins, w.upd - o.upd, w.hot - o.hot} }

// tableWrites reads the cumulative row writes of the ledger's tables, after
// making the writing backend publish its counts.
func tableWrites(b *testing.B, ctx context.Context, conn *pgx.Conn) map[string]writes {
	if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT 1`); err != nil { // its end flushes
		b.Fatal(err)
	}
	rows, err := conn.Query(ctx, `SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables`)
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]writes{}
	var (
		name string
		w    writes
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &w.ins, &w.upd, &w.hot}, func() error {
		out[name] = w
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	return out
}

// backendCPU is the user and system CPU a local backend has used so far.
func backendCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("backend CPU (the server must be local): %v", err)
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("backend CPU: %s", raw)
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond
}

// migrateTo brings the database at url up to version, and no further.
func migrateTo(ctx context.Context, url string, version int64) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations(), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return err
	}
	_, err = p.UpTo(ctx, version)
	return err
}
