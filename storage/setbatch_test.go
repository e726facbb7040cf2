package storage_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
)

// A batch change: what group commit sends, and the answer it should get.
type batchChange struct {
	id   string
	wire []byte
	want error
}

// batchFixture builds the wire forms of the changes the gateway sends, with
// fixed times so two ledgers receive the same bytes.
type batchFixture struct{ t *testing.T }

func (f batchFixture) wire(c *gate.Change, want error) batchChange {
	f.t.Helper()
	return batchChange{id: c.OperationID, wire: encodeForTest(f.t, c), want: want}
}

func (f batchFixture) deliveryOnly(id, messageID string, at time.Time, want error) batchChange {
	f.t.Helper()
	d := delivery(messageID, at)
	d.OperationID, d.Decision, d.Reason = id, gate.Ack, "duplicate"
	w, err := storage.EncodeDeliveryOnly(d)
	if err != nil {
		f.t.Fatal(err)
	}
	return batchChange{id: id, wire: w, want: want}
}

// owned is a delivery taking a lease as owner, which its settle answers.
func owned(messageID, owner string, at time.Time) *gate.Delivery {
	d := delivery(messageID, at)
	d.Owner, d.Decision, d.TraceID = owner, "", "trace-"+owner
	return d
}

// create is a claim that creates op and opens its first effect attempt.
func (f batchFixture) create(op *gate.Operation, at time.Time, want error) batchChange {
	w := gate.Claiming(nil, op, gate.Lease{Owner: "owner-1", Fence: 1, Expires: at.Add(30 * time.Second)},
		owned("m-"+op.Key, "owner-1", at), "trace-1")
	return f.wire(gate.StartChange(w, steps(f.t, "", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect),
		&gate.Attempt{N: 1, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, StartedAt: at},
		"new operation", at), want)
}

// takeOver is owner claiming the existing id under fence and opening attempt n.
func (f batchFixture) takeOver(id string, from gate.State, fence int64, owner string, n int, at time.Time, want error) batchChange {
	w := claiming(id, from, fence, owner, at.Add(30*time.Second), owned("m-"+owner, owner, at))
	return f.wire(gate.StartChange(w, steps(f.t, from, gate.StateReserved, gate.StatePendingEffect),
		&gate.Attempt{N: n, Kind: gate.AttemptEffect, IdempotencyKey: "ik-" + id, StartedAt: at},
		"taken over", at), want)
}

// confirm is the holder of fence finishing attempt n with a confirmation.
func (f batchFixture) confirm(id string, from gate.State, fence int64, owner string, n int, at time.Time, want error) batchChange {
	w := gate.Settling(&gate.Operation{ID: id, State: from}, fence,
		&gate.Attempt{N: n, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "r-" + id, FinishedAt: &at},
		&gate.Answer{Owner: owner, Decision: gate.Ack, Reason: "confirmed"},
		gate.LeaseFacts{Extensions: 1, Deadline: at.Add(time.Minute)})
	return f.wire(gate.ConfirmChange(w, steps(f.t, from, gate.StateEffectConfirmed, gate.StateAckPending),
		"r-"+id, "confirmed", at), want)
}

func (f batchFixture) acked(id string, fence int64, at time.Time, want error) batchChange {
	return f.wire(gate.AckedChange(id, gate.StateAckPending, fence,
		steps(f.t, gate.StateAckPending, gate.StateAcknowledged), at), want)
}

