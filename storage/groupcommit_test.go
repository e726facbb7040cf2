package storage_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/storage"
)

// Changes that share one statement and one commit keep their own
// conditions: a fenced, a refused and a duplicate change each get their own
// answer, write nothing, and take nothing from the changes beside them.
func TestSharedCommitKeepsEachChangeApart(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ops := map[string]*gate.Operation{}
	for _, name := range []string{"ok-1", "stale", "illegal", "ok-2"} {
		ops[name] = newOperation(name)
		createPending(t, l, ops[name])
	}
	at := t0.Add(time.Minute)
	fin := func() *gate.Attempt {
		return &gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "r"}
	}
	confirm := func(op *gate.Operation, fence int64, s []gate.Step) *gate.Change {
		w := gate.Settling(&gate.Operation{ID: op.ID, State: gate.StatePendingEffect}, fence, fin(),
			&gate.Answer{Owner: "owner-a", Decision: gate.Ack, Reason: "confirmed"}, gate.LeaseFacts{})
		return gate.ConfirmChange(w, s, "r-"+op.Key, "confirmed", at)
	}
	toAckPending := steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending)
	illegal := []gate.Step{{Transition: gate.Transition{From: gate.StatePendingEffect, To: gate.StateAcknowledged}}}
	fresh := newOperation("fresh")
	dup := newOperation("ok-1")
	dup.ID = "op_ok-1-again"
	create := func(op *gate.Operation) *gate.Change {
		w := gate.Claiming(nil, op, gate.Lease{Owner: "owner-z", Fence: 1, Expires: at.Add(time.Minute)}, delivery("m-z", at), "")
		return gate.StartChange(w, steps(t, "", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect),
			&gate.Attempt{N: 1, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, StartedAt: at}, "new", at)
	}

	errs := l.SendBatch([]*gate.Change{
		confirm(ops["ok-1"], 1, toAckPending),
		confirm(ops["stale"], 0, toAckPending), // a superseded owner
		confirm(ops["illegal"], 1, illegal),    // a path the ledger refuses
		confirm(ops["ok-2"], 1, toAckPending),
		create(fresh),
		create(dup), // its scope key is taken
	})
	wants := []error{nil, gate.ErrFenced, storage.ErrRefused, nil, nil, gate.ErrExists}
	for i, want := range wants {
		if (want == nil) != (errs[i] == nil) || (want != nil && !errors.Is(errs[i], want)) {
			t.Errorf("change %d: %v, want %v", i, errs[i], want)
		}
	}
	for _, name := range []string{"ok-1", "ok-2"} {
		rec := mustGet(t, l, ops[name].ID)
		if rec.State != gate.StateAckPending || rec.ResultID != "r-"+name || rec.Attempts[0].FinishedAt == nil {
			t.Errorf("%s: %s result %q attempt %+v", name, rec.State, rec.ResultID, rec.Attempts[0])
		}
	}
	for _, name := range []string{"stale", "illegal"} {
		rec := mustGet(t, l, ops[name].ID)
		if rec.State != gate.StatePendingEffect || rec.ResultID != "" || rec.Attempts[0].FinishedAt != nil ||
			len(rec.Events) != 3 || rec.Reason != "new operation" {
			t.Errorf("%s kept part of a refused change: %s result %q attempt %+v, %d events",
				name, rec.State, rec.ResultID, rec.Attempts[0], len(rec.Events))
		}
	}
	if got := mustFind(t, l, fresh.ScopeKey); got.State != gate.StatePendingEffect || got.Owner != "owner-z" {
		t.Errorf("created in the batch: %+v", got)
	}
	if got := mustFind(t, l, dup.ScopeKey); got.ID != ops["ok-1"].ID {
		t.Errorf("the duplicate took the scope key: %s", got.ID)
	}
}

// When the shared statement itself fails, every change in it is told so and
// none of them committed: nobody acks on a commit that did not happen.
func TestFailedSharedCommitFailsEveryChange(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	op := newOperation("victim")
	createPending(t, l, op)
	good := gate.ConfirmChange(
		settling(op.ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, ResultID: "r"}, 0),
		steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "r", "confirmed", t0.Add(time.Second))
	wire := encodeForTest(t, good)
	errs := l.SendRaw([]string{op.ID, "op_broken"}, [][]byte{wire, []byte(`{not json`)})
	for i, err := range errs {
		if err == nil {
			t.Errorf("change %d of a failed statement reported success", i)
		}
	}
	if got := mustFind(t, l, op.ScopeKey); got.State != gate.StatePendingEffect || got.ResultID != "" {
		t.Fatalf("a change of a failed statement committed: %s %q", got.State, got.ResultID)
	}
}

// Writes that arrive while the flushers are busy ride one statement.
func TestConcurrentWritesShareACommit(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	const n = 10
	queued, release := l.HoldFlushers()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		op := newOperation(fmt.Sprintf("share-%d", i))
		wg.Go(func() { errs[i] = createChange(t, l, op) })
	}
	deadline := time.Now().Add(30 * time.Second)
	for queued() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d writes queued", queued(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	before, _ := l.GroupCommitStats()
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("write %d: %v", i, err)
		}
	}
	after, changes := l.GroupCommitStats()
	if after-before != 1 || changes < n {
		t.Fatalf("%d statements for %d queued writes, want 1", after-before, n)
	}
	if _, err := l.Find(context.Background(), newOperation("share-7").ScopeKey); err != nil {
		t.Fatal(err)
	}
}

func encodeForTest(t *testing.T, c *gate.Change) []byte {
	t.Helper()
	b, err := storage.Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
