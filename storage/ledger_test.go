package storage_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/storage"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The Postgres ledger beyond what the conformance cases hold for every
// ledger: what concurrency, the server's own rows and the admin reads add.

// Creating claims of one id racing from several connections: the INSERT
// ... ON CONFLICT lets exactly one create the operation; every other finds
// it, and its delivery is recorded under the next number, with no number
// skipped or taken twice. Claims with another fingerprint, racing with
// further ones, find it and count nothing.
func TestConcurrentCreatingClaimsOfOneID(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	// Each ledger groups only its own callers' steps, and never two steps
	// of one operation in one statement: with several, the claims meet in
	// the server, on separate connections.
	ledgers := []*storage.Ledger{l, storage.NewLedger(pool), storage.NewLedger(pool), storage.NewLedger(pool)}
	op := newOperation("race")
	other := *op
	other.Fingerprint = "v1:fp-other"

	type outcome struct {
		op      *gate.Operation
		created bool
		err     error
	}
	race := func(claims []*gate.Change) []outcome {
		out := make([]outcome, len(claims))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, c := range claims {
			wg.Go(func() {
				<-start
				got, created, err := ledgers[i%len(ledgers)].Claim(ctx, c)
				out[i] = outcome{got, created, err}
			})
		}
		close(start)
		wg.Wait()
		return out
	}

	const first = 16
	var claims []*gate.Change
	for i := range first {
		claims = append(claims, creating(t, op, fmt.Sprintf("m-%02d", i), t0.Add(time.Duration(i)*time.Millisecond)))
	}
	numbered := map[int]string{} // delivery number -> message id
	winner := ""
	for i, o := range race(claims) {
		msg := claims[i].Claim.Delivery.MessageID
		switch {
		case o.err != nil:
			t.Fatalf("claim %s: %v", msg, o.err)
		case o.created:
			if winner != "" {
				t.Fatalf("both %s and %s created the operation", winner, msg)
			}
			winner, numbered[1] = msg, msg
			if o.op != nil {
				t.Fatalf("the creating claim returned %+v, want no operation", o.op)
			}
		default:
			if o.op.ID != op.ID || o.op.Fence != 1 || o.op.LastAttempt == nil || o.op.LastAttempt.N != 1 {
				t.Fatalf("claim %s found %+v", msg, o.op)
			}
			if prev, taken := numbered[o.op.DeliveryCount]; taken {
				t.Fatalf("claims %s and %s both counted as delivery %d", prev, msg, o.op.DeliveryCount)
			}
			numbered[o.op.DeliveryCount] = msg
		}
	}
	if winner == "" {
		t.Fatal("no claim created the operation")
	}

	// A second wave, after the creation: further deliveries and contenders
	// with another fingerprint, at once.
	claims = nil
	for i := range 12 {
		o := op
		if i%3 == 2 {
			o = &other
		}
		claims = append(claims, creating(t, o, fmt.Sprintf("m-again-%02d", i), t0.Add(time.Minute)))
	}
	for i, o := range race(claims) {
		msg := claims[i].Claim.Delivery.MessageID
		if o.err != nil || o.created || o.op.Fingerprint != op.Fingerprint {
			t.Fatalf("claim %s: %+v, created %v, %v", msg, o.op, o.created, o.err)
		}
		if claims[i].Claim.Row.Fingerprint != op.Fingerprint {
			continue
		}
		if prev, taken := numbered[o.op.DeliveryCount]; taken {
			t.Fatalf("claims %s and %s both counted as delivery %d", prev, msg, o.op.DeliveryCount)
		}
		numbered[o.op.DeliveryCount] = msg
	}

	total := first
	for _, c := range claims {
		if c.Claim.Row.Fingerprint == op.Fingerprint {
			total++
		}
	}
	rec := mustGet(t, l, op.ID)
	if rec.DeliveryCount != total || len(rec.Deliveries) != total || len(numbered) != total {
		t.Fatalf("%d deliveries counted, %d recorded, %d numbers handed out; want %d", rec.DeliveryCount, len(rec.Deliveries), len(numbered), total)
	}
	for i, d := range rec.Deliveries {
		if d.N != i+1 || d.MessageID != numbered[d.N] {
			t.Errorf("delivery %d: number %d, message %s; the claim that got number %d was %s", i, d.N, d.MessageID, d.N, numbered[d.N])
		}
		if i > 0 && (d.Found != gate.StatePendingEffect || d.Fence != 0 || d.Decision != "") {
			t.Errorf("further delivery %+v", d)
		}
	}
	if rec.TraceID != "trace-"+winner || rec.Owner != "owner-a" || rec.AttemptCount != 1 || len(rec.Events) != 3 {
		t.Fatalf("the operation is not the winner's as it created it: %+v, %d events", rec.Operation, len(rec.Events))
	}
}

