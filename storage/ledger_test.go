package storage_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/storage"
)

func TestCreateTwiceIsErrExists(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	op := newOperation("twice")
	createPending(t, l, op)

	again := *op
	again.ID = "op_other-replica-name" // same scope key under another id is still taken
	for _, o := range []*gate.Operation{op, &again} {
		w := gate.Claiming(nil, o, gate.Lease{Owner: "owner-b", Fence: 2, Expires: t0.Add(time.Minute)}, delivery("m-2", t0), "")
		err := l.Write(context.Background(), gate.StartChange(w,
			steps(t, "", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect),
			&gate.Attempt{N: 1, Kind: gate.AttemptEffect, IdempotencyKey: o.IdempotencyKey, StartedAt: t0}, "second", t0))
		if !errors.Is(err, gate.ErrExists) {
			t.Fatalf("second Create of %s: %v, want ErrExists", o.ID, err)
		}
	}
	if got := mustFind(t, l, op.ScopeKey); got.Owner != "owner-a" || got.DeliveryCount != 1 {
		t.Fatalf("losing Create changed the winner: owner %q, %d deliveries", got.Owner, got.DeliveryCount)
	}
}

func TestCreateWritesTheWholeFirstCommit(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	op := newOperation("first")
	createPending(t, l, op)

	got := mustFind(t, l, op.ScopeKey)
	if got.ID != op.ID || got.State != gate.StatePendingEffect || got.Fence != 1 || got.Owner != "owner-a" {
		t.Fatalf("Find = %s %s fence %d owner %q", got.ID, got.State, got.Fence, got.Owner)
	}
	if got.DeliveryCount != 1 || got.AttemptCount != 1 || got.FirstAttemptAt == nil || !got.FirstAttemptAt.Equal(t0) {
		t.Fatalf("counters: %d deliveries, %d attempts, first attempt %v", got.DeliveryCount, got.AttemptCount, got.FirstAttemptAt)
	}
	if got.LeaseStart == nil || !got.LeaseStart.Equal(t0) || got.LeaseDeadline == nil || !got.LeaseDeadline.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("lease %v .. %v", got.LeaseStart, got.LeaseDeadline)
	}
	if got.Fingerprint != op.Fingerprint || got.IdempotencyKey != op.IdempotencyKey || got.TraceID != "trace-1" ||
		got.KeySource != gate.KeyMessageID || got.Shape != gate.ShapeIdempotent || !got.RetainUntil.Equal(op.RetainUntil) {
		t.Fatalf("operation fields did not round-trip: %+v", got)
	}
	la := got.LastAttempt
	if la == nil || la.N != 1 || la.Kind != gate.AttemptEffect || la.IdempotencyKey != op.IdempotencyKey ||
		la.Fence != 1 || la.Outcome != "" || la.FinishedAt != nil {
		t.Fatalf("LastAttempt = %+v, want attempt 1 started and unfinished", la)
	}
}

func TestCreateIsAtomic(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	op := newOperation("atomic")
	// The last step is off the table, so nothing of this change may remain.
	w := gate.Claiming(nil, op, gate.Lease{Owner: "a", Fence: 1, Expires: t0.Add(time.Minute)}, delivery("m-1", t0), "")
	err := l.Write(context.Background(), gate.ConfirmChange(w, []gate.Step{
		{Transition: gate.Transition{From: "", To: gate.StateReceived}},
		{Transition: gate.Transition{From: gate.StateReceived, To: gate.StateAcknowledged}},
	}, "r-1", "illegal", t0))
	if !errors.Is(err, storage.ErrRefused) {
		t.Fatalf("Create along an illegal edge: %v, want ErrRefused", err)
	}
	if n := countRows(t, pool, `SELECT (SELECT count(*) FROM operations) + (SELECT count(*) FROM deliveries) + (SELECT count(*) FROM transitions)`); n != 0 {
		t.Fatalf("a refused Create left %d rows behind", n)
	}
	if _, err := l.Find(context.Background(), op.ScopeKey); !errors.Is(err, gate.ErrNotFound) {
		t.Fatalf("Find after refused Create: %v, want ErrNotFound", err)
	}
}