// ledgerRows is every row of the evidence tables, column for column, but
// for the deliveries' own serial ids.
func ledgerRows(t *testing.T, pool *pgxpool.Pool) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, q := range []struct{ table, order string }{
		{"operations", "id"}, {"transitions", "operation_id, seq"}, {"deliveries", "operation_id, id"},
		{"attempts", "operation_id, n"}, {"dead_letters", "operation_id"},
	} {
		rows, err := pool.Query(context.Background(),
			`SELECT (to_jsonb(t) - CASE WHEN $1 = 'deliveries' THEN 'id' ELSE '' END)::text FROM `+q.table+` t ORDER BY `+q.order, q.table)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out[q.table] = append(out[q.table], s)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// sendChanges sends one batch and checks each change's answer.
func sendChanges(t *testing.T, l *storage.Ledger, name string, batch []batchChange) []error {
	t.Helper()
	ids, wires := make([]string, len(batch)), make([][]byte, len(batch))
	for i, c := range batch {
		ids[i], wires[i] = c.id, c.wire
	}
	errs := l.SendRaw(ids, wires)
	for i, c := range batch {
		if (c.want == nil) != (errs[i] == nil) || (c.want != nil && !errors.Is(errs[i], c.want)) {
			t.Errorf("%s: change %d (%s): %v, want %v", name, i, c.id, errs[i], c.want)
		}
	}
	return errs
}

func pathsSince(l *storage.Ledger, before storage.BatchPaths) storage.BatchPaths {
	p := l.GroupCommitPaths()
	return storage.BatchPaths{SetBased: p.SetBased - before.SetBased, FellBack: p.FellBack - before.FellBack,
		PerChange: p.PerChange - before.PerChange}
}

// The set-based path writes what ackgate_write writes: the same batches,
// creating, taking over, settling every way, acking and refused every way,
// leave the same rows, column for column, and the same answers as the same
// batches sent change by change into a ledger of their own.
func TestSetBasedBatchesWriteWhatPerChangeWrites(t *testing.T) {
	t.Parallel()
	f := batchFixture{t}
	ops := map[string]*gate.Operation{}
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "t"} {
		ops[n] = newOperation("eq-" + n)
	}
	id := func(n string) string { return ops[n].ID }
	at1, at2, at3 := t0.Add(time.Second+123456*time.Nanosecond), t0.Add(2*time.Minute), t0.Add(3*time.Minute)
	lost := at2.Add(-time.Second)

	dupID := newOperation("eq-t-again")
	dupID.ID = id("t")
	straightToTerminal := func() batchChange {
		w := gate.Claiming(nil, ops["t"], gate.Lease{Owner: "owner-1", Fence: 1, Expires: at1.Add(time.Minute)},
			owned("m-t", "owner-1", at1), "trace-t")
		return f.wire(gate.TerminalChange(w, steps(t, "", gate.StateReceived, gate.StateTerminalFailure),
			&gate.DeadLetter{Reason: "poison", At: at1}, "refused at the door", at1), nil)
	}
	settle := func(n string, fin *gate.Attempt, ans *gate.Answer, facts gate.LeaseFacts) gate.Writer {
		return gate.Settling(&gate.Operation{ID: id(n), State: gate.StatePendingEffect}, 1, fin, ans, facts)
	}
	batches := [][]batchChange{
		{
			f.create(ops["a"], at1, nil), f.create(ops["b"], at1, nil), f.create(ops["c"], at1, nil),
			f.create(ops["d"], at1, nil), f.create(ops["e"], at1, nil), f.create(ops["f"], at1, nil),
			f.create(ops["g"], at1, nil), f.create(ops["h"], at1, nil), straightToTerminal(),
		},
		{
			f.confirm(id("a"), gate.StatePendingEffect, 1, "owner-1", 1, at2, nil),
			f.wire(gate.IndeterminateChange(settle("b",
				&gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown, Reason: "timeout", FinishedAt: &at2},
				&gate.Answer{Owner: "owner-1", Decision: gate.Nack},
				gate.LeaseFacts{Extensions: 2, Deadline: at2, LostAt: &lost}),
				steps(t, gate.StatePendingEffect, gate.StateEffectIndeterminate), gate.LaneOperator, "unknown", at2), nil),
			f.wire(gate.TerminalChange(settle("c",
				&gate.Attempt{N: 1, Outcome: gate.OutcomeTerminal, StatusCode: 422, Reason: "bad", FinishedAt: &at2},
				&gate.Answer{Owner: "owner-1", Decision: gate.Ack, Reason: "dead-lettered"}, gate.LeaseFacts{Deadline: at2}),
				steps(t, gate.StatePendingEffect, gate.StateTerminalFailure), &gate.DeadLetter{Reason: "422", At: at2},
				"terminal", at2), nil),
			f.wire(gate.RetryLaterChange(settle("d",
				&gate.Attempt{N: 1, Outcome: gate.OutcomeRetryable, StatusCode: 503, FinishedAt: &at2},
				&gate.Answer{Owner: "owner-1", Decision: gate.Nack, Reason: "retry"}, gate.LeaseFacts{Deadline: at2}),
				"retry later", at2), nil),
			f.takeOver(id("e"), gate.StatePendingEffect, 2, "owner-2", 2, at2, nil),
			f.confirm(id("f"), gate.StatePendingEffect, 0, "owner-1", 1, at2, gate.ErrFenced),
			f.confirm(id("g"), gate.StateReserved, 1, "owner-1", 1, at2, gate.ErrStateChanged),
			f.deliveryOnly(id("h"), "m-h-again", at2, nil),
			f.confirm("op_eq-missing", gate.StatePendingEffect, 1, "owner-1", 1, at2, gate.ErrNotFound),
			f.deliveryOnly("op_eq-missing-d", "m-x", at2, gate.ErrNotFound),
			f.create(dupID, at2, gate.ErrExists),
		},
		{
			f.acked(id("a"), 1, at3, nil),
			f.confirm(id("e"), gate.StatePendingEffect, 2, "owner-2", 2, at3, nil),
			f.takeOver(id("d"), gate.StatePendingEffect, 2, "owner-3", 2, at3, nil),
			f.confirm(id("g"), gate.StatePendingEffect, 1, "owner-1", 1, at3, nil),
			f.takeOver(id("f"), gate.StatePendingEffect, 1, "owner-9", 2, at3, gate.ErrFenced),
			f.takeOver(id("c"), gate.StatePendingEffect, 3, "owner-9", 2, at3, gate.ErrStateChanged),
		},
	}

	set, setPool := newLedger(t)
	set.SetBasedFrom(1)
	perChange, perChangePool := newLedger(t)
	perChange.SendPerChangeOnly()
	for i, b := range batches {
		name := string(rune('1' + i))
		got, want := sendChanges(t, set, "set-based batch "+name, b), sendChanges(t, perChange, "per-change batch "+name, b)
		for j := range b {
			if answerWord(got[j]) != answerWord(want[j]) {
				t.Errorf("batch %s change %d: set-based %v, per-change %v", name, j, got[j], want[j])
			}
		}
	}
	if p := set.GroupCommitPaths(); p != (storage.BatchPaths{SetBased: len(batches)}) {
		t.Errorf("set-based ledger: %+v, want every batch set-based", p)
	}
	if p := perChange.GroupCommitPaths(); p != (storage.BatchPaths{PerChange: len(batches)}) {
		t.Errorf("per-change ledger: %+v", p)
	}
	setRows, perChangeRows := ledgerRows(t, setPool), ledgerRows(t, perChangePool)
	for table, want := range perChangeRows {
		if len(want) == 0 {
			t.Errorf("%s: the fixture wrote nothing to compare", table)
		}
		got := setRows[table]
		if len(got) != len(want) {
			t.Errorf("%s: %d rows set-based, %d per change", table, len(got), len(want))
			continue
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s row %d:\nset-based  %s\nper change %s", table, i, got[i], want[i])
			}
		}
	}
}