// Later deliveries taking one operation at once, each under its own higher
// fence, from several connections: the compare-and-set lets exactly one
// through whatever order they reach the server in, and the others are
// told why not; only the winner's steps are logged.
func TestConcurrentTakeoversOneWins(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	ledgers := []*storage.Ledger{l, storage.NewLedger(pool), storage.NewLedger(pool), storage.NewLedger(pool)}
	op := newOperation("takeover")
	createPending(t, l, op)
	const n = 16
	changes := make([]*gate.Change, n)
	for i := range n {
		d := redeliver(t, l, op, fmt.Sprintf("m-%02d", i), t0.Add(time.Minute))
		changes[i] = gate.IndeterminateChange(claiming(op.ID, gate.StatePendingEffect, int64(2+i), fmt.Sprintf("owner-%d", i), t0.Add(time.Minute), d),
			steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StateEffectIndeterminate), gate.LaneOperator, "claim", t0.Add(time.Minute))
	}
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range changes {
		wg.Go(func() {
			<-start
			errs[i] = ledgers[i%len(ledgers)].Write(ctx, c)
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Fatalf("claims %d and %d both won", winner, i)
			}
			winner = i
		case errors.Is(err, gate.ErrFenced), errors.Is(err, gate.ErrStateChanged):
		default:
			t.Errorf("claim %d: unexpected %v", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no claim won")
	}
	rec := mustGet(t, l, op.ID)
	if rec.State != gate.StateEffectIndeterminate || rec.Fence != int64(2+winner) || rec.Owner != fmt.Sprintf("owner-%d", winner) ||
		len(rec.Events) != 5 || rec.Events[3].Fence != rec.Fence || rec.Events[4].Fence != rec.Fence {
		t.Fatalf("after the race: %+v, events %+v", rec.Operation, rec.Events)
	}
	marked := 0
	for _, d := range rec.Deliveries[1:] {
		if d.Fence != 0 {
			marked++
			if d.Fence != rec.Fence || d.MessageID != fmt.Sprintf("m-%02d", winner) {
				t.Errorf("delivery %+v marked, but the winner took fence %d", d, rec.Fence)
			}
		}
	}
	if marked != 1 {
		t.Fatalf("%d deliveries marked with a fence, want the winner's", marked)
	}
}

// FindByID, like Claim, reads the newest effect attempt: the first from
// the operation's row, later ones from the attempts beside it; a lookup is
// an attempt, counted, but never the latest effect.
func TestFindByIDReturnsTheNewestEffectAttempt(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()
	op := newOperation("newest")
	op.SpanID, op.Tenant = "span-1", "acme"
	createPending(t, l, op)
	check := func(step string, n int, count int, outcome gate.Outcome, fence int64, contract string) *gate.Operation {
		t.Helper()
		got := mustFind(t, l, op.ID)
		la := got.LastAttempt
		if la == nil || la.N != n || la.Kind != gate.AttemptEffect || la.Outcome != outcome || la.Fence != fence ||
			la.ContractVersion != contract || la.IdempotencyKey != op.IdempotencyKey {
			t.Fatalf("%s: last attempt %+v, want effect attempt %d (%q, fence %d, contract %s)", step, la, n, outcome, fence, contract)
		}
		if got.AttemptCount != count || got.FirstAttemptAt == nil || !got.FirstAttemptAt.Equal(t0) {
			t.Fatalf("%s: %d attempts, first at %v; want %d, first at %v", step, got.AttemptCount, got.FirstAttemptAt, count, t0)
		}
		// The list reads the same attempt.
		ops, _, err := l.List(ctx, adminapi.ListFilter{Key: op.Key, ByKey: []string{op.ID}})
		if err != nil || len(ops) != 1 || !sameAttempt(ops[0].LastAttempt, la) {
			t.Fatalf("%s: listed %+v, %v; want last attempt %+v", step, ops, err, la)
		}
		return got
	}
	got := check("created", 1, 1, "", 1, "contract-1")
	if got.LastAttempt.FinishedAt != nil || got.LeaseDeadline == nil || !got.LeaseDeadline.Equal(t0.Add(30*time.Second)) ||
		!got.RetainUntil.Equal(op.RetainUntil) || got.KeySource != op.KeySource || got.Shape != op.Shape || got.SpanID != "span-1" ||
		got.ScopeKey != op.ScopeKey || got.Tenant != "acme" || got.DeadLetterPolicy != op.DeadLetterPolicy ||
		got.ContractVersion != op.ContractVersion || got.FingerprintVersion != 1 || got.IdempotencyKey != op.IdempotencyKey {
		t.Fatalf("the operation did not round-trip: %+v", got)
	}

	// Attempt 1's response is lost: the operation parks.
	t1 := t0.Add(time.Second)
	must(t, l.Write(ctx, gate.IndeterminateChange(
		settling(op.ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown, Reason: "timeout"}, 1),
		steps(t, gate.StatePendingEffect, gate.StateEffectIndeterminate), gate.LaneOperator, "lost", t1)))
	if got := check("lost", 1, 1, gate.OutcomeUnknown, 1, "contract-1"); !got.LastAttempt.FinishedAt.Equal(t1) || got.LastAttempt.Reason != "timeout" {
		t.Fatalf("attempt 1 finished %v (%q)", got.LastAttempt.FinishedAt, got.LastAttempt.Reason)
	}

	// Two lookups by the reconciler: unavailable, then definitely absent,
	// which reopens the operation with one attempt granted.
	lookup := func(n int, at time.Time, o gate.Outcome) *gate.Attempt {
		done := at.Add(time.Millisecond)
		return &gate.Attempt{N: n, Kind: gate.AttemptLookup, IdempotencyKey: op.IdempotencyKey, ContractVersion: "contract-1",
			StartedAt: at, FinishedAt: &done, Outcome: o, StatusCode: 503, Reason: string(o)}
	}
	intervening := func(from gate.State, fence int64) gate.Writer {
		return gate.Intervening(&gate.Operation{ID: op.ID, State: from}, gate.Lease{Owner: "reconciler", Fence: fence})
	}
	t2, t3 := t0.Add(time.Minute), t0.Add(2*time.Minute)
	next := t2.Add(time.Minute)
	must(t, l.Write(ctx, gate.ReconcileChange(intervening(gate.StateEffectIndeterminate, 2), nil,
		lookup(2, t2, gate.OutcomeUnknown), "", 0, &next, 1, "lookup could not tell", t2)))
	check("after a lookup", 1, 2, gate.OutcomeUnknown, 1, "contract-1")
	must(t, l.Write(ctx, gate.ReconcileChange(intervening(gate.StateEffectIndeterminate, 3),
		steps(t, gate.StateEffectIndeterminate, gate.StatePendingEffect), lookup(3, t3, gate.OutcomeAbsent), "", 4, nil, 0,
		"the effect is absent", t3)))
	check("after two lookups", 1, 3, gate.OutcomeUnknown, 1, "contract-1")

	// A redelivery makes the granted attempt, under a newer contract.
	t4 := t0.Add(3 * time.Minute)
	d := redeliver(t, l, op, "m-2", t4)
	must(t, l.Write(ctx, gate.StartChange(claiming(op.ID, gate.StatePendingEffect, 4, "owner-b", t4, d),
		steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StatePendingEffect),
		&gate.Attempt{N: 4, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, Fence: 4, ContractVersion: "contract-2",
			StartedAt: t4}, "granted", t4)))
	check("attempt 4 started", 4, 4, "", 4, "contract-2")
	t5 := t4.Add(time.Second)
	must(t, l.Write(ctx, gate.ConfirmChange(
		settling(op.ID, gate.StatePendingEffect, 4, &gate.Attempt{N: 4, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "res-4"}, d.N),
		steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "res-4", "confirmed", t5)))
	if got := check("attempt 4 confirmed", 4, 4, gate.OutcomeConfirmed, 4, "contract-2"); got.LastAttempt.ResultID != "res-4" ||
		!got.LastAttempt.FinishedAt.Equal(t5) || got.ResultID != "res-4" {
		t.Fatalf("after the confirmation: %+v / %+v", got, got.LastAttempt)
	}

	rec := mustGet(t, l, op.ID)
	var kinds []string
	for _, a := range rec.Attempts {
		kinds = append(kinds, fmt.Sprintf("%d %s %s %s", a.N, a.Kind, a.Outcome, a.ContractVersion))
		if a.IdempotencyKey != op.IdempotencyKey {
			t.Errorf("attempt %d has idempotency key %q", a.N, a.IdempotencyKey)
		}
	}
	want := []string{"1 effect unknown contract-1", "2 lookup unknown contract-1", "3 lookup absent contract-1", "4 effect confirmed contract-2"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("attempts %v, want %v", kinds, want)
	}
}

