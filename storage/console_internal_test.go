package storage

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
)

// The seeded ledger: n operations on four routes (route-3 keyed on an
// attribute, the others on the message id), nearly all of them on the
// common path. Operation i is op_<i, 9 digits>, first delivered as msg-<i>,
// on route-<i%4>; what became of it is its kind, (i/4) % seedKinds, so
// every route has its share of each kind.
const (
	seedKinds         = 250
	kindIndeterminate = 0 // parked in the operator's lane, its move logged
	kindTerminal      = 1 // terminal at creation; dead-lettered by the gateway on even routes
	kindOpen          = 2 // open work the sweep moved into the lanes; on route-0 with an outbox entry
	kindConflicted    = 3 // acknowledged, and its key reused: a conflict record
	kindRedelivered   = 4 // acknowledged, then redelivered
	// seedYoung is the open work younger than the sweep's cursor, still on
	// the common path.
	seedYoung = 20
)

// seedLedger fills a fresh ledger with n operations in set-based
// statements, through the ledger's own constraints and triggers: every row
// is inserted as a claim leaves it (pending_effect under fence 1, or
// terminal) and moved by updates the triggers allow (the common path's
// evidence then ack; a logged move into the indeterminate lane; the sweep's
// waiting = 'open'). Side rows go where the write path puts them: further
// deliveries, the log of the indeterminate moves, dead letters, outbox
// entries. Then the sweep's cursor is set past the seeded rows, and
// seedYoung open operations arrive after it.
func seedLedger(tb testing.TB, ctx context.Context, pool *pgxpool.Pool, n int) {
	tb.Helper()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// {kind} is generated operation i's kind, {kind of id} a seeded row's.
	names := strings.NewReplacer("{kind}", fmt.Sprintf("((i / 4) %% %d)", seedKinds),
		"{kind of id}", fmt.Sprintf("((substr(id, 4)::integer / 4) %% %d)", seedKinds),
		"{indeterminate}", fmt.Sprint(kindIndeterminate), "{terminal}", fmt.Sprint(kindTerminal),
		"{open}", fmt.Sprint(kindOpen), "{conflicted}", fmt.Sprint(kindConflicted),
		"{redelivered}", fmt.Sprint(kindRedelivered), "{young}", fmt.Sprint(seedYoung))
	stmts := []string{
		`INSERT INTO operations (created_at, retain_until, fingerprint_version, id, route, tenant, key_source, key,
			scope_key, fingerprint, shape, dead_letter_policy, contract_version, idempotency_key, trace_id, broker,
			source, message_id, fence, owner, lease_start, lease_deadline, waiting, delivery_count, attempt_count,
			a1_fence, a1_contract, a1_started_at, reason, state, updated_at)
		SELECT at, at + interval '3650 days', 1, 'op_' || lpad(i::text, 9, '0'), 'route-' || (i % 4), 'acme',
			CASE i % 4 WHEN 3 THEN 'attribute' ELSE 'message_id' END, key, 'acme/route-' || (i % 4) || '/' || key,
			md5(i::text), CASE WHEN {kind} = {open} AND i % 4 = 0 THEN 'handoff' ELSE 'idempotent' END,
			CASE i % 2 WHEN 0 THEN 'gateway' ELSE 'broker' END, 'v1', 'ik_' || i, 'trace-' || i, 'pubsub',
			'projects/p/subscriptions/s', 'msg-' || i, 1, 'seed', at, at + interval '30 seconds',
			CASE WHEN terminal THEN 'terminal_failure' END,
			CASE WHEN {kind} IN ({indeterminate}, {terminal}, {open}, {redelivered}) THEN 2 ELSE 1 END,
			CASE WHEN terminal THEN 0 ELSE 1 END, CASE WHEN NOT terminal THEN 1 END,
			CASE WHEN NOT terminal THEN 'v1' END, CASE WHEN NOT terminal THEN at END,
			CASE WHEN terminal THEN 'seeded: terminal' ELSE 'new operation' END,
			CASE WHEN terminal THEN 'terminal_failure' ELSE 'pending_effect' END, at
		FROM generate_series(1, $1::integer) i,
			LATERAL (SELECT $2::timestamptz + i * interval '1 millisecond' AS at,
				CASE i % 4 WHEN 3 THEN 'order-' || i ELSE 'msg-' || i END AS key,
				{kind} = {terminal} AS terminal) x
		ORDER BY i`,
		// The common path: the evidence, then the ack mark.
		`UPDATE operations SET state = 'ack_pending', evidence_at = created_at + interval '20 milliseconds',
			result_id = 'res-' || id, a1_finished_at = created_at + interval '20 milliseconds', a1_outcome = 'confirmed',
			a1_status = 201, a1_result_id = 'res-' || id, d1_decision = 'ack',
			d1_reason = 'downstream confirmed the effect', reason = 'downstream confirmed the effect',
			updated_at = created_at + interval '20 milliseconds'
		WHERE state = 'pending_effect' AND {kind of id} NOT IN ({indeterminate}, {open})`,
		`UPDATE operations SET state = 'acknowledged', acked_at = evidence_at + interval '1 millisecond',
			updated_at = evidence_at + interval '1 millisecond'
		WHERE state = 'ack_pending'`,
		// A lost response parks the operation, off the common path: logged.
		`UPDATE operations SET state = 'effect_indeterminate', waiting = 'effect_indeterminate', lane = 'operator',
			log_count = 1, a1_finished_at = created_at + interval '5 seconds', a1_outcome = 'unknown',
			a1_reason = 'timeout', reason = 'seeded: lost response', updated_at = created_at + interval '5 seconds'
		WHERE state = 'pending_effect' AND {kind of id} = {indeterminate}`,
		`INSERT INTO transitions (operation_id, seq, from_state, to_state, at, fence, reason)
		SELECT id, 1, 'pending_effect', 'effect_indeterminate', updated_at, 1, 'seeded: lost response'
		FROM operations WHERE waiting = 'effect_indeterminate'`,
		// What the sweep does to open work that outlived its owner.
		`UPDATE operations SET waiting = 'open' WHERE state = 'pending_effect'`,
		`INSERT INTO outbox (operation_id, route, publication_id, broker, source, message_id, attributes, data,
			created_at, next_attempt_at)
		SELECT id, route, idempotency_key, broker, source, message_id, '{}', '\x7b7d', created_at, created_at
		FROM operations WHERE shape = 'handoff'`,
		`INSERT INTO deliveries (operation_id, n, broker, source, message_id, received_at, trace_id, found, decision,
			reason, anomaly)
		SELECT id, 2, broker, source, message_id, created_at + interval '1 minute', 'trace-again-' || id,
			state,
			CASE WHEN state = 'acknowledged' THEN 'ack' ELSE 'nack' END,
			CASE WHEN state = 'acknowledged' THEN 'redelivered after the ack was sent' ELSE 'held' END,
			CASE WHEN state = 'acknowledged' THEN 'redelivered_after_ack' ELSE '' END
		FROM operations WHERE delivery_count = 2`,
		`INSERT INTO dead_letters (operation_id, reason, at)
		SELECT id, 'seeded: dead-lettered', created_at FROM operations
		WHERE state = 'terminal_failure' AND dead_letter_policy = 'gateway'`,
		// The key reused with another fingerprint: a conflict record each.
		`INSERT INTO operations (created_at, retain_until, fingerprint_version, id, route, tenant, key_source, key,
			scope_key, fingerprint, conflict_of, shape, dead_letter_policy, contract_version, idempotency_key, broker,
			source, message_id, fence, waiting, d1_decision, d1_reason, reason, state, updated_at)
		SELECT created_at + interval '1 hour', retain_until, 1, 'cf_' || substr(id, 4), route, tenant, key_source,
			key, scope_key, md5('other' || id), id, shape, dead_letter_policy, 'v1', 'ik_cf_' || id, broker, source,
			message_id, 0, 'conflicting', 'ack', 'key reused', 'seeded: key reused', 'conflicting',
			created_at + interval '1 hour'
		FROM operations WHERE conflict_of IS NULL AND {kind of id} = {conflicted} ORDER BY seq`,
		`UPDATE sweep_cursor SET seq = (SELECT max(seq) FROM operations)`,
		// Young open work: past the cursor, on the common path.
		`INSERT INTO operations (created_at, retain_until, fingerprint_version, id, route, tenant, key_source, key,
			scope_key, fingerprint, shape, dead_letter_policy, contract_version, idempotency_key, broker, source,
			message_id, fence, owner, lease_start, lease_deadline, attempt_count, a1_fence, a1_contract,
			a1_started_at, reason, state, updated_at)
		SELECT at, at + interval '3650 days', 1, 'op_young_' || j, 'route-' || (j % 4), 'acme', 'message_id',
			'young-' || j, 'acme/route-' || (j % 4) || '/young-' || j, md5('young' || j), 'idempotent', 'gateway', 'v1',
			'ik_young_' || j, 'pubsub', 'projects/p/subscriptions/s', 'young-' || j, 1, 'seed', at,
			at + interval '30 seconds', 1, 1, 'v1', at, 'new operation', 'pending_effect', at
		FROM generate_series(1, {young}) j,
			LATERAL (SELECT $2::timestamptz + ($1::integer + j) * interval '1 millisecond' AS at) x
		ORDER BY j`,
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, s := range stmts {
		s = names.Replace(s)
		var args []any
		if strings.Contains(s, "$1") {
			args = []any{n, base}
		}
		began := time.Now()
		tag, err := tx.Exec(ctx, s, args...)
		if err != nil {
			tb.Fatalf("seed: %v\n%s", err, s)
		}
		tb.Logf("seed: %s in %s", tag, time.Since(began).Round(time.Millisecond))
	}
	if err := tx.Commit(ctx); err != nil {
		tb.Fatalf("seed commit: %v", err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE operations, transitions, deliveries, dead_letters, outbox, sweep_cursor`); err != nil {
		tb.Fatal(err)
	}
}

// seedID is the id of seeded operation i.
func seedID(i int) string { return fmt.Sprintf("op_%09d", i) }

// seedOf lists the seeded operations of kind k on route r, oldest first.
func seedOf(n, k, r int) []string {
	var out []string
	for i := 1; i <= n; i++ {
		if i%4 == r && (i/4)%seedKinds == k {
			out = append(out, seedID(i))
		}
	}
	return out
}

// statement is one statement a ledger method ran, with its arguments.
type statement struct {
	sql  string
	args []any
}

// recorder is a pool tracer that keeps the statements run while it is on,
// so that a test can EXPLAIN exactly what a method sent, batches included.
type recorder struct {
	mu  sync.Mutex
	on  bool
	got []statement
}

func (r *recorder) keep(sql string, args []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on {
		r.got = append(r.got, statement{sql, slices.Clone(args)})
	}
}

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.keep(d.SQL, d.Args)
	return ctx
}
func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *recorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (r *recorder) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.keep(d.SQL, d.Args)
}
func (r *recorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// record returns the statements f ran.
func (r *recorder) record(f func()) []statement {
	r.mu.Lock()
	r.on, r.got = true, nil
	r.mu.Unlock()
	f()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = false
	return r.got
}

// planned is a statement to EXPLAIN, with the indexes it must read.
type planned struct {
	name string
	statement
	want []string
}

// seededLedger is a seeded ledger whose pool records what it runs.
type seededLedger struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	ledger *Ledger
	rec    *recorder
	n      int
}

func newSeededLedger(tb testing.TB, n int) *seededLedger {
	tb.Helper()
	ctx := context.Background()
	url := testenv.DatabaseURL(tb)
	if err := Migrate(ctx, url); err != nil {
		tb.Fatal(err)
	}
	rec := &recorder{}
	pool, err := OpenPool(ctx, url, func(c *pgxpool.Config) { c.ConnConfig.Tracer = rec })
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	seedLedger(tb, ctx, pool, n)
	return &seededLedger{ctx: ctx, pool: pool, ledger: NewLedger(pool), rec: rec, n: n}
}

// laneQueries runs every listing the console and the admin API offer, with
// the filters an operator can give them, and returns the statements they
// ran, each with the indexes on operations or deliveries it must read.
func (s *seededLedger) laneQueries(tb testing.TB) []planned {
	tb.Helper()
	ctx, l := s.ctx, s.ledger
	var out []planned
	// run keeps the statements f ran; when the listing's SQL is exported
	// for its plan (sql != ""), it must be exactly what ran.
	run := func(name, sql string, args []any, want []string, f func() error) {
		tb.Helper()
		var err error
		got := s.rec.record(func() { err = f() })
		if err != nil {
			tb.Fatalf("%s: %v", name, err)
		}
		if len(got) == 0 {
			tb.Fatalf("%s ran no statement", name)
		}
		if sql != "" && (len(got) != 1 || got[0].sql != sql || fmt.Sprint(got[0].args) != fmt.Sprint(args)) {
			tb.Fatalf("%s ran %d statements, not the exported one:\n%v", name, len(got), got)
		}
		for i, st := range got {
			n := name
			if len(got) > 1 {
				n = fmt.Sprintf("%s #%d", name, i+1)
			}
			out = append(out, planned{n, st, want})
		}
	}
	lane := func(name string, f adminapi.LaneFilter, want ...string) {
		tb.Helper()
		sql, args, err := LaneQuery(f)
		if err != nil {
			tb.Fatalf("lane %s: %v", name, err)
		}
		run("lane "+name, sql, args, want, func() error { _, err := l.LanePage(ctx, f); return err })
	}
	dead := func(name string, f adminapi.DeadLetterFilter, want ...string) {
		tb.Helper()
		sql, args, err := l.DeadLettersQuery(f)
		if err != nil {
			tb.Fatalf("dead letters %s: %v", name, err)
		}
		run("dead letters "+name, sql, args, want, func() error { _, _, err := l.DeadLetters(ctx, f); return err })
	}
	list := func(name string, f adminapi.ListFilter, want ...string) {
		tb.Helper()
		run("list "+name, "", nil, want, func() error { _, _, err := l.List(ctx, f); return err })
	}
	// A message of an attribute-keyed route (found by its first delivery's
	// message id), and one of a message-keyed route (found by the id it
	// names), each redelivered once (kind 4).
	attrMsg, idMsg := "msg-19", "msg-16"
	byMessage := func(m string) []string {
		// The ids the message names on the three message-keyed routes; the
		// seeded ids are not derived from it, so the one that exists is
		// named beside two that do not.
		out := []string{"op_absent-a", "op_absent-b"}
		if m == idMsg {
			out = append(out, seedID(16))
		}
		return out
	}
	lanes := "operations_lanes"
	for _, st := range gate.States {
		name := string(st)
		var want []string
		switch st {
		case gate.StateAcknowledged:
			want = []string{"operations_pkey"}
		case gate.StateEffectIndeterminate, gate.StateTerminalFailure, gate.StateConflicting:
			want = []string{lanes}
		default:
			// Swept open work from the lanes; young work past the cursor.
			want = []string{lanes, "operations_pkey"}
		}
		lane(name, adminapi.LaneFilter{State: st, Limit: 50}, want...)
		lane(name+" by route", adminapi.LaneFilter{State: st, Route: "route-2", Limit: 50}, want...)
		// What a message names is found through its own index, whichever
		// way the planner then reaches the operations (by the lanes while
		// the table is small, by id once it is large); the row budget below
		// holds the reads to a page either way.
		msgWant := []string{"deliveries_message_id"}
		if st == gate.StateAcknowledged {
			// Every state at once: never by walking the table in time order.
			msgWant = []string{"operations_id_key", "deliveries_message_id"}
		}
		lane(name+" by message id", adminapi.LaneFilter{State: st, MessageID: attrMsg, ByMessage: byMessage(attrMsg), Limit: 50}, msgWant...)
		lane(name+" by route and message id", adminapi.LaneFilter{State: st, Route: "route-0", MessageID: idMsg,
			ByMessage: byMessage(idMsg), Limit: 50}, msgWant...)
		list("state "+name, adminapi.ListFilter{State: name}, want...)
		list("route and state "+name, adminapi.ListFilter{Route: "route-1", State: name}, want...)
	}
	// Later pages, from real cursors.
	for _, st := range []gate.State{gate.StateEffectIndeterminate, gate.StatePendingEffect} {
		first, err := l.LanePage(ctx, adminapi.LaneFilter{State: st, Route: "route-0", Limit: 5})
		if err != nil || first.Next == "" {
			tb.Fatalf("first page of %s: %v (next %q)", st, err, first.Next)
		}
		want := []string{lanes}
		if st == gate.StatePendingEffect {
			want = append(want, "operations_pkey")
		}
		lane(string(st)+" by route, page 2", adminapi.LaneFilter{State: st, Route: "route-0", Cursor: first.Next, Limit: 50}, want...)
	}
	// Every state but acknowledged, which no caller counts: its count would
	// read up to the cap by construction.
	counted := slices.DeleteFunc(slices.Clone(gate.States), func(s gate.State) bool { return s == gate.StateAcknowledged })
	var err error
	counts := s.rec.record(func() { _, err = l.LaneTotals(ctx, []string{"route-1"}, counted) })
	if err != nil || len(counts) != len(counted)+1 {
		tb.Fatalf("lane totals ran %d statements, %v", len(counts), err)
	}
	for i, st := range counts {
		name, want := "count outbox", []string(nil)
		if i < len(counted) {
			name, want = "count "+string(counted[i]), []string{lanes}
		}
		out = append(out, planned{name, st, want})
	}

	dead("every route", adminapi.DeadLetterFilter{}, lanes)
	dead("by route", adminapi.DeadLetterFilter{Route: "route-1"}, lanes)
	firstDead, next, err := l.DeadLetters(ctx, adminapi.DeadLetterFilter{Limit: 5})
	if err != nil || len(firstDead) != 5 || next == "" {
		tb.Fatalf("first page of dead letters: %d, %v (next %q)", len(firstDead), err, next)
	}
	dead("every route, page 2", adminapi.DeadLetterFilter{Cursor: next}, lanes)
	dead("by route, page 2", adminapi.DeadLetterFilter{Route: "route-1", Cursor: next}, lanes)

	list("newest", adminapi.ListFilter{}, "operations_pkey")
	page, next, err := l.List(ctx, adminapi.ListFilter{Limit: 5})
	if err != nil || len(page) != 5 || next == "" {
		tb.Fatalf("first page of the list: %d, %v (next %q)", len(page), err, next)
	}
	list("newest, page 2", adminapi.ListFilter{Cursor: next}, "operations_pkey")
	list("route", adminapi.ListFilter{Route: "route-2"}, "operations_pkey")
	list("key", adminapi.ListFilter{Key: "msg-12", ByKey: []string{seedID(12), "op_absent"}},
		"operations_id_key", "operations_conflict_of")
	list("route and key", adminapi.ListFilter{Route: "route-0", Key: "msg-12", ByKey: []string{seedID(12)}},
		"operations_id_key", "operations_conflict_of")
	list("message id, attribute-keyed", adminapi.ListFilter{MessageID: attrMsg, ByMessage: byMessage(attrMsg)},
		"operations_message_id", "deliveries_message_id")
	list("message id, message-keyed", adminapi.ListFilter{MessageID: idMsg, ByMessage: byMessage(idMsg)},
		"operations_id_key", "operations_conflict_of", "deliveries_message_id")
	list("route, state and message id", adminapi.ListFilter{Route: "route-0", State: string(gate.StateAcknowledged),
		MessageID: idMsg, ByMessage: byMessage(idMsg)}, "operations_id_key", "deliveries_message_id")
	return out
}

// planModes are how Postgres may plan a statement: for the values given,
// and as the cached generic plan a prepared statement turns into after a
// few runs.
var planModes = []string{"auto", "force_generic_plan"}

// planner EXPLAINs statements on one connection of a seeded ledger.
type planner struct {
	conn *pgxpool.Conn
	// budget is the most rows of operations a listing may read: every
	// operation off the common path (the lanes' index, and the young ones
	// past the sweep's cursor) and two pages more per part.
	offPath, budget float64
}

func (s *seededLedger) planner(tb testing.TB) *planner {
	tb.Helper()
	p := &planner{}
	if err := s.pool.QueryRow(s.ctx, `SELECT count(*) FROM operations
		WHERE waiting IS NOT NULL OR seq > (SELECT seq FROM sweep_cursor)`).Scan(&p.offPath); err != nil {
		tb.Fatal(err)
	}
	p.budget = p.offPath + 4*(defaultListLimit+1)
	conn, err := s.pool.Acquire(s.ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), `RESET plan_cache_mode`)
		conn.Release()
	})
	p.conn = conn
	return p
}

// indexesOfTheLedger are the indexes schema.sql gives operations and
// deliveries.
var indexesOfTheLedger = []string{"operations_lanes", "operations_pkey", "operations_id_key", "operations_message_id",
	"operations_conflict_of", "deliveries_message_id", "deliveries_pkey"}

// problems runs q under EXPLAIN ANALYZE, planned as mode says, and says
// how it breaks what the console promises: operations is never read whole
// (no sequential scan), every index read on it or on deliveries is one
// schema.sql gives them, the statement reads the indexes named for it, and
// the rows it reads from operations are a page's worth beside the lanes:
// nothing of the common path's bulk.
func (p *planner) problems(tb testing.TB, q planned, mode string) []string {
	tb.Helper()
	ctx := context.Background()
	if _, err := p.conn.Exec(ctx, `SET plan_cache_mode = `+mode); err != nil {
		tb.Fatal(err)
	}
	var raw []byte
	if err := p.conn.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+q.sql, q.args...).Scan(&raw); err != nil {
		tb.Fatalf("%s: explain: %v\n%s", q.name, err, q.sql)
	}
	nodes, err := PlanNodes(raw)
	if err != nil {
		tb.Fatal(err)
	}
	var (
		out     []string
		read    float64
		indexes []string
	)
	for _, n := range nodes {
		if n.Index != "" {
			indexes = append(indexes, n.Index)
		}
		if n.Relation == "operations" {
			read += n.Read
		}
		onLedger := n.Relation == "operations" || n.Relation == "deliveries" ||
			strings.HasPrefix(n.Index, "operations_") || strings.HasPrefix(n.Index, "deliveries_")
		switch {
		case n.Relation == "operations" && n.Type == "Seq Scan":
			out = append(out, "reads operations whole")
		case onLedger && n.Index != "" && !slices.Contains(indexesOfTheLedger, n.Index):
			out = append(out, "reads an index schema.sql does not give: "+n.Index)
		}
	}
	for _, w := range q.want {
		if !slices.Contains(indexes, w) {
			out = append(out, "does not read "+w)
		}
	}
	if read > p.budget {
		out = append(out, fmt.Sprintf("reads %.0f rows of operations, of which %.0f are off the common path", read, p.offPath))
	}
	if len(out) > 0 {
		var scans []string
		for _, n := range nodes {
			if strings.Contains(n.Type, "Scan") {
				scans = append(scans, n.String())
			}
		}
		out = append(out, strings.Join(scans, "; "), q.sql)
	}
	return out
}

// The lanes, the dead letters and the list stay index reads of a page on
// a seeded ledger; the same check at 1,000,000 operations is
// BenchmarkLanesMillion (seeding that many takes minutes, too long for
// every test run).
func TestLaneQueriesUseIndexes(t *testing.T) {
	t.Parallel()
	const n = 20000
	s := newSeededLedger(t, n)
	queries, p := s.laneQueries(t), s.planner(t)
	for _, mode := range planModes {
		for _, q := range queries {
			t.Run(mode+"/"+q.name, func(t *testing.T) {
				if problems := p.problems(t, q, mode); len(problems) > 0 {
					t.Errorf("%s", strings.Join(problems, "\n"))
				}
			})
		}
	}
	t.Run("pages and counts", func(t *testing.T) { checkLanes(t, s) })
}

// checkLanes holds the lanes of a seeded ledger to what was seeded.
func checkLanes(t *testing.T, s *seededLedger) {
	ctx, l, n := s.ctx, s.ledger, s.n

	// Paging walks the whole lane once, oldest first.
	var got []string
	cursor := ""
	for {
		page, err := l.LanePage(ctx, adminapi.LaneFilter{State: gate.StateEffectIndeterminate, Route: "route-0", Cursor: cursor, Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Entries {
			got = append(got, e.ID)
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	if want := seedOf(n, kindIndeterminate, 0); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("paged %v,\nwant %v", got, want)
	}

	// An open state lists the swept work from the lanes, then the young
	// work past the sweep's cursor.
	var open []string
	cursor = ""
	for {
		page, err := l.LanePage(ctx, adminapi.LaneFilter{State: gate.StatePendingEffect, Route: "route-1", Cursor: cursor, Limit: 4})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Entries {
			open = append(open, e.ID)
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	wantOpen := seedOf(n, kindOpen, 1)
	for j := 1; j <= seedYoung; j++ {
		if j%4 == 1 {
			wantOpen = append(wantOpen, fmt.Sprintf("op_young_%d", j))
		}
	}
	if fmt.Sprint(open) != fmt.Sprint(wantOpen) {
		t.Fatalf("open lane of route-1: %v,\nwant %v", open, wantOpen)
	}

	page, err := l.LanePage(ctx, adminapi.LaneFilter{State: gate.StateTerminalFailure, Limit: 1})
	if err != nil || len(page.Entries) != 1 || page.Next == "" {
		t.Fatalf("terminal lane's oldest: %+v, %v", page, err)
	}
	// seedOf(n, kindTerminal, r)[0] for the four routes: the oldest is on
	// route-0, dead-lettered by the gateway (even route).
	if e := page.Entries[0]; e.ID != seedOf(n, kindTerminal, 0)[0] || e.DeadLetterAt == nil || e.DeadLetterReason != "seeded: dead-lettered" {
		t.Fatalf("terminal lane's oldest: %+v, want %s with its dead letter", e, seedOf(n, kindTerminal, 0)[0])
	}
	page, err = l.LanePage(ctx, adminapi.LaneFilter{State: gate.StateTerminalFailure, Route: "route-1", Limit: 1})
	if err != nil || len(page.Entries) != 1 || page.Entries[0].DeadLetterAt != nil {
		t.Fatalf("a broker-policy terminal operation has no dead letter: %+v, %v", page.Entries, err)
	}

	totals, err := l.LaneTotals(ctx, []string{"route-0", "route-1"}, []gate.State{gate.StateEffectIndeterminate,
		gate.StateTerminalFailure, gate.StateConflicting, gate.StatePendingEffect})
	if err != nil {
		t.Fatal(err)
	}
	perKind := int64(len(seedOf(n, kindIndeterminate, 0)))
	young := func(r int) int64 { return int64((seedYoung + 3 - r) / 4) } // j in 1..seedYoung with j%4 == r
	want := map[string]int64{
		"route-0/effect_indeterminate": perKind, "route-1/effect_indeterminate": perKind,
		"route-0/terminal_failure": perKind, "route-1/terminal_failure": perKind,
		"route-0/conflicting": perKind, "route-1/conflicting": perKind,
		"route-0/pending_effect": perKind + young(0), "route-1/pending_effect": perKind + young(1),
		"route-0/outbox": perKind, "route-1/outbox": 0,
	}
	for _, c := range totals {
		w, ok := want[c.Route+"/"+c.Lane]
		if !ok || w != c.N || c.Capped {
			t.Errorf("%s/%s: %d (capped %v), want %d", c.Route, c.Lane, c.N, c.Capped, w)
		}
	}
	if len(totals) != len(want) {
		t.Errorf("%d totals, want %d: %+v", len(totals), len(want), totals)
	}
	ob, err := l.OutboxPage(ctx, adminapi.OutboxFilter{Route: "route-0", Limit: 3})
	if err != nil || len(ob.Entries) != 3 || ob.Next == "" || ob.Entries[0].OperationID != seedOf(n, kindOpen, 0)[0] {
		t.Fatalf("outbox page: %+v, %v", ob, err)
	}
	if _, err := l.LanePage(ctx, adminapi.LaneFilter{State: "nonsense"}); err == nil {
		t.Fatal("an unknown state was listed")
	}
	if _, err := l.LanePage(ctx, adminapi.LaneFilter{State: gate.StateConflicting, Cursor: "%%%"}); err == nil {
		t.Fatal("a malformed cursor was accepted")
	}
}

// BenchmarkLanesMillion seeds 1,000,000 operations (a few minutes), of
// which 1.2% left the common path and 0.4% had their key reused, checks
// that every listing is still a page's read through the indexes, and then
// measures what the console and the admin API ask of it, each against the
// cheapest read the ledger has (one operation by id) in the same run:
//
//	go test -run='^$' -bench=LanesMillion -benchtime=2s -timeout=60m ./storage/
//
// The figures to compare are each sub-benchmark's ns/op divided by the
// baseline's.
func BenchmarkLanesMillion(b *testing.B) {
	const n = 1_000_000
	start := time.Now()
	s := newSeededLedger(b, n)
	b.Logf("seeded %d operations in %s", n, time.Since(start).Round(time.Second))
	queries, p := s.laneQueries(b), s.planner(b)
	for _, mode := range planModes {
		for _, q := range queries {
			if problems := p.problems(b, q, mode); len(problems) > 0 {
				b.Errorf("%s (%s plan): %s", q.name, mode, strings.Join(problems, "\n"))
			}
		}
	}
	ctx, l := s.ctx, s.ledger
	routes := []string{"route-0", "route-1", "route-2", "route-3"}
	lanes := []gate.State{gate.StateEffectIndeterminate, gate.StateTerminalFailure, gate.StateConflicting}
	bench := func(name string, f func() error) {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if err := f(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	bench("baseline: one operation by id", func() error { _, _, err := l.FindByID(ctx, seedID(n/2)); return err })
	bench("lane totals", func() error { _, err := l.LaneTotals(ctx, routes, lanes); return err })
	bench("indeterminate page of a route", func() error {
		page, err := l.LanePage(ctx, adminapi.LaneFilter{State: gate.StateEffectIndeterminate, Route: "route-0", Limit: 50})
		if err == nil && len(page.Entries) != 50 {
			err = fmt.Errorf("page of %d entries", len(page.Entries))
		}
		return err
	})
	bench("open page of a route", func() error {
		_, err := l.LanePage(ctx, adminapi.LaneFilter{State: gate.StatePendingEffect, Route: "route-0", Limit: 50})
		return err
	})
	bench("dead letters, every route", func() error { _, _, err := l.DeadLetters(ctx, adminapi.DeadLetterFilter{}); return err })
	bench("list by message id", func() error {
		_, _, err := l.List(ctx, adminapi.ListFilter{MessageID: "msg-19", ByMessage: []string{"op_absent"}})
		return err
	})
}