// answerWord is the sentinel an answer carries, to compare two paths'.
func answerWord(err error) string {
	for _, s := range []error{gate.ErrNotFound, gate.ErrFenced, gate.ErrStateChanged, gate.ErrExists, storage.ErrRefused} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	if err != nil {
		return "error: " + err.Error()
	}
	return "ok"
}

// Refusals that are answers, not errors, stay in the set-based statement:
// the batch is not sent again, and the changes beside them are written.
func TestSetBasedBatchRefusesOnlyItsOwn(t *testing.T) {
	t.Parallel()
	f := batchFixture{t}
	l, _ := newLedger(t)
	l.SetBasedFrom(1)
	ops := map[string]*gate.Operation{}
	for _, n := range []string{"ok-1", "stale", "moved", "ok-2", "taken"} {
		ops[n] = newOperation("ref-" + n)
		createPending(t, l, ops[n])
	}
	at := t0.Add(time.Minute)
	// A second delivery of a message whose first created the operation:
	// the same id, which the gate derives from the same scope key.
	dup := newOperation("ref-taken")
	dup.Fingerprint = "v1:fp-other"
	fresh := newOperation("ref-fresh")
	before := l.GroupCommitPaths()
	sendChanges(t, l, "batch", []batchChange{
		f.confirm(ops["ok-1"].ID, gate.StatePendingEffect, 1, "owner-a", 1, at, nil),
		f.confirm(ops["stale"].ID, gate.StatePendingEffect, 0, "owner-a", 1, at, gate.ErrFenced),
		f.confirm(ops["moved"].ID, gate.StateEffectIndeterminate, 1, "owner-a", 1, at, gate.ErrStateChanged),
		f.confirm(ops["ok-2"].ID, gate.StatePendingEffect, 1, "owner-a", 1, at, nil),
		f.confirm("op_ref-nowhere", gate.StatePendingEffect, 1, "owner-a", 1, at, gate.ErrNotFound),
		f.create(dup, at, gate.ErrExists),
		f.create(fresh, at, nil),
	})
	if p := pathsSince(l, before); p != (storage.BatchPaths{SetBased: 1}) {
		t.Errorf("paths %+v, want one set-based batch", p)
	}
	for _, n := range []string{"ok-1", "ok-2"} {
		rec := mustGet(t, l, ops[n].ID)
		if rec.State != gate.StateAckPending || rec.ResultID != "r-"+ops[n].ID || rec.Attempts[0].FinishedAt == nil ||
			len(rec.Events) != 5 {
			t.Errorf("%s: %s result %q attempt %+v, %d events", n, rec.State, rec.ResultID, rec.Attempts[0], len(rec.Events))
		}
	}
	for _, n := range []string{"stale", "moved"} {
		assertUntouched(t, l, ops[n])
	}
	if got := mustFind(t, l, fresh.ScopeKey); got.State != gate.StatePendingEffect || got.DeliveryCount != 1 {
		t.Errorf("created in the batch: %+v", got)
	}
	if got := mustFind(t, l, dup.ScopeKey); got.Fingerprint != ops["taken"].Fingerprint {
		t.Errorf("the duplicate overwrote the operation: %+v", got)
	}
	if _, err := l.Find(context.Background(), "op_ref-nowhere"); !errors.Is(err, gate.ErrNotFound) {
		t.Errorf("a refused change created its row: %v", err)
	}
}