func TestApplyFencing(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()
	op := newOperation("fenced")
	createPending(t, l, op)
	at := t0.Add(time.Minute)

	claim := func(fence int64) error {
		w := claiming(op.ID, gate.StatePendingEffect, fence, fmt.Sprintf("owner-%d", fence), at.Add(30*time.Second), nil)
		return l.Write(ctx, gate.IndeterminateChange(w,
			steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StateEffectIndeterminate), gate.LaneOperator, "claimed", at))
	}
	for _, fence := range []int64{0, 1} {
		if err := claim(fence); !errors.Is(err, gate.ErrFenced) {
			t.Fatalf("claim with fence %d over recorded 1: %v, want ErrFenced", fence, err)
		}
	}
	if err := claim(2); err != nil {
		t.Fatalf("claim with fence 2: %v", err)
	}
	got := mustFind(t, l, op.ScopeKey)
	if got.State != gate.StateEffectIndeterminate || got.Fence != 2 || got.Owner != "owner-2" ||
		!got.LeaseStart.Equal(at) || got.LeaseExtensions != 0 {
		t.Fatalf("after claim: %s fence %d owner %q lease start %v", got.State, got.Fence, got.Owner, got.LeaseStart)
	}

	// The first owner, still holding fence 1, tries to record its result: a
	// stale owner cannot commit, and nothing of its change lands.
	result := t0.Add(2 * time.Minute)
	err := l.Write(ctx, gate.ConfirmChange(
		settling(op.ID, gate.StateEffectIndeterminate, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "r-stale"}, 0),
		steps(t, gate.StateEffectIndeterminate, gate.StateEffectConfirmed, gate.StateAckPending), "r-stale", "stale", result))
	if !errors.Is(err, gate.ErrFenced) {
		t.Fatalf("stale owner's Apply: %v, want ErrFenced", err)
	}

	// The current fence with a wrong expectation is a state change, not a fence.
	err = l.Write(ctx, gate.ConfirmChange(settling(op.ID, gate.StatePendingEffect, 2, nil, 0),
		steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "r", "wrong state", result))
	if !errors.Is(err, gate.ErrStateChanged) {
		t.Fatalf("Write expecting pending_effect on an indeterminate operation: %v, want ErrStateChanged", err)
	}

	err = l.Write(ctx, gate.RetryLaterChange(settling("op_nobody", gate.StateReserved, 1, nil, 0), "nobody", result))
	if !errors.Is(err, gate.ErrNotFound) {
		t.Fatalf("Apply on a missing operation: %v, want ErrNotFound", err)
	}

	rec := mustGet(t, l, op.ID)
	if rec.State != gate.StateEffectIndeterminate || rec.ResultID != "" || rec.DeliveryCount != 1 || len(rec.Deliveries) != 1 ||
		rec.Attempts[0].Outcome != "" {
		t.Fatalf("refused Applies left traces: %s result %q, %d deliveries, attempt %+v",
			rec.State, rec.ResultID, len(rec.Deliveries), rec.Attempts[0])
	}
}