func sameAttempt(a, b *gate.Attempt) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, y := *a, *b
	if (x.FinishedAt == nil) != (y.FinishedAt == nil) || (x.FinishedAt != nil && !x.FinishedAt.Equal(*y.FinishedAt)) ||
		!x.StartedAt.Equal(y.StartedAt) {
		return false
	}
	x.FinishedAt, y.FinishedAt, x.StartedAt, y.StartedAt = nil, nil, time.Time{}, time.Time{}
	return x == y
}

// A conflict record is written once however often its message comes
// back: each later delivery is numbered on it, the gateway's dead letter
// is kept once, the original is never touched, and nothing can make the
// record move or execute.
func TestRecordConflict(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	orig := newOperation("reused")
	createPending(t, l, orig)
	before := mustFind(t, l, orig.ID)

	rec := *orig
	rec.Fingerprint = "v1:fp-different"
	rec.ID = gate.ConflictID(rec.ScopeKey, rec.Fingerprint)
	rec.IdempotencyKey = "ik_conflict"
	rec.Reason = "key reused with a different fingerprint"
	t1 := t0.Add(time.Minute)
	rec.CreatedAt = t1
	var stored *gate.Operation
	for i := range 3 {
		at := t1.Add(time.Duration(i) * time.Minute)
		d := delivery(fmt.Sprintf("m-c%d", i), 0, at)
		d.Decision, d.Reason = gate.Ack, "dead-lettered: key reused"
		var err error
		stored, err = l.RecordConflict(ctx, &gate.Conflict{Original: orig, Record: &rec, Delivery: d,
			DeadLetter: &gate.DeadLetter{Reason: rec.Reason, At: at}, At: at})
		if err != nil {
			t.Fatalf("RecordConflict #%d: %v", i+1, err)
		}
	}
	if stored.ID != rec.ID || stored.ConflictOf != orig.ID || stored.State != gate.StateConflicting || stored.Fence != 0 ||
		stored.DeliveryCount != 3 || stored.Fingerprint != rec.Fingerprint || stored.ResultID != "" || !stored.CreatedAt.Equal(t1) ||
		stored.IdempotencyKey != "ik_conflict" || stored.TraceID != "trace-m-c0" || stored.Reason != rec.Reason {
		t.Fatalf("stored conflict record: %+v", stored)
	}
	full := mustGet(t, l, rec.ID)
	for i, d := range full.Deliveries {
		if d.N != i+1 || d.MessageID != fmt.Sprintf("m-c%d", i) || d.Decision != gate.Ack || d.Fence != 0 ||
			!d.ReceivedAt.Equal(t1.Add(time.Duration(i)*time.Minute)) || (i > 0 && d.Found != gate.StateConflicting) {
			t.Errorf("delivery %d of the conflict record: %+v", i, d)
		}
	}
	if len(full.Deliveries) != 3 || len(full.DeadLetters) != 1 || !full.DeadLetters[0].At.Equal(t1) {
		t.Fatalf("conflict evidence: %d deliveries, dead letters %+v", len(full.Deliveries), full.DeadLetters)
	}
	if len(full.Events) != 2 || full.Events[0].To != gate.StateReceived || full.Events[1].From != gate.StateReceived ||
		full.Events[1].To != gate.StateConflicting || full.Events[1].Fence != 0 || !full.Events[1].At.Equal(t1) ||
		full.Events[1].Reason != rec.Reason {
		t.Fatalf("conflict record's history: %+v", full.Events)
	}

	after := mustFind(t, l, orig.ID)
	if after.DeliveryCount != before.DeliveryCount || after.State != before.State || !after.UpdatedAt.Equal(before.UpdatedAt) ||
		after.Fence != before.Fence || after.Reason != before.Reason {
		t.Fatalf("the original changed: before %+v after %+v", before, after)
	}
	if n := len(mustGet(t, l, orig.ID).Deliveries); n != 1 {
		t.Fatalf("the original has %d deliveries", n)
	}

	// Nothing moves a conflict record: not a change, not a raw statement.
	err := l.Write(ctx, gate.RetryLaterChange(claiming(rec.ID, gate.StateConflicting, 9, "x", t1, nil), "claim", t1))
	if !errors.Is(err, gate.ErrNotFound) {
		t.Fatalf("Write on a conflict record: %v, want ErrNotFound", err)
	}
	for _, sql := range []string{
		`UPDATE operations SET conflict_of = NULL, state = 'pending_effect', waiting = NULL, fence = 1 WHERE id = $1`,
		`UPDATE operations SET conflict_of = NULL WHERE id = $1`,
		`UPDATE operations SET state = 'terminal_failure', waiting = 'terminal_failure' WHERE id = $1`,
	} {
		if _, err := pool.Exec(ctx, sql, rec.ID); sqlState(err) == "" {
			t.Errorf("%s: %v, want the schema's refusal", sql, err)
		}
	}
}

