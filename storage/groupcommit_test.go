package storage_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/storage"
)

// Changes that share one statement and one commit keep their own
// conditions: a fenced, a moved and a missing operation's change each get
// their own answer, write nothing, and take nothing from the changes beside
// them, in a batch of more than a handful (a guard that held only for small
// batches would pass with fewer).
func TestSharedStatementKeepsEachChangeApart(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ops := map[string]*gate.Operation{}
	for _, name := range []string{"ok-1", "stale", "ok-2", "ok-3", "ok-4", "ok-5", "ok-6"} {
		ops[name] = newOperation(name)
		createPending(t, l, ops[name])
	}
	at := t0.Add(time.Minute)
	settle := func(op *gate.Operation, fence int64) *gate.Change {
		c := confirm(t, op, "r-"+op.Key, at)
		c.Fence = fence
		return c
	}
	errs := l.SendBatch([]*gate.Change{
		settle(ops["ok-1"], 1),
		settle(ops["stale"], 0), // a superseded owner
		settle(ops["ok-2"], 1),
		settle(newOperation("missing"), 1),
		settle(ops["ok-4"], 1),
		settle(ops["ok-5"], 1),
		settle(ops["ok-6"], 1),
	})
	wants := []error{nil, gate.ErrFenced, nil, gate.ErrNotFound, nil, nil, nil}
	for i, want := range wants {
		if (want == nil) != (errs[i] == nil) || (want != nil && !errors.Is(errs[i], want)) {
			t.Errorf("change %d: %v, want %v", i, errs[i], want)
		}
	}
	// ok-1, now in ack_pending, refuses a second settlement expecting
	// pending_effect, beside one that applies.
	errs = l.SendBatch([]*gate.Change{settle(ops["ok-1"], 1), settle(ops["ok-3"], 1)})
	if !errors.Is(errs[0], gate.ErrStateChanged) || errs[1] != nil {
		t.Errorf("second batch: %v, %v; want ErrStateChanged and nil", errs[0], errs[1])
	}
	for _, name := range []string{"ok-1", "ok-2", "ok-3", "ok-4", "ok-5", "ok-6"} {
		rec := mustGet(t, l, ops[name].ID)
		if rec.State != gate.StateAckPending || rec.ResultID != "r-"+name || rec.Attempts[0].FinishedAt == nil {
			t.Errorf("%s: %s result %q attempt %+v", name, rec.State, rec.ResultID, rec.Attempts[0])
		}
	}
	rec := mustGet(t, l, ops["stale"].ID)
	if rec.State != gate.StatePendingEffect || rec.ResultID != "" || rec.Attempts[0].FinishedAt != nil ||
		len(rec.Events) != 3 || rec.Reason != gate.ReasonNewOperation {
		t.Errorf("stale kept part of a refused change: %s result %q attempt %+v, %d events",
			rec.State, rec.ResultID, rec.Attempts[0], len(rec.Events))
	}
}

// A statement that raises takes its batch back whole; every change is then
// sent again on its own, so the one that raised fails and its neighbours
// commit as if alone.
func TestARaisingStatementIsSentAgainChangeByChange(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	good, bad := newOperation("beside"), newOperation("raises")
	createPending(t, l, good)
	createPending(t, l, bad)
	// Finishing an attempt that was never started is refused by the
	// statement itself (ackgate_refused), which raises.
	never := gate.RetryLaterChange(settling(bad.ID, gate.StatePendingEffect, 1,
		&gate.Attempt{N: 5, Outcome: gate.OutcomeRetryable}, 1), "no such attempt", t0)
	before := l.GroupCommitAlone()
	errs := l.SendBatch([]*gate.Change{confirm(t, good, "r-beside", t0), never})
	if errs[0] != nil || !errors.Is(errs[1], storage.ErrRefused) {
		t.Fatalf("answers %v, %v; want nil and ErrRefused", errs[0], errs[1])
	}
	if n := l.GroupCommitAlone() - before; n != 2 {
		t.Errorf("%d changes sent again alone, want the batch's 2", n)
	}
	if rec := mustGet(t, l, good.ID); rec.State != gate.StateAckPending {
		t.Errorf("the neighbour of a raising change: %s", rec.State)
	}
	if rec := mustGet(t, l, bad.ID); rec.State != gate.StatePendingEffect || rec.Reason != gate.ReasonNewOperation {
		t.Errorf("the raising change left %s (%s)", rec.State, rec.Reason)
	}
}

