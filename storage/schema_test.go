package storage_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
)

func TestMigrateTwiceAndSchemaCurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.DatabaseURL(t)
	pool, err := storage.OpenPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	if current, err := storage.SchemaCurrent(ctx, pool); err != nil || current {
		t.Fatalf("SchemaCurrent before migrating = %v, %v; want false, nil", current, err)
	}
	for i := range 2 {
		if err := storage.Migrate(ctx, url); err != nil {
			t.Fatalf("migrate #%d: %v", i+1, err)
		}
		if current, err := storage.SchemaCurrent(ctx, pool); err != nil || !current {
			t.Fatalf("SchemaCurrent after migrate #%d = %v, %v; want true, nil", i+1, current, err)
		}
	}
	var applied int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM goose_db_version WHERE version_id > 0`).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migration files: %v", err)
	}
	if applied != len(files) {
		t.Fatalf("goose recorded %d migrations, want each of the %d once", applied, len(files))
	}

	// A migration this build embeds but the database lacks makes it not current.
	if _, err := pool.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id = (SELECT max(version_id) FROM goose_db_version)`); err != nil {
		t.Fatal(err)
	}
	if current, err := storage.SchemaCurrent(ctx, pool); err != nil || current {
		t.Fatalf("SchemaCurrent with the newest migration missing = %v, %v; want false, nil", current, err)
	}
}

// schemaFacts describes a database's schema object by object, in words
// Postgres itself prints: tables and their options, columns, constraints,
// indexes, triggers, functions, domains. Two databases with the same facts
// hold the same schema.
const schemaFacts = `
SELECT 'table ' || c.relname || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' AND c.relname <> 'goose_db_version'
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname || ' #' || a.attnum || ' ' || format_type(a.atttypid, a.atttypmod)
	|| CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
	|| coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
	|| CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' AND c.relname <> 'goose_db_version'
	AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint ' || coalesce(conrelid::regclass::text, contypid::regtype::text) || ' ' || conname || ' ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'public'::regnamespace AND conrelid::regclass IS DISTINCT FROM to_regclass('goose_db_version')
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
WHERE c.relnamespace = 'public'::regnamespace AND c.relname <> 'goose_db_version'
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
UNION ALL
SELECT 'function ' || pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
UNION ALL
SELECT 'domain ' || t.typname || ' ' || format_type(t.typbasetype, t.typtypmod)
FROM pg_type t WHERE t.typnamespace = 'public'::regnamespace AND t.typtype = 'd'`

func facts(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), schemaFacts)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// schema.sql states the ledger as it is: a database built from it holds
// exactly what the migrations build. Either changed without the other
// fails here.
func TestSchemaFileIsTheMigratedSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, migrated := newLedger(t)
	stated, err := storage.OpenPool(ctx, testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer stated.Close()
	if _, err := stated.Exec(ctx, storage.SchemaDDL()); err != nil {
		t.Fatalf("schema.sql does not build a database: %v", err)
	}
	want, got := facts(t, migrated), facts(t, stated)
	if len(want) < 50 {
		t.Fatalf("only %d schema facts read from the migrated database", len(want))
	}
	for _, f := range want {
		if !slices.Contains(got, f) {
			t.Errorf("migrated, not in schema.sql: %s", f)
		}
	}
	for _, f := range got {
		if !slices.Contains(want, f) {
			t.Errorf("in schema.sql, not migrated: %s", f)
		}
	}
}