// An id no operation has, or none can have, is not found.
func TestGetUnknownIsErrNotFound(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()
	for _, id := range []string{"op_missing", "op_\x00nul", "op_\xffbad"} {
		if _, err := l.Get(ctx, id); !errors.Is(err, gate.ErrNotFound) {
			t.Errorf("Get(%q): %v, want ErrNotFound", id, err)
		}
		if _, _, err := l.FindByID(ctx, id); !errors.Is(err, gate.ErrNotFound) {
			t.Errorf("FindByID(%q): %v, want ErrNotFound", id, err)
		}
	}
}

// listIDs is one List page's ids, and its cursor.
func listIDs(t *testing.T, l *storage.Ledger, f adminapi.ListFilter) ([]string, string) {
	t.Helper()
	ops, next, err := l.List(context.Background(), f)
	if err != nil {
		t.Fatalf("List(%+v): %v", f, err)
	}
	ids := make([]string, len(ops))
	for i, op := range ops {
		ids[i] = op.ID
	}
	return ids, next
}

func TestListFiltersAndPages(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	maint := storage.NewMaintenance(pool)

	// Twelve operations a minute apart, the last two at the same time: a
	// third of them on refunds, terminal at once; the rest on orders, open,
	// and then some of them settled in different ways.
	var newestFirst []string
	ops := map[string]*gate.Operation{}
	for i := range 12 {
		op := newOperation(fmt.Sprintf("list-%02d", i))
		op.CreatedAt = t0.Add(time.Duration(min(i, 10)) * time.Minute)
		msg := fmt.Sprintf("msg-%02d", i)
		if i%3 == 0 {
			op.Route = "refunds"
			create(t, l, creatingTerminal(t, op, msg, op.CreatedAt, nil))
		} else {
			create(t, l, creating(t, op, msg, op.CreatedAt))
		}
		ops[op.Key] = op
		newestFirst = append([]string{op.ID}, newestFirst...)
	}
	at := t0.Add(time.Hour)
	must(t, l.Write(ctx, confirm(t, ops["list-01"], "res-01", at)))
	must(t, l.Write(ctx, acked(t, ops["list-01"], 1, at)))
	must(t, l.Write(ctx, confirm(t, ops["list-04"], "res-04", at)))
	must(t, l.Write(ctx, gate.IndeterminateChange(
		settling(ops["list-02"].ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown}, 1),
		steps(t, gate.StatePendingEffect, gate.StateEffectIndeterminate), gate.LaneOperator, "lost", at)))

	// The sweep moves the open work so far into the lanes; what arrives
	// after it is younger than its cursor.
	for range 2 {
		if _, err := maint.Sweep(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	// An operation on a route keyed on an attribute, first delivered as
	// msg-p1 and then as msg-p2; a conflict record that reused list-04's
	// key; one more open operation.
	pay := newOperation("pay-1")
	pay.Route, pay.KeySource, pay.Key, pay.ScopeKey = "payments", gate.KeyAttribute, "order-1", "acme/payments/attribute:order/order-1"
	create(t, l, creating(t, pay, "msg-p1", at))
	redeliver(t, l, pay, "msg-p2", at.Add(time.Second))
	cf := *ops["list-04"]
	cf.Fingerprint, cf.IdempotencyKey, cf.Reason, cf.CreatedAt = "v1:fp-other", "ik_cf", "key reused", at
	cf.ID = gate.ConflictID(cf.ScopeKey, cf.Fingerprint)
	if _, err := l.RecordConflict(ctx, &gate.Conflict{Original: ops["list-04"], Record: &cf, Delivery: delivery("msg-04", 0, at), At: at}); err != nil {
		t.Fatal(err)
	}
	young := newOperation("young")
	create(t, l, creating(t, young, "msg-young", at))
	newestFirst = append([]string{young.ID, cf.ID, pay.ID}, newestFirst...)

	// Pages of five, newest first, in arrival order (list-10 and list-11
	// share their time), stable while another operation arrives mid-way.
	var paged []string
	cursor, pages := "", 0
	for {
		ids, next := listIDs(t, l, adminapi.ListFilter{Limit: 5, Cursor: cursor})
		pages++
		paged = append(paged, ids...)
		if pages == 1 {
			create(t, l, creating(t, newOperation("arrived-mid-way"), "msg-late", at))
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if pages != 3 || !slices.Equal(paged, newestFirst) {
		t.Fatalf("paged in %d pages: %v\nwant 3 pages of %v", pages, paged, newestFirst)
	}

	id := func(keys ...string) []string {
		var out []string
		for _, k := range keys {
			out = append(out, ops[k].ID)
		}
		return out
	}
	for _, c := range []struct {
		name string
		f    adminapi.ListFilter
		want []string
	}{
		{"route", adminapi.ListFilter{Route: "refunds"}, id("list-09", "list-06", "list-03", "list-00")},
		{"route and state", adminapi.ListFilter{Route: "orders", State: string(gate.StateTerminalFailure)}, nil},
		{"terminal", adminapi.ListFilter{State: string(gate.StateTerminalFailure)}, id("list-09", "list-06", "list-03", "list-00")},
		// Swept into the lanes, and younger than the sweep, together.
		{"open", adminapi.ListFilter{State: string(gate.StatePendingEffect)},
			append([]string{"op_arrived-mid-way", young.ID, pay.ID}, id("list-11", "list-10", "list-08", "list-07", "list-05")...)},
		{"open on a route", adminapi.ListFilter{Route: "orders", State: string(gate.StatePendingEffect)},
			append([]string{"op_arrived-mid-way", young.ID}, id("list-11", "list-10", "list-08", "list-07", "list-05")...)},
		{"indeterminate", adminapi.ListFilter{State: string(gate.StateEffectIndeterminate)}, id("list-02")},
		{"confirmed, not acked", adminapi.ListFilter{State: string(gate.StateAckPending)}, id("list-04")},
		{"acknowledged", adminapi.ListFilter{State: string(gate.StateAcknowledged)}, id("list-01")},
		{"conflicting", adminapi.ListFilter{State: string(gate.StateConflicting)}, []string{cf.ID}},
		{"reserved", adminapi.ListFilter{State: string(gate.StateReserved)}, nil},
		// A key names one operation per route, and its conflict records.
		{"key", adminapi.ListFilter{Key: "list-07", ByKey: []string{ops["list-07"].ID, "op_other-route"}}, id("list-07")},
		{"key with a conflict", adminapi.ListFilter{Key: "list-04", ByKey: []string{ops["list-04"].ID}}, []string{cf.ID, ops["list-04"].ID}},
		{"key on another route", adminapi.ListFilter{Route: "refunds", Key: "list-07", ByKey: []string{"op_refunds-list-07"}}, nil},
		// A message id: by the ids it names on message-keyed routes, by
		// the first delivery on others, by any further delivery.
		{"message id", adminapi.ListFilter{MessageID: "msg-07", ByMessage: []string{ops["list-07"].ID}}, id("list-07")},
		{"message id with a conflict", adminapi.ListFilter{MessageID: "msg-04", ByMessage: []string{ops["list-04"].ID}},
			[]string{cf.ID, ops["list-04"].ID}},
		{"first delivery on an attribute-keyed route", adminapi.ListFilter{MessageID: "msg-p1"}, []string{pay.ID}},
		{"further delivery", adminapi.ListFilter{MessageID: "msg-p2", ByMessage: []string{"op_msg-p2-elsewhere"}}, []string{pay.ID}},
		{"message id and state", adminapi.ListFilter{MessageID: "msg-p2", State: string(gate.StateAcknowledged)}, nil},
		{"message id nobody sent", adminapi.ListFilter{MessageID: "msg-none", ByMessage: []string{"op_none"}}, nil},
	} {
		got, next := listIDs(t, l, c.f)
		if !slices.Equal(got, c.want) || next != "" {
			t.Errorf("%s: %v (next %q), want %v", c.name, got, next, c.want)
		}
	}
	if got, _ := listIDs(t, l, adminapi.ListFilter{Limit: 1000}); len(got) != len(newestFirst)+1 {
		t.Errorf("a limit above the cap listed %d operations, want all %d", len(got), len(newestFirst)+1)
	}

	for _, bad := range []adminapi.ListFilter{{State: "processed"}, {Cursor: "%%%"}, {Cursor: "bm9jb2xvbg"}, {Cursor: "cy0x"},
		{Route: "r\x00"}, {Key: "k\x00", ByKey: []string{"op_k"}}, {MessageID: "\xff"}} {
		if _, _, err := l.List(ctx, bad); !errors.Is(err, adminapi.ErrInvalidFilter) {
			t.Errorf("List(%#v): %v, want ErrInvalidFilter", bad, err)
		}
	}
}

func TestListLimitDefaultsAndCaps(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	// One more than the cap, created eight at a time.
	const n = 501
	var wg sync.WaitGroup
	errs := make([]error, n)
	claims := make([]*gate.Change, n)
	for i := range n {
		claims[i] = creating(t, newOperation(fmt.Sprintf("bulk-%03d", i)), "m-1", t0)
	}
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				_, _, errs[i] = l.Claim(ctx, claims[i])
			}
		})
	}
	wg.Wait()
	must(t, errors.Join(errs...))
	if got := countRows(t, pool, `SELECT count(*) FROM operations`); got != n {
		t.Fatalf("%d operations", got)
	}
	ops, next, err := l.List(ctx, adminapi.ListFilter{})
	if err != nil || len(ops) != 50 || next == "" {
		t.Fatalf("default page: %d operations, next %q, %v", len(ops), next, err)
	}
	ops, next, err = l.List(ctx, adminapi.ListFilter{Limit: 10_000})
	if err != nil || len(ops) != 500 || next == "" {
		t.Fatalf("capped page: %d operations, next %q, %v", len(ops), next, err)
	}
	last, next, err := l.List(ctx, adminapi.ListFilter{Limit: 10_000, Cursor: next})
	if err != nil || len(last) != 1 || next != "" || slices.ContainsFunc(ops, func(o gate.Operation) bool { return o.ID == last[0].ID }) {
		t.Fatalf("the page after the cap: %d operations, next %q, %v", len(last), next, err)
	}
}