// A refusal in the middle of a pipelined change (here an edge the table does
// not have, after the guard passed) must take back everything before it.
func TestApplyIsAtomic(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	op := newOperation("half")
	createPending(t, l, op)

	w := claiming(op.ID, gate.StatePendingEffect, 2, "owner-b", t0.Add(time.Hour), delivery("m-2", t0.Add(time.Minute)))
	err := l.Write(context.Background(), gate.ConfirmChange(w, []gate.Step{
		{Transition: gate.Transition{From: gate.StatePendingEffect, To: gate.StateEffectConfirmed}},
		{Transition: gate.Transition{From: gate.StateEffectConfirmed, To: gate.StateAcknowledged}},
	}, "r", "should not stick", t0.Add(time.Minute)))
	if !errors.Is(err, storage.ErrRefused) {
		t.Fatalf("Apply along an illegal edge: %v, want ErrRefused", err)
	}
	rec := mustGet(t, l, op.ID)
	if rec.State != gate.StatePendingEffect || rec.Reason != "new operation" || rec.DeliveryCount != 1 || len(rec.Deliveries) != 1 || len(rec.Events) != 3 {
		t.Fatalf("half a change survived: %s reason %q, %d/%d deliveries, %d events",
			rec.State, rec.Reason, rec.DeliveryCount, len(rec.Deliveries), len(rec.Events))
	}

	// Finishing an attempt that was never started is refused the same way.
	err = l.Write(context.Background(), gate.RetryLaterChange(
		settling(op.ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 7, Outcome: gate.OutcomeUnknown}, 0),
		"should not stick", t0.Add(time.Minute)))
	if !errors.Is(err, storage.ErrRefused) {
		t.Fatalf("finishing attempt 7: %v, want ErrRefused", err)
	}
	if rec := mustGet(t, l, op.ID); rec.Reason != "new operation" {
		t.Fatalf("reason %q survived a refused change", rec.Reason)
	}
}

// Concurrent claims on one operation: the compare-and-set lets exactly one
// through, whatever the order they reach the server in.
func TestConcurrentClaimsOneWins(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	op := newOperation("race")
	createPending(t, l, op)

	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			w := claiming(op.ID, gate.StatePendingEffect, int64(2+i), fmt.Sprintf("owner-%d", i), t0.Add(time.Hour), nil)
			errs[i] = l.Write(context.Background(), gate.IndeterminateChange(w,
				steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StateEffectIndeterminate), gate.LaneOperator, "claim", t0.Add(time.Minute)))
		})
	}
	wg.Wait()
	winners := 0
	for i, err := range errs {
		switch {
		case err == nil:
			winners++
		case errors.Is(err, gate.ErrFenced), errors.Is(err, gate.ErrStateChanged):
		default:
			t.Errorf("claim %d: unexpected %v", i, err)
		}
	}
	if winners != 1 {
		t.Fatalf("%d claims won, want exactly 1", winners)
	}
	if rec := mustGet(t, l, op.ID); len(rec.Events) != 5 {
		t.Fatalf("%d events, want the 3 of creation and the 2 of one claim", len(rec.Events))
	}
}

