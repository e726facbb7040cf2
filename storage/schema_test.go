package storage_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
		t.Fatalf("SchemaCurrent with 0003 missing = %v, %v; want false, nil", current, err)
	}
}

func TestAllowedTransitionsEqualGateTable(t *testing.T) {
	t.Parallel()
	_, pool := newLedger(t)
	ctx := context.Background()

	rows, err := pool.Query(ctx, `SELECT coalesce(from_state, ''), to_state FROM allowed_transitions`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (gate.Transition, error) {
		var tr gate.Transition
		return tr, r.Scan(&tr.From, &tr.To)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := append([]gate.Transition{{From: "", To: gate.StateReceived}}, gate.Transitions()...)
	key := func(tr gate.Transition) string { return string(tr.From) + "->" + string(tr.To) }
	gotKeys, wantKeys := keys(got, key), keys(want, key)
	if !slices.Equal(gotKeys, wantKeys) {
		t.Fatalf("allowed_transitions differs from gate.Transitions() plus the edge into received\n got: %v\nwant: %v", gotKeys, wantKeys)
	}

	// The state domain holds exactly the nine.
	for _, s := range gate.States {
		if _, err := pool.Exec(ctx, `SELECT $1::text::ackgate_state`, string(s)); err != nil {
			t.Errorf("state %s refused by the domain: %v", s, err)
		}
	}
	if _, err := pool.Exec(ctx, `SELECT 'processed'::ackgate_state`); err == nil {
		t.Error("the domain accepted a tenth state, 'processed'")
	}
}

func keys[T any](in []T, key func(T) string) []string {
	out := make([]string, len(in))
	for i, v := range in {
		out[i] = key(v)
	}
	slices.Sort(out)
	return out
}

// The ledger must refuse bad evidence by itself, whoever writes it: these go
// around the Go code with raw SQL.
func TestLedgerRefusesRawSQL(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	op := newOperation("raw")
	createPending(t, l, op)

	cases := []struct {
		name, sql, state string
	}{
		{"illegal transition", `UPDATE operations SET state = 'acknowledged' WHERE state = 'pending_effect'`, "AG001"},
		{"fence decrease", `UPDATE operations SET fence = fence - 1 WHERE id = 'op_raw'`, "AG002"},
		{"identity rewrite", `UPDATE operations SET fingerprint = 'other' WHERE id = 'op_raw'`, "AG003"},
		{"legal edge but unlogged", `UPDATE operations SET state = 'effect_confirmed' WHERE id = 'op_raw'`, "AG004"},
		{"log rewrite", `UPDATE transitions SET reason = 'edited' WHERE operation_id = 'op_raw'`, "AG003"},
		{"log delete", `DELETE FROM transitions WHERE operation_id = 'op_raw'`, "AG003"},
		{"delivery rewrite", `UPDATE deliveries SET decision = 'ack'`, "AG003"}, // already answered (nack)
		{"delivery field rewrite", `UPDATE deliveries SET source = 'other'`, "AG003"},
		{"delivery delete", `DELETE FROM deliveries`, "AG003"},
		{"log entry that does not continue the log",
			`INSERT INTO transitions (operation_id, from_state, to_state, at, fence)
			 VALUES ('op_raw', 'received', 'reserved', now(), 1)`, "AG005"},
		{"log entry off the table",
			`INSERT INTO transitions (operation_id, from_state, to_state, at, fence)
			 VALUES ('op_raw', 'pending_effect', 'acknowledged', now(), 1)`, "AG001"},
		// A row may be inserted in any state, but its log must begin at
		// received and reach that state by commit: with no log, it cannot.
		{"record born past received",
			`INSERT INTO operations (id, scope_key, tenant, route, key_source, key, fingerprint,
				fingerprint_version, state, shape, dead_letter_policy, contract_version, idempotency_key,
				created_at, updated_at, retain_until)
			 VALUES ('op_x', 'x', 't', 'r', 'message_id', 'x', 'f', 1, 'effect_confirmed', 'unsafe',
				'broker', 'c', 'k', now(), now(), now())`, "AG004"},
		{"delete before retention ends", `DELETE FROM operations WHERE id = 'op_raw'`, "AG003"},
		{"state outside the nine", `UPDATE operations SET state = 'processed'`, "23514"},
	}
	for _, tc := range cases {
		// Raw SQL through pgx's simple path commits at once, so the deferred
		// check runs before Exec returns.
		_, err := pool.Exec(ctx, tc.sql)
		if got := sqlState(err); got != tc.state {
			t.Errorf("%s: err = %v (SQLSTATE %q), want SQLSTATE %s", tc.name, err, got, tc.state)
		}
	}

	// After all that, the record is exactly what createPending wrote.
	rec := mustGet(t, l, op.ID)
	if rec.State != gate.StatePendingEffect || rec.Fence != 1 || len(rec.Events) != 3 || len(rec.Deliveries) != 1 {
		t.Fatalf("refused writes left traces: state %s fence %d, %d events, %d deliveries",
			rec.State, rec.Fence, len(rec.Events), len(rec.Deliveries))
	}
}

// Evidence goes only when its retention has run out, and then all of it goes:
// the log's append-only guard lets the cascade through and nothing else.
func TestRetentionDeleteCascades(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	createPending(t, l, newOperation("old"))

	if _, err := pool.Exec(ctx, `UPDATE operations SET retain_until = now() - interval '1 second' WHERE id = 'op_old'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM operations WHERE id = 'op_old'`); err != nil {
		t.Fatalf("delete after retention: %v", err)
	}
	left := countRows(t, pool, `SELECT (SELECT count(*) FROM transitions) + (SELECT count(*) FROM deliveries) + (SELECT count(*) FROM attempts)`)
	if left != 0 {
		t.Fatalf("%d evidence rows outlived their operation", left)
	}
	if _, err := l.Get(ctx, "op_old"); !errors.Is(err, gate.ErrNotFound) {
		t.Fatalf("Get after delete: %v, want ErrNotFound", err)
	}
}

func countRows(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A lease-taking delivery is written before its answer is known; it may be
// answered once, by its owner token, and is append-only from then on.
func TestDeliveryIsAnsweredOnce(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	op := newOperation("answer")
	d := delivery("m-1", t0)
	d.Decision, d.Owner = "", "owner-a"
	w := gate.Claiming(nil, op, gate.Lease{Owner: "owner-a", Fence: 1, Expires: t0.Add(30 * time.Second)}, d, "")
	err := l.Write(ctx, gate.StartChange(w,
		steps(t, "", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect), nil, "new", t0))
	if err != nil {
		t.Fatal(err)
	}
	// Another owner's answer does not touch this row.
	must(t, l.AnswerDelivery(ctx, op.ID, &gate.Answer{Owner: "owner-b", Decision: gate.Ack}))
	if got := mustGet(t, l, op.ID).Deliveries[0]; got.Decision != "" {
		t.Fatalf("another owner answered the delivery: %+v", got)
	}
	must(t, l.AnswerDelivery(ctx, op.ID, &gate.Answer{Owner: "owner-a", Decision: gate.Nack, Reason: "fenced"}))
	got := mustGet(t, l, op.ID).Deliveries[0]
	if got.Decision != gate.Nack || got.Reason != "fenced" || got.Owner != "owner-a" || got.MessageID != "m-1" {
		t.Fatalf("answered delivery = %+v", got)
	}
	// Answered once; a second answer finds nothing to answer.
	must(t, l.AnswerDelivery(ctx, op.ID, &gate.Answer{Owner: "owner-a", Decision: gate.Ack}))
	if got := mustGet(t, l, op.ID).Deliveries[0]; got.Decision != gate.Nack {
		t.Fatalf("delivery answered twice: %+v", got)
	}
	for name, sql := range map[string]string{
		"re-answer":             `UPDATE deliveries SET decision = 'ack'`,
		"rewrite another field": `UPDATE deliveries SET message_id = 'other'`,
	} {
		if _, err := pool.Exec(ctx, sql); sqlState(err) != "AG003" {
			t.Errorf("%s: err = %v, want SQLSTATE AG003", name, err)
		}
	}
}