// event is what a test expects of one entry of a record's history.
type event struct {
	from, to gate.State
	at       time.Time
	fence    int64
	msg      string
	reason   string
}

func checkEvents(t *testing.T, got []adminapi.Event, want []event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		e := got[i]
		if e.Seq != i+1 || e.From != w.from || e.To != w.to || !e.At.Equal(w.at) || e.Fence != w.fence ||
			e.MessageID != w.msg || e.Reason != w.reason {
			t.Errorf("event %d = %+v, want %+v", i+1, e, w)
		}
	}
}

// The history of an operation on the common path is built from its row:
// the claim's three steps at its creation, the evidence's two at the
// evidence time and the ack at the ack time, each under its fence; and
// nothing else was written for it.
func TestHistoryOfTheCommonPath(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	op := newOperation("common")
	createPending(t, l, op)
	t1, t2 := t0.Add(2*time.Second), t0.Add(3*time.Second)
	must(t, l.Write(ctx, confirm(t, op, "res-1", t1)))
	must(t, l.Write(ctx, acked(t, op, 1, t2)))
	rec := mustGet(t, l, op.ID)
	confirmed := "downstream confirmed the effect"
	checkEvents(t, rec.Events, []event{
		{"", gate.StateReceived, t0, 1, "", gate.ReasonNewOperation},
		{gate.StateReceived, gate.StateReserved, t0, 1, "", gate.ReasonNewOperation},
		{gate.StateReserved, gate.StatePendingEffect, t0, 1, "", gate.ReasonNewOperation},
		{gate.StatePendingEffect, gate.StateEffectConfirmed, t1, 1, "", confirmed},
		{gate.StateEffectConfirmed, gate.StateAckPending, t1, 1, "", confirmed},
		{gate.StateAckPending, gate.StateAcknowledged, t2, 1, "", gate.ReasonAckWritten},
	})
	if rec.State != gate.StateAcknowledged || !rec.EvidenceAt.Equal(t1) || !rec.AckedAt.Equal(t2) || !rec.UpdatedAt.Equal(t2) ||
		len(rec.Deliveries) != 1 || rec.Deliveries[0].Decision != gate.Ack || rec.Deliveries[0].Fence != 1 || len(rec.Attempts) != 1 {
		t.Fatalf("record %+v, deliveries %+v, attempts %+v", rec.Operation, rec.Deliveries, rec.Attempts)
	}
	if n := countRows(t, pool, `SELECT (SELECT count(*) FROM transitions) + (SELECT count(*) FROM deliveries)
		+ (SELECT count(*) FROM attempts) + (SELECT count(*) FROM lease_events) + (SELECT count(*) FROM dead_letters)
		+ (SELECT count(*) FROM interventions)`); n != 0 {
		t.Fatalf("the common path wrote %d side rows", n)
	}

	// Terminal at its creation: received, then terminal, with its reason.
	term := newOperation("terminal")
	create(t, l, creatingTerminal(t, term, "m-t", t1, &gate.DeadLetter{Reason: "refused"}))
	checkEvents(t, mustGet(t, l, term.ID).Events, []event{
		{"", gate.StateReceived, t1, 1, "", "refused: " + term.ID},
		{gate.StateReceived, gate.StateTerminalFailure, t1, 1, "", "refused: " + term.ID},
	})
}