// The whole life of an operation with one retry, then its evidence record.
func TestLifecycleEvidence(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()
	op := newOperation("life")
	createPending(t, l, op)

	// Attempt 1 timed out with a documented retryable answer.
	t1 := t0.Add(10 * time.Second)
	must(t, l.Write(ctx, gate.RetryLaterChange(
		settling(op.ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeRetryable, StatusCode: 503, Reason: "upstream busy"}, 0),
		"upstream busy", t1)))
	// A redelivery re-reserves under fence 2 and starts attempt 2: two edges
	// in one change, both logged.
	t2 := t0.Add(time.Minute)
	must(t, l.Write(ctx, gate.StartChange(
		claiming(op.ID, gate.StatePendingEffect, 2, "owner-b", t2.Add(30*time.Second), delivery("m-1", t2)),
		steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StatePendingEffect),
		&gate.Attempt{N: 2, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, StartedAt: t2},
		"retry after a documented failure", t2)))
	// Attempt 2 is confirmed and the ack goes out.
	t3 := t2.Add(2 * time.Second)
	must(t, l.Write(ctx, gate.ConfirmChange(
		settling(op.ID, gate.StatePendingEffect, 2, &gate.Attempt{N: 2, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "res-42"}, 1),
		steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "res-42", "downstream confirmed the effect", t3)))
	t4 := t3.Add(time.Millisecond)
	must(t, l.Write(ctx, gate.AckedChange(op.ID, gate.StateAckPending, 2, steps(t, gate.StateAckPending, gate.StateAcknowledged), t4)))

	got := mustFind(t, l, op.ScopeKey)
	if got.State != gate.StateAcknowledged || got.ResultID != "res-42" || !got.EvidenceAt.Equal(t3) || !got.AckedAt.Equal(t4) ||
		got.Reason != "downstream confirmed the effect" || got.LeaseExtensions != 1 || got.DeliveryCount != 2 || got.AttemptCount != 2 ||
		!got.FirstAttemptAt.Equal(t0) || !got.UpdatedAt.Equal(t4) || !got.CreatedAt.Equal(t0) {
		t.Fatalf("final operation: %+v", got)
	}
	if la := got.LastAttempt; la == nil || la.N != 2 || la.Outcome != gate.OutcomeConfirmed || la.ResultID != "res-42" ||
		la.Fence != 2 || la.FinishedAt == nil || !la.FinishedAt.Equal(t3) {
		t.Fatalf("LastAttempt = %+v, want attempt 2 confirmed", la)
	}

	rec := mustGet(t, l, op.ID)
	type ev struct {
		from, to gate.State
		at       time.Time
		fence    int64
		msg      string
	}
	want := []ev{
		{"", gate.StateReceived, t0, 1, "m-1"},
		{gate.StateReceived, gate.StateReserved, t0, 1, "m-1"},
		{gate.StateReserved, gate.StatePendingEffect, t0, 1, "m-1"},
		{gate.StatePendingEffect, gate.StateReserved, t2, 2, "m-1"},
		{gate.StateReserved, gate.StatePendingEffect, t2, 2, "m-1"},
		{gate.StatePendingEffect, gate.StateEffectConfirmed, t3, 2, ""},
		{gate.StateEffectConfirmed, gate.StateAckPending, t3, 2, ""},
		{gate.StateAckPending, gate.StateAcknowledged, t4, 2, ""},
	}
	if len(rec.Events) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(rec.Events), len(want), rec.Events)
	}
	for i, w := range want {
		e := rec.Events[i]
		if e.Seq != i+1 || e.From != w.from || e.To != w.to || !e.At.Equal(w.at) || e.Fence != w.fence ||
			e.MessageID != w.msg || e.Reason != "to "+string(w.to) {
			t.Errorf("event %d = %+v, want %+v", i+1, e, w)
		}
	}
	if len(rec.Attempts) != 2 || rec.Attempts[0].IdempotencyKey != op.IdempotencyKey ||
		rec.Attempts[1].IdempotencyKey != op.IdempotencyKey || rec.Attempts[0].Outcome != gate.OutcomeRetryable ||
		rec.Attempts[0].StatusCode != 503 || rec.Attempts[1].Fence != 2 {
		t.Fatalf("attempts: %+v", rec.Attempts)
	}
	if len(rec.Deliveries) != 2 || rec.Deliveries[1].MessageID != "m-1" || !rec.Deliveries[1].ReceivedAt.Equal(t2) ||
		rec.Deliveries[0].OperationID != op.ID {
		t.Fatalf("deliveries: %+v", rec.Deliveries)
	}
	if rec.LastAttempt == nil || rec.LastAttempt.N != 2 || len(rec.DeadLetters) != 0 {
		t.Fatalf("record: last attempt %+v, dead letters %+v", rec.LastAttempt, rec.DeadLetters)
	}
}

func TestApplyDeadLetterAndTerminal(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	op := newOperation("dead")
	createPending(t, l, op)
	at := t0.Add(time.Minute)
	must(t, l.Write(context.Background(), gate.TerminalChange(
		settling(op.ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeTerminal, StatusCode: 422, Reason: "rejected"}, 0),
		steps(t, gate.StatePendingEffect, gate.StateTerminalFailure),
		&gate.DeadLetter{Reason: "downstream rejected: 422"}, "downstream rejected: 422", at)))
	rec := mustGet(t, l, op.ID)
	if rec.State != gate.StateTerminalFailure || rec.Lane != "" || len(rec.DeadLetters) != 1 ||
		rec.DeadLetters[0].Reason != "downstream rejected: 422" || !rec.DeadLetters[0].At.Equal(at) ||
		rec.DeadLetters[0].OperationID != op.ID {
		t.Fatalf("terminal record: %s lane %q dead letters %+v", rec.State, rec.Lane, rec.DeadLetters)
	}
}

