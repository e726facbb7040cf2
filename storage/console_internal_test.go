package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
)

// seedLedger fills a fresh ledger with n operations in one set-based
// transaction, through the ledger's own guards: every operation's log is
// written edge by edge (the triggers judge each one) and ends where the
// row's state is. One in 500 is indeterminate, one in 500 terminal and
// dead-lettered, the rest acknowledged; one conflict record per 500, one
// delivery per operation, and a handoff outbox of n/100 undelivered
// entries (all on route-0). Four routes share the operations.
func seedLedger(tb testing.TB, ctx context.Context, pool *pgxpool.Pool, n int) {
	tb.Helper()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	steps := `(VALUES
		('acknowledged', 1, NULL, 'received'), ('acknowledged', 2, 'received', 'reserved'),
		('acknowledged', 3, 'reserved', 'pending_effect'), ('acknowledged', 4, 'pending_effect', 'effect_confirmed'),
		('acknowledged', 5, 'effect_confirmed', 'ack_pending'), ('acknowledged', 6, 'ack_pending', 'acknowledged'),
		('effect_indeterminate', 1, NULL, 'received'), ('effect_indeterminate', 2, 'received', 'reserved'),
		('effect_indeterminate', 3, 'reserved', 'pending_effect'), ('effect_indeterminate', 4, 'pending_effect', 'effect_indeterminate'),
		('terminal_failure', 1, NULL, 'received'), ('terminal_failure', 2, 'received', 'reserved'),
		('terminal_failure', 3, 'reserved', 'pending_effect'), ('terminal_failure', 4, 'pending_effect', 'terminal_failure'),
		('conflicting', 1, NULL, 'received'), ('conflicting', 2, 'received', 'conflicting')
	) AS p(state, step, from_state, to_state)`
	stmts := []string{
		`INSERT INTO operations (id, scope_key, tenant, route, key_source, key, fingerprint, fingerprint_version,
			state, shape, dead_letter_policy, contract_version, idempotency_key, fence, reason,
			created_at, updated_at, retain_until)
		SELECT 'op_' || lpad(i::text, 9, '0'), 'seed/' || i, '', 'route-' || (i % 4), 'message_id', 'msg-' || i,
			md5(i::text), 1,
			CASE i % 500 WHEN 0 THEN 'effect_indeterminate' WHEN 1 THEN 'terminal_failure' ELSE 'acknowledged' END,
			'idempotent', 'gateway', 'v1', 'idem-' || i, 1,
			CASE i % 500 WHEN 0 THEN 'seeded: lost response' WHEN 1 THEN 'seeded: terminal' ELSE '' END,
			$2::timestamptz + i * interval '1 millisecond', $2::timestamptz + i * interval '1 millisecond',
			$2::timestamptz + interval '3650 days'
		FROM generate_series(1, $1::integer) i`,
		`INSERT INTO operations (id, scope_key, tenant, route, key_source, key, fingerprint, fingerprint_version,
			conflict_of, state, shape, dead_letter_policy, contract_version, idempotency_key, reason,
			created_at, updated_at, retain_until)
		SELECT 'cf_' || lpad(i::text, 9, '0'), 'seed/' || (i - 1), '', 'route-' || ((i - 1) % 4), 'message_id',
			'msg-' || (i - 1), md5('other' || i), 1, 'op_' || lpad((i - 1)::text, 9, '0'), 'conflicting',
			'idempotent', 'gateway', 'v1', 'idem-' || (i - 1), 'seeded: key reused',
			$2::timestamptz + i * interval '1 millisecond', $2::timestamptz + i * interval '1 millisecond',
			$2::timestamptz + interval '3650 days'
		FROM generate_series(2, $1::integer, 500) i`,
		`INSERT INTO transitions (operation_id, seq, from_state, to_state, at, fence)
		SELECT o.id, 0, p.from_state::ackgate_state, p.to_state::ackgate_state, o.created_at, o.fence
		FROM operations o JOIN ` + steps + ` ON p.state = o.state::text
		WHERE $1::integer > 0 AND $2::timestamptz IS NOT NULL
		ORDER BY o.id, p.step`,
		`INSERT INTO deliveries (operation_id, broker, source, message_id, received_at, decision)
		SELECT id, 'pubsub', 'projects/p/subscriptions/s', key, created_at, 'ack' FROM operations
		WHERE $1::integer > 0 AND $2::timestamptz IS NOT NULL`,
		`INSERT INTO dead_letters (operation_id, reason, at)
		SELECT id, 'seeded: dead-lettered', updated_at FROM operations
		WHERE state = 'terminal_failure' AND $1::integer > 0 AND $2::timestamptz IS NOT NULL`,
		`INSERT INTO outbox (operation_id, route, publication_id, broker, source, message_id, created_at, next_attempt_at)
		SELECT id, route, idempotency_key, 'pubsub', 'projects/p/subscriptions/s', key, created_at, created_at
		FROM operations WHERE conflict_of IS NULL AND id LIKE '%00' AND $1::integer > 0 AND $2::timestamptz IS NOT NULL`,
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s, n, base); err != nil {
			tb.Fatalf("seed: %v\n%s", err, s)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		tb.Fatalf("seed commit (the ledger's guards judge it here): %v", err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE operations, transitions, deliveries, dead_letters, outbox`); err != nil {
		tb.Fatal(err)
	}
}

type plannedQuery struct {
	name string
	sql  string
	args []any
}

// laneQueries are the statements the console's lanes page runs, with the
// arguments an operator's filters give them.
func laneQueries(tb testing.TB, ledger *Ledger, ctx context.Context) []plannedQuery {
	tb.Helper()
	var out []plannedQuery
	add := func(name string, f adminapi.LaneFilter) {
		sql, args, _, err := laneQuery(f)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, plannedQuery{name, sql, args})
	}
	for _, s := range []gate.State{gate.StateEffectIndeterminate, gate.StateTerminalFailure, gate.StateConflicting} {
		add(string(s), adminapi.LaneFilter{State: s, Limit: 50})
		add(string(s)+" by route", adminapi.LaneFilter{State: s, Route: "route-2", Limit: 50})
		out = append(out, plannedQuery{"count " + string(s), laneCountSQL(s), []any{"route-1", LaneCountCap + 1}})
	}
	// A later page, from a real cursor.
	first, err := ledger.LanePage(ctx, adminapi.LaneFilter{State: gate.StateEffectIndeterminate, Route: "route-0", Limit: 5})
	if err != nil || first.Next == "" {
		tb.Fatalf("first page: %v (next %q)", err, first.Next)
	}
	add("indeterminate by route, page 2", adminapi.LaneFilter{State: gate.StateEffectIndeterminate, Route: "route-0", Cursor: first.Next, Limit: 50})
	add("indeterminate by message id", adminapi.LaneFilter{State: gate.StateEffectIndeterminate, MessageID: "msg-1000", Limit: 50})
	add("acknowledged by message id", adminapi.LaneFilter{State: gate.StateAcknowledged, MessageID: "msg-7", Limit: 50})
	return out
}

// scans walks an EXPLAIN (FORMAT JSON) plan and lists each scan node as
// "Node Type on relation (index)".
func scans(plan any) []string {
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch n := v.(type) {
		case []any:
			for _, x := range n {
				walk(x)
			}
		case map[string]any:
			if t, ok := n["Node Type"].(string); ok && strings.Contains(t, "Scan") {
				rel, _ := n["Relation Name"].(string)
				idx, _ := n["Index Name"].(string)
				out = append(out, fmt.Sprintf("%s on %s (%s)", t, rel, idx))
			}
			for _, x := range n {
				walk(x)
			}
		}
	}
	walk(plan)
	return out
}

// checkPlans EXPLAINs every lane query both as Postgres plans it for the
// values given and as a cached generic plan (what a prepared statement
// turns into after a few runs): neither may read the operations table
// whole, and each must reach it through an index.
func checkPlans(tb testing.TB, ctx context.Context, pool *pgxpool.Pool, queries []plannedQuery) {
	tb.Helper()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Release()
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `RESET plan_cache_mode`) }()
	for _, mode := range []string{"auto", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode); err != nil {
			tb.Fatal(err)
		}
		for _, q := range queries {
			var raw []byte
			if err := conn.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+q.sql, q.args...).Scan(&raw); err != nil {
				tb.Fatalf("%s: explain: %v", q.name, err)
			}
			var plan any
			if err := json.Unmarshal(raw, &plan); err != nil {
				tb.Fatal(err)
			}
			s := scans(plan)
			onOps := slices.ContainsFunc(s, func(x string) bool {
				// A bitmap heap scan is fed by a bitmap index scan.
				return strings.Contains(x, " on operations ") && (strings.Contains(x, "Index") || strings.HasPrefix(x, "Bitmap Heap Scan"))
			})
			if slices.ContainsFunc(s, func(x string) bool { return strings.HasPrefix(x, "Seq Scan on operations") }) || !onOps {
				tb.Errorf("%s (%s): operations not reached through an index: %v\n%s", q.name, mode, s, raw)
			} else {
				tb.Logf("%s (%s): %v", q.name, mode, s)
			}
		}
	}
}

func newSeededLedger(tb testing.TB, n int) (context.Context, *pgxpool.Pool, *Ledger) {
	tb.Helper()
	ctx := context.Background()
	url := testenv.DatabaseURL(tb)
	if err := Migrate(ctx, url); err != nil {
		tb.Fatal(err)
	}
	pool, err := OpenPool(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	seedLedger(tb, ctx, pool, n)
	return ctx, pool, NewLedger(pool)
}

// The lanes stay index reads on a seeded ledger; the same check at
// 1,000,000 operations is BenchmarkLanesMillion (seeding that many takes
// minutes, too long for every test run).
func TestLaneQueriesUseIndexes(t *testing.T) {
	t.Parallel()
	const n = 20000
	ctx, pool, ledger := newSeededLedger(t, n)
	checkPlans(t, ctx, pool, laneQueries(t, ledger, ctx))

	// Paging walks the whole lane once, oldest first.
	var got []string
	cursor := ""
	for {
		page, err := ledger.LanePage(ctx, adminapi.LaneFilter{State: gate.StateEffectIndeterminate, Route: "route-0", Cursor: cursor, Limit: 7})
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
	// i % 500 == 0 and i % 4 == 0: every 500th operation is on route-0.
	if len(got) != n/500 || !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Fatalf("paged %d entries (want %d, sorted, no repeats): %v", len(got), n/500, got)
	}

	page, err := ledger.LanePage(ctx, adminapi.LaneFilter{State: gate.StateTerminalFailure, Limit: 1})
	if err != nil || len(page.Entries) != 1 || page.Entries[0].DeadLetterAt == nil || page.Entries[0].ID != "op_000000001" {
		t.Fatalf("terminal lane's oldest: %+v, %v", page.Entries, err)
	}
	totals, err := ledger.LaneTotals(ctx, []string{"route-0", "route-1"}, []gate.State{gate.StateEffectIndeterminate, gate.StateTerminalFailure, gate.StateConflicting})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{
		"route-0/effect_indeterminate": n / 500, "route-1/terminal_failure": n / 500, "route-1/conflicting": n / 500,
		"route-0/terminal_failure": 0, "route-1/effect_indeterminate": 0, "route-0/conflicting": 0,
		"route-0/outbox": n / 100, "route-1/outbox": 0,
	}
	for _, c := range totals {
		if w, ok := want[c.Route+"/"+c.Lane]; !ok || w != c.N || c.Capped {
			t.Errorf("%s/%s: %d (capped %v), want %d", c.Route, c.Lane, c.N, c.Capped, w)
		}
	}
	if len(totals) != len(want) {
		t.Errorf("%d totals, want %d: %+v", len(totals), len(want), totals)
	}
	ob, err := ledger.OutboxPage(ctx, adminapi.OutboxFilter{Route: "route-0", Limit: 3})
	if err != nil || len(ob.Entries) != 3 || ob.Next == "" || ob.Entries[0].OperationID != "op_000000100" {
		t.Fatalf("outbox page: %+v, %v", ob, err)
	}
	if _, err := ledger.LanePage(ctx, adminapi.LaneFilter{State: "nonsense"}); err == nil {
		t.Fatal("an unknown state was listed")
	}
	if _, err := ledger.LanePage(ctx, adminapi.LaneFilter{State: gate.StateConflicting, Cursor: "%%%"}); err == nil {
		t.Fatal("a malformed cursor was accepted")
	}
}

// BenchmarkLanesMillion seeds 1,000,000 operations (several minutes), checks
// that every lane query is still an index read, and then measures one
// lanes page as the console draws it: the totals and the first page of
// the indeterminate lane of one route.
//
//	go test -run='^$' -bench=LanesMillion -benchtime=50x ./storage/
func BenchmarkLanesMillion(b *testing.B) {
	const n = 1_000_000
	start := time.Now()
	ctx, pool, ledger := newSeededLedger(b, n)
	b.Logf("seeded %d operations in %s", n, time.Since(start).Round(time.Second))
	checkPlans(b, ctx, pool, laneQueries(b, ledger, ctx))
	routes := []string{"route-0", "route-1", "route-2", "route-3"}
	lanes := []gate.State{gate.StateEffectIndeterminate, gate.StateTerminalFailure, gate.StateConflicting}
	b.ResetTimer()
	for b.Loop() {
		if _, err := ledger.LaneTotals(ctx, routes, lanes); err != nil {
			b.Fatal(err)
		}
		// Every seeded indeterminate operation is on route-0 (i % 500 == 0).
		page, err := ledger.LanePage(ctx, adminapi.LaneFilter{State: gate.StateEffectIndeterminate, Route: "route-0", Limit: 50})
		if err != nil || len(page.Entries) != 50 {
			b.Fatalf("page: %d entries, %v", len(page.Entries), err)
		}
	}
}