// An operation that left the common path keeps every later step in its
// log, after the steps of its creation: with the fence, the time and the
// claiming delivery's message id of each.
func TestHistoryOffTheCommonPath(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()
	op := newOperation("life")
	createPending(t, l, op)

	// Attempt 1 failed with a documented retryable answer.
	t1 := t0.Add(10 * time.Second)
	must(t, l.Write(ctx, gate.RetryLaterChange(
		settling(op.ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeRetryable, StatusCode: 503, Reason: "upstream busy"}, 1),
		"upstream busy", t1)))
	// A redelivery takes the operation under fence 2 and starts attempt 2:
	// two steps in one change, both logged.
	t2 := t0.Add(time.Minute)
	d := redeliver(t, l, op, "m-2", t2)
	must(t, l.Write(ctx, gate.StartChange(claiming(op.ID, gate.StatePendingEffect, 2, "owner-b", t2, d),
		steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StatePendingEffect),
		&gate.Attempt{N: 2, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, Fence: 2, StartedAt: t2},
		"retry after a documented failure", t2)))
	// Attempt 2 is confirmed and the ack goes out.
	t3 := t2.Add(2 * time.Second)
	must(t, l.Write(ctx, gate.ConfirmChange(
		gate.Settling(&gate.Operation{ID: op.ID, State: gate.StatePendingEffect}, 2,
			&gate.Attempt{N: 2, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "res-42"},
			&gate.Answer{N: d.N, Decision: gate.Ack}, gate.LeaseFacts{Extensions: 1, Deadline: t3}),
		steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "res-42", "downstream confirmed the effect", t3)))
	t4 := t3.Add(time.Millisecond)
	must(t, l.Write(ctx, acked(t, op, 2, t4)))

	got := mustFind(t, l, op.ID)
	if got.State != gate.StateAcknowledged || got.ResultID != "res-42" || !got.EvidenceAt.Equal(t3) || !got.AckedAt.Equal(t4) ||
		got.Reason != "downstream confirmed the effect" || got.LeaseExtensions != 1 || got.DeliveryCount != 2 || got.AttemptCount != 2 ||
		!got.FirstAttemptAt.Equal(t0) || !got.UpdatedAt.Equal(t4) || !got.CreatedAt.Equal(t0) || got.Fence != 2 || got.Owner != "owner-b" {
		t.Fatalf("final operation: %+v", got)
	}
	if la := got.LastAttempt; la == nil || la.N != 2 || la.Outcome != gate.OutcomeConfirmed || la.ResultID != "res-42" ||
		la.Fence != 2 || la.FinishedAt == nil || !la.FinishedAt.Equal(t3) {
		t.Fatalf("last attempt %+v, want attempt 2 confirmed", la)
	}
	rec := mustGet(t, l, op.ID)
	checkEvents(t, rec.Events, []event{
		{"", gate.StateReceived, t0, 1, "", gate.ReasonNewOperation},
		{gate.StateReceived, gate.StateReserved, t0, 1, "", gate.ReasonNewOperation},
		{gate.StateReserved, gate.StatePendingEffect, t0, 1, "", gate.ReasonNewOperation},
		{gate.StatePendingEffect, gate.StateReserved, t2, 2, "m-2", "to reserved"},
		{gate.StateReserved, gate.StatePendingEffect, t2, 2, "m-2", "to pending_effect"},
		{gate.StatePendingEffect, gate.StateEffectConfirmed, t3, 2, "", "to effect_confirmed"},
		{gate.StateEffectConfirmed, gate.StateAckPending, t3, 2, "", "to ack_pending"},
		{gate.StateAckPending, gate.StateAcknowledged, t4, 2, "", "to acknowledged"},
	})
	if len(rec.Attempts) != 2 || rec.Attempts[0].Outcome != gate.OutcomeRetryable || rec.Attempts[0].StatusCode != 503 ||
		rec.Attempts[1].Fence != 2 || rec.Attempts[1].IdempotencyKey != op.IdempotencyKey {
		t.Fatalf("attempts: %+v", rec.Attempts)
	}
	if len(rec.Deliveries) != 2 || rec.Deliveries[1].MessageID != "m-2" || !rec.Deliveries[1].ReceivedAt.Equal(t2) ||
		rec.Deliveries[1].Fence != 2 || rec.Deliveries[1].Decision != gate.Ack || rec.Deliveries[0].Decision != gate.Nack ||
		rec.Deliveries[0].OperationID != op.ID || len(rec.DeadLetters) != 0 {
		t.Fatalf("deliveries: %+v, dead letters %+v", rec.Deliveries, rec.DeadLetters)
	}
}