func TestFindReturnsNewestEffectAttempt(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()
	if _, err := l.Find(ctx, "acme/orders/message_id:/none"); !errors.Is(err, gate.ErrNotFound) {
		t.Fatalf("Find of an unknown key: %v, want ErrNotFound", err)
	}
	op := newOperation("lookup")
	createPending(t, l, op)
	at := t0.Add(time.Minute)
	// Attempt 1's response was lost; a lookup (attempt 2) is what runs next.
	must(t, l.Write(ctx, gate.StartChange(
		settling(op.ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown, Reason: "timeout"}, 0),
		nil, &gate.Attempt{N: 2, Kind: gate.AttemptLookup, IdempotencyKey: op.IdempotencyKey, StartedAt: at}, "lookup", at)))
	got := mustFind(t, l, op.ScopeKey)
	if la := got.LastAttempt; la == nil || la.N != 1 || la.Outcome != gate.OutcomeUnknown || la.Reason != "timeout" {
		t.Fatalf("LastAttempt = %+v, want effect attempt 1 (the lookup is not an effect)", la)
	}
	if got.AttemptCount != 2 || !got.FirstAttemptAt.Equal(t0) {
		t.Fatalf("attempt count %d, first attempt %v", got.AttemptCount, got.FirstAttemptAt)
	}
}