// assertUntouched checks that op is still as createChange left it.
func assertUntouched(t *testing.T, l *storage.Ledger, op *gate.Operation) {
	t.Helper()
	rec := mustGet(t, l, op.ID)
	if rec.State != gate.StatePendingEffect || rec.ResultID != "" || rec.Fence != 1 || rec.Owner != "owner-a" ||
		len(rec.Attempts) != 1 || rec.Attempts[0].FinishedAt != nil || len(rec.Events) != 3 ||
		rec.Reason != "new operation" || len(rec.Deliveries) != 1 || rec.Deliveries[0].Decision != gate.Nack {
		t.Errorf("%s kept part of a refused change: %s result %q fence %d, attempts %+v, %d events, deliveries %+v",
			op.ID, rec.State, rec.ResultID, rec.Fence, rec.Attempts, len(rec.Events), rec.Deliveries)
	}
}

// A change the guards refuse makes the set-based statement raise, which
// takes the whole batch back; the batch then goes change by change, so the
// refused change gets its own error, its neighbours are written, and
// nothing of the refused change or of a stale owner stays.
func TestSetBasedBatchFallsBackWhenAGuardRaises(t *testing.T) {
	t.Parallel()
	f := batchFixture{t}
	l, _ := newLedger(t)
	l.SetBasedFrom(1)
	ops := map[string]*gate.Operation{}
	for _, n := range []string{"ok-1", "illegal", "no-attempt", "stale", "ok-2"} {
		ops[n] = newOperation("fb-" + n)
		createPending(t, l, ops[n])
	}
	at := t0.Add(time.Minute)
	illegal := gate.Settling(&gate.Operation{ID: ops["illegal"].ID, State: gate.StatePendingEffect}, 1,
		&gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, ResultID: "r"}, nil, gate.LeaseFacts{})
	fresh := newOperation("fb-fresh")
	// A new id with a taken scope key: only a hand-made change has one.
	scopeTaken := newOperation("fb-ok-1")
	scopeTaken.ID = "op_fb-ok-1-again"
	before := l.GroupCommitPaths()
	sendChanges(t, l, "batch", []batchChange{
		f.confirm(ops["ok-1"].ID, gate.StatePendingEffect, 1, "owner-a", 1, at, nil),
		f.wire(gate.ConfirmChange(illegal,
			[]gate.Step{{Transition: gate.Transition{From: gate.StatePendingEffect, To: gate.StateAcknowledged}}},
			"r", "skips the log", at), storage.ErrRefused),
		f.confirm(ops["no-attempt"].ID, gate.StatePendingEffect, 1, "owner-a", 7, at, storage.ErrRefused),
		f.confirm(ops["stale"].ID, gate.StatePendingEffect, 0, "owner-a", 1, at, gate.ErrFenced),
		f.confirm(ops["ok-2"].ID, gate.StatePendingEffect, 1, "owner-a", 1, at, nil),
		f.create(fresh, at, nil),
		f.create(scopeTaken, at, gate.ErrExists),
	})
	if p := pathsSince(l, before); p != (storage.BatchPaths{FellBack: 1}) {
		t.Errorf("paths %+v, want one batch that fell back", p)
	}
	for _, n := range []string{"ok-1", "ok-2"} {
		if rec := mustGet(t, l, ops[n].ID); rec.State != gate.StateAckPending || rec.Attempts[0].FinishedAt == nil {
			t.Errorf("%s: %s attempt %+v", n, rec.State, rec.Attempts[0])
		}
	}
	for _, n := range []string{"illegal", "no-attempt", "stale"} {
		assertUntouched(t, l, ops[n])
	}
	if got := mustFind(t, l, fresh.ScopeKey); got.State != gate.StatePendingEffect || got.AttemptCount != 1 {
		t.Errorf("created in the batch that fell back: %+v", got)
	}
}

