package storage_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
)

// The lane indexes read waiting, which the row guard derives from state
// whoever writes the row: the ledger's own changes, and a writer that
// tries to set it by hand.
func TestWaitingFollowsState(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	at := t0.Add(time.Minute)
	ops := map[string]*gate.Operation{}
	for _, name := range []string{"open", "acked", "indeterminate", "terminal"} {
		ops[name] = newOperation("waiting-" + name)
		createPending(t, l, ops[name])
	}
	confirmed := &gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "r"}
	must(t, l.Write(ctx, gate.ConfirmChange(settling(ops["acked"].ID, gate.StatePendingEffect, 1, confirmed, 0),
		steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "r", "confirmed", at)))
	must(t, l.Write(ctx, gate.AckedChange(ops["acked"].ID, gate.StateAckPending, 1,
		steps(t, gate.StateAckPending, gate.StateAcknowledged), at)))
	must(t, l.Write(ctx, gate.IndeterminateChange(
		settling(ops["indeterminate"].ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown}, 0),
		steps(t, gate.StatePendingEffect, gate.StateEffectIndeterminate), gate.LaneOperator, "lost", at)))
	must(t, l.Write(ctx, gate.TerminalChange(
		settling(ops["terminal"].ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeTerminal, StatusCode: 422}, 0),
		steps(t, gate.StatePendingEffect, gate.StateTerminalFailure), &gate.DeadLetter{Reason: "422"}, "422", at)))

	// Hand-written values do not stick: the guard writes the derived one.
	if _, err := pool.Exec(ctx, `UPDATE operations SET waiting = 'terminal_failure'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE operations SET waiting = NULL`); err != nil {
		t.Fatal(err)
	}
	want := map[string]*string{"open": ptr("open"), "acked": nil, "indeterminate": ptr("effect_indeterminate"),
		"terminal": ptr("terminal_failure")}
	for name, w := range want {
		var got *string
		if err := pool.QueryRow(ctx, `SELECT waiting FROM operations WHERE id = $1`, ops[name].ID).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if (got == nil) != (w == nil) || (got != nil && *got != *w) {
			t.Errorf("%s: waiting %v, want %v", name, deref(got), deref(w))
		}
	}
}

// A fresh message's confirmation changes no indexed value of its
// operation, and its delivery's answer none of its delivery: both updates
// are heap-only, with no new index entry. The ack takes the operation out
// of the open work and so cannot be.
func TestConfirmationAndAnswerAreHOT(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := migratedURL(t)
	pool, err := storage.OpenPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	l := storage.NewLedger(pool)
	op := newOperation("hot")
	w := gate.Claiming(nil, op, gate.Lease{Owner: "owner-a", Fence: 1, Expires: t0.Add(30 * time.Second)},
		&gate.Delivery{Broker: gate.BrokerPubSub, Source: "s", MessageID: "m-hot", ReceivedAt: t0, Owner: "owner-a"}, "")
	must(t, l.Write(ctx, gate.StartChange(w, steps(t, "", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect),
		&gate.Attempt{N: 1, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, Fence: 1, StartedAt: t0},
		"new operation", t0)))
	at := t0.Add(time.Second)
	confirm := gate.Settling(&gate.Operation{ID: op.ID, State: gate.StatePendingEffect}, 1,
		&gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "r"},
		&gate.Answer{Owner: "owner-a", Decision: gate.Ack, Reason: "confirmed"}, gate.LeaseFacts{Deadline: at})
	must(t, l.Write(ctx, gate.ConfirmChange(confirm,
		steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "r", "confirmed", at)))
	must(t, l.Write(ctx, gate.AckedChange(op.ID, gate.StateAckPending, 1,
		steps(t, gate.StateAckPending, gate.StateAcknowledged), at)))
	rec := mustGet(t, l, op.ID)
	if rec.State != gate.StateAcknowledged || rec.Deliveries[0].Decision != gate.Ack {
		t.Fatalf("after the ack: %s, delivery %+v", rec.State, rec.Deliveries[0])
	}
	// A backend publishes its table counts when it exits.
	pool.Close()

	obs, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close(ctx)
	type counts struct{ upd, hot int64 }
	read := func(table string) counts {
		var c counts
		if err := obs.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = $1`,
			table).Scan(&c.upd, &c.hot); err != nil {
			t.Fatal(err)
		}
		return c
	}
	want := map[string]counts{"operations": {2, 1}, "deliveries": {1, 1}}
	got := map[string]counts{}
	testenv.Eventually(t, testenv.StepTimeout, func() bool {
		// Each statement is a transaction of its own, so it reads fresh counts.
		got = map[string]counts{"operations": read("operations"), "deliveries": read("deliveries")}
		return got["operations"].upd >= 2 && got["deliveries"].upd >= 1
	}, func() string { return "the writers' counts never arrived" })
	for table, w := range want {
		if got[table] != w {
			t.Errorf("%s: %d updates, %d of them HOT; want %d and %d", table, got[table].upd, got[table].hot, w.upd, w.hot)
		}
	}
}

func ptr(s string) *string { return &s }

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}

// A change that is not a claim locks its row through the primary key. A
// new ledger has no statistics, and a plan cached then that reached the row
// through operations_scope_key instead would read that whole index for
// every change until the first ANALYZE. One session, so that its cached
// plan is the one every change after the fifth uses. Both ways a batch can
// go: ackgate_write's plans may turn generic after five calls, and
// ackgate_write_batch's are generic from the first.
func TestChangesLockTheirRowByPrimaryKey(t *testing.T) {
	t.Parallel()
	t.Run("change by change", func(t *testing.T) { changesLockByPrimaryKey(t, false) })
	t.Run("set-based", func(t *testing.T) { changesLockByPrimaryKey(t, true) })
}

func changesLockByPrimaryKey(t *testing.T, setBased bool) {
	t.Parallel()
	ctx := context.Background()
	url := migratedURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	l := storage.NewLedger(pool)
	if setBased {
		l.SetBasedFrom(1)
	}
	for i := range 8 {
		op := newOperation(fmt.Sprintf("lock-%d", i))
		createPending(t, l, op)
		must(t, l.Write(ctx, gate.RetryLaterChange(settling(op.ID, gate.StatePendingEffect, 1,
			&gate.Attempt{N: 1, Outcome: gate.OutcomeRetryable, StatusCode: 503}, 0), "503", t0)))
	}
	if p := l.GroupCommitPaths(); setBased && (p.SetBased != 16 || p.FellBack != 0) {
		t.Fatalf("set-based: batches went %+v, want all 16 set-based", p)
	}
	pool.Close() // its backend publishes its counts as it exits

	obs, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close(ctx)
	var pkey, scope int64
	testenv.Eventually(t, testenv.StepTimeout, func() bool {
		err := obs.QueryRow(ctx, `SELECT
			(SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'operations_pkey'),
			(SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'operations_scope_key')`).Scan(&pkey, &scope)
		return err == nil && pkey >= 8
	}, func() string { return fmt.Sprintf("primary key read %d times", pkey) })
	if scope != 0 {
		t.Fatalf("the scope key index was read %d times by changes that name their row by id", scope)
	}
}