// waiting is where an operation's row sits: "" off the lanes' index.
func waiting(t *testing.T, pool *pgxpool.Pool, id string) string {
	t.Helper()
	var w string
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(waiting, '') FROM operations WHERE id = $1`, id).Scan(&w); err != nil {
		t.Fatalf("waiting of %s: %v", id, err)
	}
	return w
}

// The sweep moves open work that outlived every owner's bound into the
// lanes, once: work still young, acknowledged work and work already in a
// lane stay where they are. Its bound is counted in passes, not read off a
// clock: a pass notes where the ledger is, and a later pass whose bound
// reaches back to that note sweeps up to it.
func TestSweepMovesOldOpenWorkIntoTheLanes(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	m := storage.NewMaintenance(pool)
	sweep := func(after time.Duration) int64 {
		t.Helper()
		n, err := m.Sweep(ctx, after)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	open, confirmed, done, parked := newOperation("open"), newOperation("confirmed"), newOperation("done"), newOperation("parked")
	for _, op := range []*gate.Operation{open, confirmed, done, parked} {
		createPending(t, l, op)
	}
	must(t, l.Write(ctx, confirm(t, confirmed, "res-c", t0)))
	must(t, l.Write(ctx, confirm(t, done, "res-d", t0)))
	must(t, l.Write(ctx, acked(t, done, 1, t0)))
	must(t, l.Write(ctx, gate.IndeterminateChange(
		settling(parked.ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown}, 1),
		steps(t, gate.StatePendingEffect, gate.StateEffectIndeterminate), gate.LaneOperator, "lost", t0)))

	if n := sweep(0); n != 0 {
		t.Fatalf("the first pass swept %d operations: it only notes where the ledger is", n)
	}
	if n := sweep(time.Hour); n != 0 {
		t.Fatalf("a pass whose bound reaches no note swept %d operations", n)
	}
	young := newOperation("young")
	createPending(t, l, young)
	if n := sweep(0); n != 2 {
		t.Fatalf("swept %d operations, want the open and the confirmed one", n)
	}
	for id, want := range map[string]string{open.ID: "open", confirmed.ID: "open", done.ID: "", parked.ID: "effect_indeterminate", young.ID: ""} {
		if got := waiting(t, pool, id); got != want {
			t.Errorf("%s waits in %q, want %q", id, got, want)
		}
	}
	page, err := l.LanePage(ctx, adminapi.LaneFilter{State: gate.StatePendingEffect})
	if err != nil || len(page.Entries) != 2 || page.Entries[0].ID != open.ID || page.Entries[1].ID != young.ID {
		t.Fatalf("open lane: %+v, %v; want the swept one, then the young one", page.Entries, err)
	}
	totals, err := l.LaneTotals(ctx, []string{"orders"}, []gate.State{gate.StatePendingEffect, gate.StateAckPending, gate.StateAcknowledged})
	if err != nil || fmt.Sprint(totals) != "[{orders pending_effect 2 false} {orders ack_pending 1 false} {orders acknowledged 1 false} {orders outbox 0 false}]" {
		t.Fatalf("lane totals after the sweep: %v, %v", totals, err)
	}

	// The young one is swept by the pass after the one that saw it, and
	// nothing is swept twice.
	if n := sweep(0); n != 1 || waiting(t, pool, young.ID) != "open" {
		t.Fatalf("the next pass swept %d operations; young waits in %q", n, waiting(t, pool, young.ID))
	}
	if n := sweep(0); n != 0 {
		t.Fatalf("a pass over swept work swept %d operations", n)
	}
	// Swept work finishes as any other and leaves the lanes at its ack.
	must(t, l.Write(ctx, confirm(t, open, "res-o", t0)))
	must(t, l.Write(ctx, acked(t, open, 1, t0)))
	if w := waiting(t, pool, open.ID); w != "" {
		t.Fatalf("acknowledged work waits in %q", w)
	}
	page, err = l.LanePage(ctx, adminapi.LaneFilter{State: gate.StatePendingEffect})
	if err != nil || len(page.Entries) != 1 || page.Entries[0].ID != young.ID {
		t.Fatalf("open lane after the ack: %+v, %v", page.Entries, err)
	}
}

// The retention purge removes settled operations whose retention ran out,
// oldest first, with everything recorded beside them; open work, retained
// work and an original whose conflict record is still retained stay.
func TestPurgeRemovesExpiredSettledOperations(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	m := storage.NewMaintenance(pool)
	expired, kept := time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	op := func(name string, until time.Time) *gate.Operation {
		o := newOperation(name)
		o.RetainUntil = until
		return o
	}
	ackedOp := func(o *gate.Operation) {
		t.Helper()
		createPending(t, l, o)
		must(t, l.Write(ctx, confirm(t, o, "res", t0)))
		must(t, l.Write(ctx, acked(t, o, 1, t0)))
	}
	conflict := func(orig *gate.Operation, until time.Time) *gate.Operation {
		t.Helper()
		rec := *orig
		rec.Fingerprint, rec.RetainUntil, rec.Reason = "v1:fp-other", until, "key reused"
		rec.ID = gate.ConflictID(rec.ScopeKey, rec.Fingerprint)
		if _, err := l.RecordConflict(ctx, &gate.Conflict{Original: orig, Record: &rec, Delivery: delivery("m-c", 0, t0),
			DeadLetter: &gate.DeadLetter{Reason: "key reused"}, At: t0}); err != nil {
			t.Fatal(err)
		}
		return &rec
	}

	a1 := op("acked-1", expired)
	ackedOp(a1)
	redeliver(t, l, a1, "m-again", t0) // a further delivery
	t1 := op("terminal-1", expired)
	create(t, l, creatingTerminal(t, t1, "m-t", t0, &gate.DeadLetter{Reason: "refused"}))
	p1 := op("open-1", expired)
	createPending(t, l, p1)
	i1 := op("indeterminate-1", expired)
	createPending(t, l, i1)
	must(t, l.Write(ctx, gate.IndeterminateChange(
		settling(i1.ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown}, 1),
		steps(t, gate.StatePendingEffect, gate.StateEffectIndeterminate), gate.LaneOperator, "lost", t0)))
	k1 := op("retained-1", kept)
	ackedOp(k1)
	o2 := op("original-2", expired)
	ackedOp(o2)
	c2 := conflict(o2, expired)
	o3 := op("original-3", expired)
	ackedOp(o3)
	c3 := conflict(o3, kept)
	o4 := op("original-4", kept)
	ackedOp(o4)
	c4 := conflict(o4, expired)

	purge := func(limit int) []string {
		t.Helper()
		got, err := m.PurgeBatch(ctx, limit)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > 1 {
			t.Fatalf("purged on routes %v, want orders only", got)
		}
		return got["orders"]
	}
	for i, want := range [][]string{{a1.ID}, {t1.ID}, {o2.ID, c2.ID}, {c4.ID}, nil} {
		limit := 1
		if i >= 3 {
			limit = 10
		}
		if got := purge(limit); !slices.Equal(got, want) {
			t.Fatalf("purge #%d (limit %d): %v, want %v", i+1, limit, got, want)
		}
	}
	var left []string
	rows, err := pool.Query(ctx, `SELECT id FROM operations ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{p1.ID, i1.ID, k1.ID, o3.ID, c3.ID, o4.ID}; !slices.Equal(left, want) {
		t.Fatalf("left %v, want %v", left, want)
	}
	gone := []string{a1.ID, t1.ID, o2.ID, c2.ID, c4.ID}
	if n := countRows(t, pool, `SELECT (SELECT count(*) FROM deliveries WHERE operation_id = ANY($1))
		+ (SELECT count(*) FROM attempts WHERE operation_id = ANY($1)) + (SELECT count(*) FROM transitions WHERE operation_id = ANY($1))
		+ (SELECT count(*) FROM dead_letters WHERE operation_id = ANY($1)) + (SELECT count(*) FROM lease_events WHERE operation_id = ANY($1))
		+ (SELECT count(*) FROM interventions WHERE operation_id = ANY($1))`, gone); n != 0 {
		t.Fatalf("%d side rows of purged operations are left", n)
	}
	// The open ones are what the purge keeps past their retention.
	if _, err := m.Sweep(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Sweep(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if kept, err := m.KeptOpen(ctx); err != nil || kept["orders"] != 2 {
		t.Fatalf("kept open: %v, %v; want the open and the indeterminate one", kept, err)
	}
}

// The ledger's sessions price sequential scans out, which puts a statement
// that has to scan past the cost where Postgres compiles it with LLVM on
// every run: a tiny poison table's purge took most of a second. No
// statement of the gateway's is worth compiling, so none may be.
func TestLedgerSessionsNeverCompileAPlan(t *testing.T) {
	t.Parallel()
	_, pool := newLedger(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// A table with no index, so the only plan scans it.
	if _, err := conn.Exec(ctx, `CREATE TEMP TABLE few (x int); INSERT INTO few VALUES (1), (2)`); err != nil {
		t.Fatal(err)
	}
	var plan string
	if err := conn.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM few`).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan, `"Seq Scan"`) {
		t.Fatalf("the check needs a plan that scans, got %s", plan)
	}
	if strings.Contains(plan, `"JIT"`) {
		t.Errorf("a ledger session compiled a plan: %s", plan)
	}
}