// Two changes of one operation in a batch need the second judged after the
// first is written, which only the per-change path does: such a batch goes
// that way at once, and each change gets its own answer.
func TestBatchWithTwoChangesOfOneOperationGoesPerChange(t *testing.T) {
	t.Parallel()
	f := batchFixture{t}
	l, _ := newLedger(t)
	l.SetBasedFrom(1)
	twice, other := newOperation("two-twice"), newOperation("two-other")
	createPending(t, l, twice)
	createPending(t, l, other)
	at := t0.Add(time.Minute)
	before := l.GroupCommitPaths()
	sendChanges(t, l, "batch", []batchChange{
		f.confirm(twice.ID, gate.StatePendingEffect, 1, "owner-a", 1, at, nil),
		f.confirm(other.ID, gate.StatePendingEffect, 1, "owner-a", 1, at, nil),
		f.acked(twice.ID, 1, at.Add(time.Second), nil),
		f.acked(other.ID, 2, at.Add(time.Second), gate.ErrFenced),
	})
	if p := pathsSince(l, before); p != (storage.BatchPaths{PerChange: 1}) {
		t.Errorf("paths %+v, want one per-change batch", p)
	}
	if rec := mustGet(t, l, twice.ID); rec.State != gate.StateAcknowledged || rec.AckedAt == nil || len(rec.Events) != 6 {
		t.Errorf("twice: %s acked %v, %d events", rec.State, rec.AckedAt, len(rec.Events))
	}
	rec := mustGet(t, l, other.ID)
	if rec.State != gate.StateAckPending || rec.AckedAt != nil {
		t.Errorf("other: %s acked %v", rec.State, rec.AckedAt)
	}
}