// The named queries are statements of schema.sql, each checked by the
// server against the tables above them: it parses and plans every one,
// with every argument's type declared in the query itself.
func TestNamedQueriesPrepare(t *testing.T) {
	t.Parallel()
	_, pool := newLedger(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var names []string
	for name, q := range storage.Queries() {
		names = append(names, name)
		args := pgx.NamedArgs{}
		for _, m := range regexp.MustCompile(`@(\w+)`).FindAllStringSubmatch(q, -1) {
			args[m[1]] = nil
		}
		rewritten, _, err := args.RewriteQuery(ctx, conn.Conn(), q, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Conn().Prepare(ctx, "", rewritten); err != nil {
			t.Errorf("query %s does not prepare: %v", name, err)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"answer", "change", "claim", "claim (plain)", "row"}) {
		t.Errorf("named queries %v", names)
	}
}

// storable is how to bring a new operation into each state the ledger can
// hold (received never is: nothing leads into it but a creation, which
// goes on to reserved in the same statement).
func storable(t *testing.T, l *storage.Ledger, pool *pgxpool.Pool, s gate.State) string {
	t.Helper()
	ctx := context.Background()
	op := newOperation(fmt.Sprintf("in-%s-%d", s, time.Now().UnixNano()))
	if s == gate.StateConflicting {
		rec := *op
		rec.ID, rec.Fingerprint, rec.Reason = op.ID+"-c", "v1:other", "reused"
		createPending(t, l, op)
		if _, err := l.RecordConflict(ctx, &gate.Conflict{Original: op, Record: &rec, At: t0,
			Delivery: delivery("m-c", 1, t0)}); err != nil {
			t.Fatal(err)
		}
		return rec.ID
	}
	createPending(t, l, op)
	lost := &gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown}
	switch s {
	case gate.StatePendingEffect:
	case gate.StateReserved:
		if _, err := pool.Exec(ctx, `UPDATE operations SET state = 'reserved', log_count = log_count + 1, waiting = 'open'
			WHERE id = $1`, op.ID); err != nil {
			t.Fatal(err)
		}
	case gate.StateAckPending, gate.StateAcknowledged:
		must(t, l.Write(ctx, confirm(t, op, "res", t0)))
		if s == gate.StateAcknowledged {
			must(t, l.Write(ctx, acked(t, op, 1, t0)))
		}
	case gate.StateEffectIndeterminate, gate.StateEffectConfirmed:
		must(t, l.Write(ctx, gate.IndeterminateChange(settling(op.ID, gate.StatePendingEffect, 1, lost, 1),
			steps(t, gate.StatePendingEffect, gate.StateEffectIndeterminate), gate.LaneOperator, "lost", t0)))
		if s == gate.StateEffectConfirmed {
			iv := &gate.Intervention{Resolution: gate.Resolution{Kind: gate.ResolveHappened, ResultID: "r", Reason: "seen", Actor: "ops"},
				From: gate.StateEffectIndeterminate, To: gate.StateEffectConfirmed, Fence: 2, At: t0}
			must(t, l.Write(ctx, gate.ResolveChange(gate.Intervening(&gate.Operation{ID: op.ID, State: gate.StateEffectIndeterminate},
				gate.Lease{Owner: "ops", Fence: 2}), steps(t, gate.StateEffectIndeterminate, gate.StateEffectConfirmed), iv, 0, "r", nil, "seen", t0)))
		}
	case gate.StateTerminalFailure:
		must(t, l.Write(ctx, gate.TerminalChange(settling(op.ID, gate.StatePendingEffect, 1, lost, 1),
			steps(t, gate.StatePendingEffect, gate.StateTerminalFailure), nil, "gave up", t0)))
	default:
		t.Fatalf("no way to store an operation in %s", s)
	}
	return op.ID
}

// moveSQL moves operation $1 to state $2 in raw SQL, as a writer that
// knows the constraints would: the log counted, the lanes' column, the
// evidence and the ack set as the target state needs them. Only the
// lifecycle's own guard can then refuse it.
const moveSQL = `UPDATE operations SET state = $2::text, log_count = log_count + 1,
	waiting = CASE WHEN $2::text IN ('effect_indeterminate', 'terminal_failure', 'conflicting') THEN $2::text
		WHEN $2::text = 'acknowledged' THEN NULL ELSE 'open' END,
	evidence_at = CASE WHEN $2::text IN ('effect_confirmed', 'ack_pending', 'acknowledged') THEN coalesce(evidence_at, now()) END,
	result_id = CASE WHEN $2::text IN ('effect_confirmed', 'ack_pending', 'acknowledged') THEN result_id ELSE '' END,
	acked_at = CASE WHEN $2::text = 'acknowledged' THEN coalesce(acked_at, now()) END
	WHERE id = $1`

// composite are the moves a single statement may make that are not one
// edge of the table: each with the witness of the state it passes.
var composite = map[gate.Transition]bool{
	{From: gate.StateReserved, To: gate.StateAckPending}:              true,
	{From: gate.StatePendingEffect, To: gate.StateAckPending}:         true,
	{From: gate.StateEffectConfirmed, To: gate.StateAcknowledged}:     true,
	{From: gate.StateEffectIndeterminate, To: gate.StateAcknowledged}: true,
}

// Every pair of states the lifecycle does not allow is refused by the
// ledger itself, whoever writes it; every edge it allows is accepted. Raw
// SQL that satisfies every other constraint is the probe, so the
// lifecycle's guard is what answers.
func TestEveryMoveOffTheLifecycleIsRefused(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	for _, from := range gate.States {
		if from == gate.StateReceived {
			continue
		}
		id := storable(t, l, pool, from)
		for _, to := range gate.States {
			if to == from {
				continue
			}
			edge := gate.Transition{From: from, To: to}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tx.Exec(ctx, moveSQL, id, string(to))
			_ = tx.Rollback(ctx)
			allowed := gate.CanTransition(from, to) || composite[edge]
			switch {
			case allowed && err != nil:
				t.Errorf("%s -> %s is in the lifecycle and was refused: %v", from, to, err)
			case !allowed && err == nil:
				t.Errorf("%s -> %s is not in the lifecycle and was accepted", from, to)
			case !allowed && !slices.Contains([]string{"AG001", "AG003", "23514"}, sqlState(err)):
				t.Errorf("%s -> %s refused with %v, want a guard's refusal", from, to, err)
			}
		}
		// The composite moves need their witness: without the evidence
		// (or the ack) the CHECK constraints on those columns refuse them,
		// which is why the lifecycle's guard lists them as plain edges.
		for edge := range composite {
			if edge.From != from {
				continue
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tx.Exec(ctx, `UPDATE operations SET state = $2, log_count = log_count + 1, waiting = NULL WHERE id = $1`, id, string(edge.To))
			_ = tx.Rollback(ctx)
			if err == nil {
				t.Errorf("%s -> %s without its witness was accepted", edge.From, edge.To)
			} else if sqlState(err) != "23514" {
				t.Errorf("%s -> %s without its witness refused with %v, want the CHECK's 23514", edge.From, edge.To, err)
			}
		}
	}

	// The log's own guard holds every pair, received's included: a step
	// appended by hand off the table is refused.
	op := newOperation("log-pairs")
	createPending(t, l, op)
	for _, from := range gate.States {
		for _, to := range gate.States {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tx.Exec(ctx, `INSERT INTO transitions (operation_id, seq, from_state, to_state, at, fence)
				VALUES ($1, 99, $2, $3, now(), 1)`, op.ID, string(from), string(to))
			_ = tx.Rollback(ctx)
			if allowed := gate.CanTransition(from, to); allowed != (err == nil) {
				t.Errorf("logging %s -> %s: allowed %v, err %v", from, to, allowed, err)
			}
		}
	}
}

// The write path refuses a change off the lifecycle before it reaches the
// server, and the server would refuse it too: every pair the table does not
// allow, as the one step of a change from a stored state.
func TestWritePathRefusesEveryMoveOffTheLifecycle(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	for _, from := range gate.States {
		if from == gate.StateReceived || from == gate.StateConflicting {
			continue
		}
		id := storable(t, l, pool, from)
		before := mustGet(t, l, id)
		for _, to := range gate.States {
			if to == from || gate.CanTransition(from, to) {
				continue
			}
			step := []gate.Step{{Transition: gate.Transition{From: from, To: to}, Reason: "off the table"}}
			w := gate.Intervening(&gate.Operation{ID: id, State: from}, gate.Lease{Owner: "x", Fence: before.Fence + 1})
			c := gate.ResolveChange(w, step, &gate.Intervention{Resolution: gate.Resolution{Kind: gate.ResolveAbandon, Reason: "r", Actor: "a"},
				From: from, To: to, Fence: before.Fence + 1, At: t0}, 0, "", nil, "off the table", t0)
			if err := l.Write(ctx, c); !errors.Is(err, storage.ErrRefused) {
				t.Errorf("%s -> %s through the write path: %v, want ErrRefused", from, to, err)
			}
			// Sent around the write path's own check, the server refuses it
			// too, and nothing of it lands.
			if errs := l.SendBatch([]*gate.Change{c}); errs[0] == nil {
				t.Errorf("%s -> %s sent straight to the server was accepted", from, to)
			}
		}
		after := mustGet(t, l, id)
		if after.State != before.State || after.Fence != before.Fence || len(after.Events) != len(before.Events) ||
			len(after.Interventions) != len(before.Interventions) {
			t.Errorf("%s: refused changes left traces: %+v", from, after.Operation)
		}
	}
}

// The ledger refuses bad evidence by itself, whoever writes it: these go
// around the Go code with raw SQL. Each names the guard that answers.
func TestLedgerRefusesRawSQL(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	op := newOperation("raw")
	createPending(t, l, op)
	done := newOperation("raw-done")
	createPending(t, l, done)
	must(t, l.Write(ctx, confirm(t, done, "res-raw", t0)))
	must(t, l.Write(ctx, acked(t, done, 1, t0)))
	redelivered := newOperation("raw-redelivered")
	createPending(t, l, redelivered)
	if _, _, err := l.Claim(ctx, creating(t, redelivered, "m-2", t0)); err != nil {
		t.Fatal(err)
	}
	must(t, l.AnswerDelivery(ctx, redelivered.ID, &gate.Answer{N: 2, Decision: gate.Nack, Reason: "held"}))
	rec := *op
	rec.ID, rec.Fingerprint = "op_raw-conflict", "v1:other"
	if _, err := l.RecordConflict(ctx, &gate.Conflict{Original: op, Record: &rec, At: t0, Delivery: delivery("m-c", 1, t0)}); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name, sql, state string
	}{
		{"a state outside the nine", `UPDATE operations SET state = 'processed' WHERE id = 'op_raw'`, "23514"},
		{"a fence going down", `UPDATE operations SET fence = 0, log_count = log_count + 1 WHERE id = 'op_raw'`, "AG002"},
		{"a new fence on the common path", `UPDATE operations SET fence = 2 WHERE id = 'op_raw-redelivered'`, "AG002"},
		{"an identity rewrite", `UPDATE operations SET fingerprint = 'other' WHERE id = 'op_raw'`, "AG003"},
		{"the first delivery rewritten", `UPDATE operations SET message_id = 'other' WHERE id = 'op_raw'`, "AG003"},
		{"the trace id rewritten", `UPDATE operations SET trace_id = 'other' WHERE id = 'op_raw'`, "AG003"},
		{"evidence rewritten", `UPDATE operations SET result_id = 'forged' WHERE id = 'op_raw-done'`, "AG003"},
		{"an ack rewritten", `UPDATE operations SET acked_at = now() WHERE id = 'op_raw-done'`, "AG003"},
		{"a second answer for the first delivery", `UPDATE operations SET d1_decision = 'nack' WHERE id = 'op_raw-done'`, "AG003"},
		{"the first attempt finished again", `UPDATE operations SET a1_outcome = 'terminal' WHERE id = 'op_raw-done'`, "AG003"},
		{"the first attempt's start rewritten", `UPDATE operations SET a1_contract = 'other' WHERE id = 'op_raw-done'`, "AG003"},
		{"the first attempt restarted", `UPDATE operations SET a1_started_at = now() WHERE id = 'op_raw-done'`, "AG003"},
		// The rules of one column are their domains'.
		{"a negative count", `UPDATE operations SET checks = -1 WHERE id = 'op_raw'`, "23514"},
		{"an outcome outside the five", `UPDATE operations SET a1_outcome = 'done' WHERE id = 'op_raw'`, "23514"},
		{"a decision outside the four", `UPDATE operations SET d1_decision = 'maybe' WHERE id = 'op_raw'`, "23514"},
		{"no delivery counted", `UPDATE operations SET delivery_count = 0 WHERE id = 'op_raw'`, "23514"},
		{"a second answer for a further delivery", `UPDATE deliveries SET decision = 'ack' WHERE operation_id = 'op_raw-redelivered'`, "AG003"},
		{"a further delivery rewritten", `UPDATE deliveries SET source = 'other' WHERE operation_id = 'op_raw-redelivered'`, "AG003"},
		{"a move off the common path without its log", `UPDATE operations SET state = 'terminal_failure', waiting = 'terminal_failure'
			WHERE id = 'op_raw'`, "AG004"},
		// The row's constraints are checked before the guards that run
		// after the write, so this one is refused by its constraint.
		{"a conflict record moving on", `UPDATE operations SET state = 'terminal_failure', waiting = 'terminal_failure',
			log_count = log_count + 1 WHERE id = 'op_raw-conflict'`, "23514"},
		{"a counter going down", `UPDATE operations SET delivery_count = delivery_count - 1 WHERE id = 'op_raw-redelivered'`, "AG002"},
		{"a record born past its first step", `INSERT INTO operations (created_at, retain_until, fingerprint_version, id, route,
			tenant, key_source, key, scope_key, fingerprint, shape, dead_letter_policy, contract_version, idempotency_key,
			broker, source, message_id, fence, state, updated_at, evidence_at, result_id)
			VALUES (now(), now(), 1, 'op_x', 'r', 't', 'message_id', 'x', 'x', 'f', 'unsafe', 'broker', 'c', 'k',
			'pubsub', 's', 'm', 1, 'ack_pending', now(), now(), 'r')`, "AG001"},
		{"a record born under another fence", `INSERT INTO operations (created_at, retain_until, fingerprint_version, id, route,
			tenant, key_source, key, scope_key, fingerprint, shape, dead_letter_policy, contract_version, idempotency_key,
			broker, source, message_id, fence, state, updated_at)
			VALUES (now(), now(), 1, 'op_y', 'r', 't', 'message_id', 'y', 'y', 'f', 'unsafe', 'broker', 'c', 'k',
			'pubsub', 's', 'm', 7, 'pending_effect', now())`, "AG001"},
		{"a log rewritten", `UPDATE transitions SET reason = 'edited'`, "AG003"},
		{"a log entry deleted", `DELETE FROM transitions`, "AG003"},
		{"a further delivery deleted", `DELETE FROM deliveries`, "AG003"},
		{"a delete before retention ends", `DELETE FROM operations WHERE id = 'op_raw'`, "AG003"},
	}
	// The conflict record and the raw operation each have a log entry to
	// rewrite or delete: the conflict's creation is derived, so one is made.
	if _, err := pool.Exec(ctx, `UPDATE operations SET state = 'reserved', waiting = 'open', log_count = 1 WHERE id = 'op_raw'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO transitions (operation_id, seq, from_state, to_state, at, fence)
		VALUES ('op_raw', 1, 'pending_effect', 'reserved', now(), 1)`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		_, err := pool.Exec(ctx, tc.sql)
		if got := sqlState(err); got != tc.state {
			t.Errorf("%s: err = %v (SQLSTATE %q), want SQLSTATE %s", tc.name, err, got, tc.state)
		}
	}
	// After all that, the records are what the ledger wrote.
	if got := mustGet(t, l, op.ID); got.State != gate.StateReserved || got.Fence != 1 || len(got.Deliveries) != 1 {
		t.Fatalf("refused writes left traces: %+v", got.Operation)
	}
	if got := mustGet(t, l, done.ID); got.ResultID != "res-raw" || got.Deliveries[0].Decision != gate.Ack {
		t.Fatalf("refused writes left traces on the acknowledged record: %+v", got.Operation)
	}
}

// Evidence goes only when its retention has run out, and then all of it
// goes: the side rows' guards let the cascade through and nothing else.
func TestRetentionDeleteCascades(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	op := newOperation("old")
	createPending(t, l, op)
	if _, _, err := l.Claim(ctx, creating(t, op, "m-2", t0)); err != nil {
		t.Fatal(err)
	}
	must(t, l.Write(ctx, gate.TerminalChange(settling(op.ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeTerminal}, 1),
		steps(t, gate.StatePendingEffect, gate.StateTerminalFailure), &gate.DeadLetter{Reason: "no"}, "no", t0)))
	if _, err := pool.Exec(ctx, `UPDATE operations SET retain_until = now() - interval '1 second' WHERE id = $1`, op.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM operations WHERE id = $1`, op.ID); err != nil {
		t.Fatalf("delete after retention: %v", err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM transitions) + (SELECT count(*) FROM deliveries)
		+ (SELECT count(*) FROM attempts) + (SELECT count(*) FROM dead_letters)`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d evidence rows outlived their operation", left)
	}
	if _, err := l.Get(ctx, op.ID); !errors.Is(err, gate.ErrNotFound) {
		t.Fatalf("Get after delete: %v, want ErrNotFound", err)
	}
}

// A ledger from before the baseline is recognized and refused, never
// migrated over: its tables are not this build's.
func TestALedgerFromBeforeTheBaselineIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.DatabaseURL(t)
	pool, err := storage.OpenPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE FUNCTION ackgate_write(c jsonb) RETURNS text LANGUAGE sql AS $$ SELECT 'ok' $$`); err != nil {
		t.Fatal(err)
	}
	if applied, err := storage.MigrateReport(ctx, url); !errors.Is(err, storage.ErrPreBaseline) || len(applied) != 0 {
		t.Fatalf("migrating a pre-baseline ledger: %v, applied %v; want ErrPreBaseline and nothing", err, applied)
	}
	if current, err := storage.SchemaCurrent(ctx, pool); err != nil || current {
		t.Fatalf("SchemaCurrent of a pre-baseline ledger = %v, %v; want false", current, err)
	}
	var tables int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("%d tables created in a pre-baseline ledger (%v)", tables, err)
	}
}