func TestRecordConflict(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	orig := newOperation("reused")
	createPending(t, l, orig)
	before := mustFind(t, l, orig.ScopeKey)

	rec := *orig
	rec.Fingerprint = "v1:fp-different"
	rec.ID = gate.ConflictID(rec.ScopeKey, rec.Fingerprint)
	rec.IdempotencyKey = "ik_conflict"
	rec.Reason = "key reused with a different fingerprint"
	var stored *gate.Operation
	for i, at := range []time.Time{t0.Add(time.Minute), t0.Add(2 * time.Minute)} {
		var err error
		stored, err = l.RecordConflict(ctx, &gate.Conflict{
			Original: orig, Record: &rec, Delivery: delivery(fmt.Sprintf("m-c%d", i), at),
			DeadLetter: &gate.DeadLetter{Reason: rec.Reason, At: at}, At: at,
		})
		if err != nil {
			t.Fatalf("RecordConflict #%d: %v", i+1, err)
		}
	}
	if stored.ID != rec.ID || stored.ConflictOf != orig.ID || stored.State != gate.StateConflicting ||
		stored.DeliveryCount != 2 || stored.Fingerprint != rec.Fingerprint || stored.ResultID != "" {
		t.Fatalf("stored conflict record: %+v", stored)
	}
	full := mustGet(t, l, rec.ID)
	if len(full.Events) != 2 || full.Events[0].To != gate.StateReceived || full.Events[1].To != gate.StateConflicting ||
		full.Events[1].MessageID != "m-c0" || len(full.DeadLetters) != 1 || !full.DeadLetters[0].At.Equal(t0.Add(time.Minute)) ||
		len(full.Deliveries) != 2 {
		t.Fatalf("conflict evidence: events %+v, dead letters %+v, %d deliveries", full.Events, full.DeadLetters, len(full.Deliveries))
	}

	after := mustFind(t, l, orig.ScopeKey)
	if after.ID != orig.ID || after.DeliveryCount != before.DeliveryCount || after.State != before.State ||
		!after.UpdatedAt.Equal(before.UpdatedAt) {
		t.Fatalf("the original changed: before %+v after %+v", before, after)
	}

	// A conflict record can never be claimed or executed.
	err := l.Write(ctx, gate.RetryLaterChange(claiming(rec.ID, gate.StateConflicting, 9, "x", t0.Add(time.Minute), nil), "claim", t0))
	if !errors.Is(err, gate.ErrNotFound) {
		t.Fatalf("Apply on a conflict record: %v, want ErrNotFound", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE operations SET conflict_of = NULL WHERE id = $1`, rec.ID); sqlState(err) == "" {
		t.Fatalf("turning a conflict record into an operation: %v, want refusal", err)
	}
}

func TestRecordDelivery(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()
	op := newOperation("again")
	createPending(t, l, op)

	d := delivery("m-1", t0.Add(time.Hour))
	d.OperationID, d.Decision, d.Anomaly = op.ID, gate.Ack, "redelivered after ack"
	must(t, l.RecordDelivery(ctx, d))
	rec := mustGet(t, l, op.ID)
	if rec.DeliveryCount != 2 || len(rec.Deliveries) != 2 || rec.Deliveries[1].Anomaly != "redelivered after ack" ||
		rec.Deliveries[1].Decision != gate.Ack || rec.State != gate.StatePendingEffect {
		t.Fatalf("after RecordDelivery: count %d, deliveries %+v", rec.DeliveryCount, rec.Deliveries)
	}

	d.OperationID = "op_missing"
	if err := l.RecordDelivery(ctx, d); !errors.Is(err, gate.ErrNotFound) {
		t.Fatalf("RecordDelivery for a missing operation: %v, want ErrNotFound", err)
	}
}

func TestGetUnknownIsErrNotFound(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	if _, err := l.Get(context.Background(), "op_missing"); !errors.Is(err, gate.ErrNotFound) {
		t.Fatalf("Get: %v, want ErrNotFound", err)
	}
}

// The round-trip budget: Find, Create, Apply and RecordDelivery are one round
// trip each once their statements are prepared on the connection.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	l, w := newCountingLedger(t)
	ctx := context.Background()
	measure := func(name string, want int64, fn func() error) {
		t.Helper()
		before := w.n.Load()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := w.n.Load() - before; got != want {
			t.Errorf("%s took %d round trips, want %d", name, got, want)
		}
	}
	// Warm up: the first use of each statement on the connection prepares it.
	warm := newOperation("warm")
	createPending(t, l, warm)
	mustFind(t, l, warm.ScopeKey)
	must(t, l.Write(ctx, finishConfirmed(t, warm.ID)))
	redelivery := func(id string) *gate.Delivery {
		d := delivery("m-1", t0.Add(time.Hour))
		d.OperationID, d.Decision = id, gate.Ack
		return d
	}
	must(t, l.RecordDelivery(ctx, redelivery(warm.ID)))

	op := newOperation("counted")
	measure("Create", 1, func() error { return createChange(t, l, op) })
	measure("Find", 1, func() error { _, err := l.Find(ctx, op.ScopeKey); return err })
	measure("Write", 1, func() error { return l.Write(ctx, finishConfirmed(t, op.ID)) })
	measure("RecordDelivery", 1, func() error { return l.RecordDelivery(ctx, redelivery(op.ID)) })
}

func finishConfirmed(t *testing.T, id string) *gate.Change {
	return gate.ConfirmChange(
		settling(id, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, StatusCode: 200, ResultID: "r"}, 0),
		steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "r", "confirmed", t0.Add(time.Second))
}

// fixtureChange records a listed operation's first commit: open, or terminal.
func fixtureChange(w gate.Writer, s []gate.Step, at time.Time) *gate.Change {
	if s[len(s)-1].To == gate.StateTerminalFailure {
		return gate.TerminalChange(w, s, nil, "fixture", at)
	}
	return gate.StartChange(w, s, nil, "fixture", at)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestListFiltersAndPages(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()

	// Ten operations a minute apart, plus two sharing one created_at so the id
	// has to break the tie. Every third is on another route and went terminal.
	var newestFirst []string
	for i := range 12 {
		op := newOperation(fmt.Sprintf("list-%02d", i))
		op.CreatedAt = t0.Add(time.Duration(min(i, 10)) * time.Minute)
		path := []gate.State{gate.StateReceived, gate.StateReserved, gate.StatePendingEffect}
		if i%3 == 0 {
			op.Route = "refunds"
			path = []gate.State{gate.StateReceived, gate.StateTerminalFailure}
		}
		w := gate.Claiming(nil, op, gate.Lease{Owner: "a", Fence: 1, Expires: op.CreatedAt.Add(time.Minute)},
			delivery(fmt.Sprintf("msg-%02d", i), op.CreatedAt), "")
		must(t, l.Write(ctx, fixtureChange(w, steps(t, "", path...), op.CreatedAt)))
		newestFirst = append([]string{op.ID}, newestFirst...)
	}
	// list-10 and list-11 share created_at; ids order them, newest (greatest) first.
	if newestFirst[0] != "op_list-11" || newestFirst[1] != "op_list-10" {
		t.Fatalf("fixture order assumption broken: %v", newestFirst[:2])
	}

	var paged []string
	cursor, pages := "", 0
	for {
		ops, next, err := l.List(ctx, adminapi.ListFilter{Limit: 5, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, op := range ops {
			paged = append(paged, op.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if pages != 3 || fmt.Sprint(paged) != fmt.Sprint(newestFirst) {
		t.Fatalf("paged in %d pages: %v\nwant 3 pages of %v", pages, paged, newestFirst)
	}

	count := func(f adminapi.ListFilter) []string {
		t.Helper()
		ops, next, err := l.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if next != "" {
			t.Fatalf("filter %+v: unexpected next page", f)
		}
		ids := make([]string, len(ops))
		for i, op := range ops {
			ids[i] = op.ID
		}
		return ids
	}
	if got := count(adminapi.ListFilter{Route: "refunds"}); fmt.Sprint(got) != "[op_list-09 op_list-06 op_list-03 op_list-00]" {
		t.Errorf("route filter: %v", got)
	}
	if got := count(adminapi.ListFilter{Route: "orders", State: string(gate.StateTerminalFailure)}); len(got) != 0 {
		t.Errorf("route+state filter: %v, want none", got)
	}
	if got := count(adminapi.ListFilter{State: string(gate.StatePendingEffect)}); len(got) != 8 {
		t.Errorf("state filter: %d operations, want 8", len(got))
	}
	if got := count(adminapi.ListFilter{MessageID: "msg-04"}); fmt.Sprint(got) != "[op_list-04]" {
		t.Errorf("message id filter: %v", got)
	}
	if got := count(adminapi.ListFilter{Key: "list-07"}); fmt.Sprint(got) != "[op_list-07]" {
		t.Errorf("key filter: %v", got)
	}
	if got := count(adminapi.ListFilter{Limit: 1000}); len(got) != 12 {
		t.Errorf("limit above the cap: %d operations", len(got))
	}

	for _, bad := range []adminapi.ListFilter{{State: "processed"}, {Cursor: "%%%"}, {Cursor: "bm9jb2xvbg"}} {
		if _, _, err := l.List(ctx, bad); !errors.Is(err, adminapi.ErrInvalidFilter) {
			t.Errorf("List(%+v): %v, want ErrInvalidFilter", bad, err)
		}
	}
}

func TestListLimitDefaultsAndCaps(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	// One more than the cap.
	for i := range 501 {
		createPending(t, l, newOperation(fmt.Sprintf("bulk-%03d", i)))
	}
	if n := countRows(t, pool, `SELECT count(*) FROM operations`); n != 501 {
		t.Fatalf("%d operations", n)
	}
	ops, next, err := l.List(ctx, adminapi.ListFilter{})
	if err != nil || len(ops) != 50 || next == "" {
		t.Fatalf("default page: %d operations, next %q, %v", len(ops), next, err)
	}
	ops, next, err = l.List(ctx, adminapi.ListFilter{Limit: 10_000})
	if err != nil || len(ops) != 500 || next == "" {
		t.Fatalf("capped page: %d operations, next %q, %v", len(ops), next, err)
	}
}