// A claim that creates a row another transaction is creating at the same
// time passes the set-based look-up, then waits on that transaction's key
// and raises once it commits. The batch is sent again change by change,
// which answers 'exists', and the change beside it is written.
func TestSetBasedBatchFallsBackWhenACreationRaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := batchFixture{t}
	l, pool := newLedger(t)
	l.SetBasedFrom(1)
	neighbour := newOperation("race-neighbour")
	createPending(t, l, neighbour)
	raced := newOperation("race-raced")
	at := t0.Add(time.Minute)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var answer string
	if err := tx.QueryRow(ctx, `SELECT ackgate_write($1::jsonb)`, f.create(raced, at, nil).wire).Scan(&answer); err != nil || answer != "ok" {
		t.Fatalf("the other creator: %q %v", answer, err)
	}
	var other int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&other); err != nil {
		t.Fatal(err)
	}

	batch := []batchChange{
		f.confirm(neighbour.ID, gate.StatePendingEffect, 1, "owner-a", 1, at, nil),
		f.create(raced, at, gate.ErrExists),
	}
	before := l.GroupCommitPaths()
	done := make(chan []error, 1)
	go func() { done <- sendChanges(t, l, "batch", batch) }()
	testenv.Eventually(t, testenv.StepTimeout, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE $1 = ANY (pg_blocking_pids(pid)))`, other).Scan(&waiting)
		return err == nil && waiting
	}, func() string { return "the batch never waited on the other creator" })
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if p := pathsSince(l, before); p != (storage.BatchPaths{FellBack: 1}) {
		t.Errorf("paths %+v, want one batch that fell back", p)
	}
	if rec := mustGet(t, l, neighbour.ID); rec.State != gate.StateAckPending {
		t.Errorf("neighbour: %s", rec.State)
	}
	if rec := mustGet(t, l, raced.ID); len(rec.Deliveries) != 1 || len(rec.Events) != 3 {
		t.Errorf("the raced row holds %d deliveries and %d events, want the other creator's alone",
			len(rec.Deliveries), len(rec.Events))
	}
}

// A set-based batch whose session ends without the server's ERROR may
// have committed, as far as the gateway can tell, so it is not sent again:
// every change gets the error. (Here the session is terminated while the
// batch waits for a row lock, so in fact nothing committed.)
func TestSetBasedBatchIsNotResentWhenItsOutcomeIsUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := batchFixture{t}
	l, pool := newLedger(t)
	l.SetBasedFrom(1)
	a, b := newOperation("kill-a"), newOperation("kill-b")
	createPending(t, l, a)
	createPending(t, l, b)
	at := t0.Add(time.Minute)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var holder int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid() FROM operations WHERE id = $1 FOR UPDATE`, b.ID).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	batch := []batchChange{
		f.confirm(a.ID, gate.StatePendingEffect, 1, "owner-a", 1, at, nil),
		f.confirm(b.ID, gate.StatePendingEffect, 1, "owner-a", 1, at, nil),
	}
	ids, wires := []string{batch[0].id, batch[1].id}, [][]byte{batch[0].wire, batch[1].wire}
	before := l.GroupCommitPaths()
	done := make(chan []error, 1)
	go func() { done <- l.SendRaw(ids, wires) }()
	var waiter int
	testenv.Eventually(t, testenv.StepTimeout, func() bool {
		err := pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, holder).Scan(&waiter)
		return err == nil
	}, func() string { return "the batch never waited for the row lock" })
	var killed bool
	if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, waiter).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminate %d: %v %v", waiter, killed, err)
	}
	errs := <-done
	for i, err := range errs {
		if err == nil || answerWord(err) != "error: "+err.Error() {
			t.Errorf("change %d of a batch whose outcome is unknown: %v", i, err)
		}
	}
	if p := pathsSince(l, before); p != (storage.BatchPaths{SetBased: 1}) {
		t.Errorf("paths %+v, want one set-based batch and no resend", p)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	assertUntouched(t, l, a)
	assertUntouched(t, l, b)
}

// Deliveries in flight together share set-based batches of mixed kinds
// (creations, confirmations, acks, redeliveries), each answered as if it
// had been alone.
func TestConcurrentLifecyclesShareSetBasedBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, _ := newLedger(t)
	l.SetBasedFrom(1)
	const n = 24
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		op := newOperation(fmt.Sprintf("life-%02d", i))
		wg.Go(func() {
			errs[i] = func() error {
				if err := createChange(t, l, op); err != nil {
					return fmt.Errorf("create: %w", err)
				}
				at := t0.Add(time.Second)
				if err := l.RecordDelivery(ctx, &gate.Delivery{OperationID: op.ID, Broker: gate.BrokerPubSub,
					Source: "s", MessageID: "m-again", ReceivedAt: at, Decision: gate.Nack}); err != nil {
					return fmt.Errorf("redelivery: %w", err)
				}
				w := settling(op.ID, gate.StatePendingEffect, 1,
					&gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "r"}, 0)
				if err := l.Write(ctx, gate.ConfirmChange(w,
					steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "r", "confirmed", at)); err != nil {
					return fmt.Errorf("confirm: %w", err)
				}
				if err := l.Write(ctx, gate.AckedChange(op.ID, gate.StateAckPending, 1,
					steps(t, gate.StateAckPending, gate.StateAcknowledged), at)); err != nil {
					return fmt.Errorf("ack: %w", err)
				}
				// A stale owner after the ack changes nothing.
				if err := l.Write(ctx, gate.AckedChange(op.ID, gate.StateAckPending, 0, nil, at)); !errors.Is(err, gate.ErrFenced) {
					return fmt.Errorf("stale ack: %v", err)
				}
				return nil
			}()
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("lifecycle %d: %v", i, err)
		}
	}
	for i := range n {
		rec := mustGet(t, l, newOperation(fmt.Sprintf("life-%02d", i)).ID)
		if rec.State != gate.StateAcknowledged || rec.DeliveryCount != 2 || len(rec.Deliveries) != 2 || len(rec.Events) != 6 {
			t.Errorf("life-%02d: %s, %d deliveries counted, %d recorded, %d events",
				i, rec.State, rec.DeliveryCount, len(rec.Deliveries), len(rec.Events))
		}
	}
	if p := l.GroupCommitPaths(); p.SetBased == 0 || p.FellBack != 0 {
		t.Errorf("paths %+v, want set-based batches and none that fell back", p)
	}
}