// When the round trip fails without the server's refusal (the connection
// ends, and with it any knowledge of the commit), every change in it is
// told so, none is sent again, and none of them committed: nobody acks on
// a commit that did not happen.
func TestAFailedRoundTripFailsEveryChange(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	a, b := newOperation("locked"), newOperation("other")
	createPending(t, l, a)
	createPending(t, l, b)
	// Hold a's row so the batch waits on it, then end the batch's session.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM operations WHERE id = $1 FOR UPDATE`, a.ID); err != nil {
		t.Fatal(err)
	}
	before := l.GroupCommitAlone()
	done := make(chan []error, 1)
	go func() {
		done <- l.SendBatch([]*gate.Change{confirm(t, b, "r-other", t0), confirm(t, a, "r-locked", t0)})
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		// Asked outside tx: a transaction sees one snapshot of the activity.
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the batch never waited on the locked row")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`); err != nil {
		t.Fatal(err)
	}
	errs := <-done
	for i, err := range errs {
		if err == nil {
			t.Errorf("change %d of a failed round trip reported success", i)
		}
	}
	if n := l.GroupCommitAlone() - before; n != 0 {
		t.Errorf("%d changes of a round trip with an unknown outcome were sent again", n)
	}
	_ = tx.Rollback(ctx)
	for _, op := range []*gate.Operation{a, b} {
		if got := mustGet(t, l, op.ID); got.State != gate.StatePendingEffect || got.ResultID != "" {
			t.Errorf("%s: a change of a failed round trip committed: %s %q", op.ID, got.State, got.ResultID)
		}
	}
}

// Steps that arrive while the flushers are busy ride one round trip, one
// statement per kind: claims, changes and answers of different operations
// together.
func TestConcurrentStepsShareACommit(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()
	settled := newOperation("settled")
	createPending(t, l, settled)
	answered := newOperation("answered")
	createPending(t, l, answered)
	const n = 10
	queued, release := l.HoldFlushers()
	errs := make([]error, n+2)
	var wg sync.WaitGroup
	for i := range n {
		op := newOperation(fmt.Sprintf("share-%d", i))
		wg.Go(func() {
			_, created, err := l.Claim(ctx, creating(t, op, "m-1", t0))
			if err == nil && !created {
				err = errors.New("found, not created")
			}
			errs[i] = err
		})
	}
	wg.Go(func() { errs[n] = l.Write(ctx, confirm(t, settled, "r", t0)) })
	wg.Go(func() {
		errs[n+1] = l.AnswerDelivery(ctx, answered.ID, &gate.Answer{N: 1, Decision: gate.Nack, Reason: "held"})
	})
	deadline := time.Now().Add(30 * time.Second)
	for queued() < n+2 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d steps queued", queued(), n+2)
		}
		time.Sleep(5 * time.Millisecond)
	}
	before, _ := l.GroupCommitStats()
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("step %d: %v", i, err)
		}
	}
	after, steps := l.GroupCommitStats()
	if after-before != 1 || steps < n+2 {
		t.Fatalf("%d round trips for %d queued steps, want 1", after-before, n+2)
	}
	if rec := mustGet(t, l, newOperation("share-7").ID); rec.State != gate.StatePendingEffect {
		t.Errorf("created in the shared round trip: %s", rec.State)
	}
	if rec := mustGet(t, l, settled.ID); rec.State != gate.StateAckPending {
		t.Errorf("settled in the shared round trip: %s", rec.State)
	}
	if rec := mustGet(t, l, answered.ID); rec.Deliveries[0].Decision != gate.Nack {
		t.Errorf("answered in the shared round trip: %+v", rec.Deliveries[0])
	}
}

// Two steps of one operation never share a statement (an UPDATE moves a
// row once): the second waits for the next round trip and sees the first.
func TestTwoStepsOfOneOperationGoInTurn(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()
	op := newOperation("turns")
	const n = 4
	queued, release := l.HoldFlushers()
	created := make(chan bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			got, c, err := l.Claim(ctx, creating(t, op, fmt.Sprintf("m-%d", i), t0))
			if err != nil || c != (got == nil) || got != nil && got.ID != op.ID {
				t.Errorf("claim %d: %+v, created %v, %v", i, got, c, err)
			}
			created <- c
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for queued() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d claims queued", queued(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	release()
	wg.Wait()
	close(created)
	var creators int
	for c := range created {
		if c {
			creators++
		}
	}
	rec := mustGet(t, l, op.ID)
	if creators != 1 || rec.DeliveryCount != n || len(rec.Deliveries) != n {
		t.Fatalf("%d creators; %d deliveries counted, %d recorded; want 1 and %d", creators, rec.DeliveryCount, len(rec.Deliveries), n)
	}
	for i, d := range rec.Deliveries {
		if d.N != i+1 {
			t.Fatalf("deliveries numbered %+v", rec.Deliveries)
		}
	}
}

// stall holds locked's row in a transaction of its own and sends its
// evidence, which waits on that lock in a batch of its own: the batch stays
// out until the returned transaction ends. written answers the evidence.
func stall(t *testing.T, l *storage.Ledger, pool *pgxpool.Pool, locked *gate.Operation) (tx pgx.Tx, written chan error) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `SELECT 1 FROM operations WHERE id = $1 FOR UPDATE`, locked.ID); err != nil {
		t.Fatal(err)
	}
	written = make(chan error, 1)
	go func() { written <- l.Write(ctx, confirm(t, locked, "r-locked", t0)) }()
	waitFor(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	})
	return tx, written
}

// claimFresh queues the creating claim of a new operation named name and
// answers it.
func claimFresh(t *testing.T, l *storage.Ledger, name string) chan error {
	claimed := make(chan error, 1)
	go func() {
		_, created, err := l.Claim(context.Background(), creating(t, newOperation(name), "m-1", t0))
		if err == nil && !created {
			err = errors.New("found, not created")
		}
		claimed <- err
	}()
	return claimed
}

// A batch that waits on a row lock does not hold up the steps queued
// behind it: once it has been out a while, a second flusher takes them.
// Here the first flusher's batch is an evidence write blocked by another
// transaction's lock on its row, and a fresh claim queued behind it must
// commit while that lock is still held.
func TestStalledBatchDoesNotHoldTheQueue(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	locked := newOperation("stall-locked")
	createPending(t, l, locked)
	// The write is on the wire, waiting for the lock, before the claim queues.
	tx, written := stall(t, l, pool, locked)
	claimed := claimFresh(t, l, "stall-fresh")
	select {
	case err := <-claimed:
		if err != nil {
			t.Fatalf("claim behind the stalled batch: %v", err)
		}
	case err := <-written:
		t.Fatalf("the locked write returned (%v) while its row was still locked", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the claim waited for the stalled batch: no second flusher took it")
	}
	if n := l.GroupCommitStalls(); n < 1 {
		t.Errorf("%d flushers started behind a stalled batch; want at least 1", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-written; err != nil {
		t.Fatalf("the write after the lock was released: %v", err)
	}
	if got := mustGet(t, l, locked.ID); got.ResultID != "r-locked" {
		t.Errorf("locked operation's result %q after the lock went, want r-locked", got.ResultID)
	}
}

// Ack marks lingering behind a stalled batch do not use up its relief: a
// flusher started for them alone would take nothing and end, and a claim
// queued after it would wait for the stalled batch.
func TestStalledBatchBehindLingeringAckMarks(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	queued := l.LingerAckMarks(time.Minute) // longer than the test
	locked, done := newOperation("stall-ack-locked"), newOperation("stall-ack-done")
	createPending(t, l, locked)
	createPending(t, l, done)
	must(t, l.Write(ctx, confirm(t, done, "r-done", t0)))
	l.WaitFlushersIdle()
	tx, written := stall(t, l, pool, locked)
	marked := make(chan error, 1)
	go func() { marked <- l.Write(ctx, acked(t, done, 1, t0)) }()
	waitFor(t, func() bool { return queued() == 1 })
	// Several of the watch's looks pass with only the mark queued.
	time.Sleep(5 * storage.StallAfter)
	claimed := claimFresh(t, l, "stall-ack-fresh")
	select {
	case err := <-claimed:
		if err != nil {
			t.Fatalf("claim behind the stalled batch: %v", err)
		}
	case <-time.After(10 * time.Second): // well before the stalled batch's own timeout
		t.Fatal("the claim waited for the stalled batch: the relief was spent on the lingering mark")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-written; err != nil {
		t.Fatalf("the write after the lock was released: %v", err)
	}
	// The mark rides the next change.
	must(t, l.Write(ctx, confirm(t, newOperation("stall-ack-fresh"), "r-fresh", t0)))
	if err := <-marked; err != nil {
		t.Fatalf("the ack mark: %v", err)
	}
}

// waitFor polls cond until it holds, failing the test after 30 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An ack mark nobody else's step is queued with waits for the next batch
// that carries a change, and joins its statement, rather than paying a
// commit of its own or a statement of its own in the next claim's round
// trip.
func TestAckMarkRidesTheNextChange(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()
	queued := l.LingerAckMarks(time.Minute) // longer than the test
	done := newOperation("ride-acked")
	createPending(t, l, done)
	must(t, l.Write(ctx, confirm(t, done, "r", t0)))
	// The confirmation's flusher, still looking at the queue, would take
	// the mark at once instead of leaving it to linger.
	l.WaitFlushersIdle()
	before, steps := l.GroupCommitStats()
	marked := make(chan error, 1)
	go func() { marked <- l.Write(ctx, acked(t, done, 1, t0)) }()
	waitFor(t, func() bool { return queued() == 1 })
	next := newOperation("ride-next")
	createPending(t, l, next)
	if after, _ := l.GroupCommitStats(); after-before != 1 {
		t.Fatalf("%d round trips for the next claim, want 1", after-before)
	}
	if n := queued(); n != 1 {
		t.Fatalf("%d steps queued after the next claim, want the ack mark", n)
	}
	must(t, l.Write(ctx, confirm(t, next, "r", t0)))
	if err := <-marked; err != nil {
		t.Fatalf("the ack mark: %v", err)
	}
	if after, stepsAfter := l.GroupCommitStats(); after-before != 2 || stepsAfter-steps != 3 {
		t.Errorf("%d round trips and %d steps for the next claim, its evidence and the ack mark, want 2 and 3",
			after-before, stepsAfter-steps)
	}
	if rec := mustGet(t, l, done.ID); rec.State != gate.StateAcknowledged {
		t.Errorf("the ack mark that rode the evidence left %s", rec.State)
	}
}

// An ack mark with no step to ride is not left behind: after its linger it
// goes on its own.
func TestLoneAckMarkIsWritten(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()
	op := newOperation("lone-acked")
	createPending(t, l, op)
	must(t, l.Write(ctx, confirm(t, op, "r", t0)))
	before, _ := l.GroupCommitStats()
	must(t, l.Write(ctx, acked(t, op, 1, t0)))
	if after, _ := l.GroupCommitStats(); after-before != 1 {
		t.Errorf("%d round trips for a lone ack mark, want 1", after-before)
	}
	if rec := mustGet(t, l, op.ID); rec.State != gate.StateAcknowledged {
		t.Errorf("a lone ack mark left %s", rec.State)
	}
}

// Claims that create and claims that find share one statement, in every
// query mode pgx offers (the modes behind a pooler read the answer as
// text): a created operation comes back as nothing, as gate.Ledger.Claim
// says, and a found one whole, as FindByID has it right after, whatever
// rows lie beside it. Sorted by id, the statement answers found, created,
// found, created, so each kind of row follows the other.
func TestCreatedAndFoundClaimsShareAStatement(t *testing.T) {
	t.Parallel()
	inEveryQueryMode(t, func(t *testing.T, l *storage.Ledger, mode string) {
		ctx := context.Background()
		pending, fresh := newOperation("mixed-"+mode+"-a-pending"), newOperation("mixed-"+mode+"-b-fresh")
		acknowledged, refused := newOperation("mixed-"+mode+"-c-acked"), newOperation("mixed-"+mode+"-d-refused")
		createPending(t, l, pending)
		createPending(t, l, acknowledged)
		must(t, l.Write(ctx, confirm(t, acknowledged, "r-acked", t0)))
		must(t, l.Write(ctx, acked(t, acknowledged, 1, t0)))
		at := t0.Add(time.Minute)
		claims := []*gate.Change{creating(t, pending, "m-2", at), creating(t, fresh, "m-1", at),
			creating(t, acknowledged, "m-2", at), creatingTerminal(t, refused, "m-1", at, nil)}

		type outcome struct {
			op      *gate.Operation
			created bool
			err     error
		}
		out := make([]outcome, len(claims))
		queued, release := l.HoldFlushers()
		var wg sync.WaitGroup
		for i, c := range claims {
			wg.Go(func() {
				op, created, err := l.Claim(ctx, c)
				out[i] = outcome{op, created, err}
			})
		}
		waitFor(t, func() bool { return queued() == len(claims) })
		before, _ := l.GroupCommitStats()
		release()
		wg.Wait()
		if after, _ := l.GroupCommitStats(); after-before != 1 {
			t.Fatalf("%d round trips for %d claims, want 1", after-before, len(claims))
		}
		for i, o := range out {
			id := claims[i].OperationID
			creates := i == 1 || i == 3
			switch {
			case o.err != nil:
				t.Fatalf("claim of %s: %v", id, o.err)
			case o.created != creates:
				t.Fatalf("claim of %s: created %v, want %v", id, o.created, creates)
			case creates && o.op != nil:
				t.Fatalf("claim of %s created it and returned %+v, want no operation", id, o.op)
			case creates:
				continue
			}
			want := mustFind(t, l, id)
			if !reflect.DeepEqual(o.op, want) {
				t.Fatalf("claim of %s found\n%+v with last attempt %+v;\nFindByID right after has\n%+v with last attempt %+v",
					id, o.op, o.op.LastAttempt, want, want.LastAttempt)
			}
			if o.op.DeliveryCount != 2 {
				t.Fatalf("claim of %s counted delivery %d, want 2", id, o.op.DeliveryCount)
			}
		}
		if got := out[2].op; got.State != gate.StateAcknowledged || got.ResultID != "r-acked" || got.LastAttempt == nil ||
			got.LastAttempt.Outcome != gate.OutcomeConfirmed {
			t.Fatalf("the redelivery of acknowledged work found %+v", got)
		}
		if rec := mustGet(t, l, acknowledged.ID); len(rec.Deliveries) != 2 || rec.Deliveries[1].Decision != gate.Ack {
			t.Fatalf("the redelivery of acknowledged work was not answered by its claim: %+v", rec.Deliveries)
		}
		for _, op := range []*gate.Operation{fresh, refused} {
			if rec := mustGet(t, l, op.ID); rec.DeliveryCount != 1 || rec.Fence != 1 || rec.Fingerprint != op.Fingerprint {
				t.Fatalf("created %s: %+v", op.ID, rec.Operation)
			}
		}
	})
}
