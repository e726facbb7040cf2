package storage_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/gate/gatetest"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
)

func handoffOp(name string) *gate.Operation {
	op := newOperation(name)
	op.Shape = gate.ShapeHandoff
	return op
}

// handedOffMessage is what a handoff route's outbox keeps of message msg.
func handedOffMessage(msg string) *gate.Message {
	return &gate.Message{Broker: gate.BrokerPubSub, Source: "projects/p/subscriptions/orders", MessageID: msg,
		Data: []byte(`{"n":1}`), Attributes: map[string]string{"region": "eu"}, OrderingKey: "customer-7",
		PublishTime: t0.Add(-time.Minute)}
}

// creatingHandoff is the claim of a handoff route's first delivery: the
// operation created pending its effect, with the outbox entry its relay
// will deliver, and the broker acked.
func creatingHandoff(t testing.TB, op *gate.Operation, m *gate.Message, at time.Time) *gate.Change {
	t.Helper()
	d := delivery(m.MessageID, 1, at)
	d.Decision, d.PublishTime = gate.Ack, &m.PublishTime
	w := gate.Claiming(nil, op, gate.Lease{Owner: "owner-a", Fence: 1, Expires: at.Add(30 * time.Second)}, d)
	e := &gate.OutboxEntry{OperationID: op.ID, Route: op.Route, PublicationID: op.IdempotencyKey, Message: m,
		CreatedAt: at, NextAttemptAt: at}
	return gate.HandoffChange(w, steps(t, "", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect), e,
		"handed off to the relay", at)
}

// Relays polling at once, two in each of two replicas (a pool each), never
// take the same entry, and between them take every due one of their
// routes, and no other.
func TestOutboxClaimsNeverOverlap(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	const n = 60
	for i := range n + 5 {
		op := handoffOp(fmt.Sprintf("relay-%02d", i))
		if i >= n {
			op.Route = "elsewhere"
		}
		create(t, l, creatingHandoff(t, op, handedOffMessage(fmt.Sprintf("m-%02d", i)), t0))
	}
	other, err := storage.OpenPool(ctx, pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	ledgers := []*storage.Ledger{l, storage.NewLedger(other)}
	var (
		mu     sync.Mutex
		seen   []string
		wg     sync.WaitGroup
		start  = make(chan struct{})
		errs   = make(chan error, 4)
		routes = []string{"orders"}
	)
	for _, rl := range ledgers {
		for range 2 {
			wg.Go(func() {
				<-start
				for {
					got, err := rl.ClaimOutbox(ctx, routes, 7, time.Minute)
					if err != nil {
						errs <- err
						return
					}
					if len(got) == 0 {
						return
					}
					mu.Lock()
					for _, e := range got {
						seen = append(seen, e.OperationID)
					}
					mu.Unlock()
				}
			})
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	slices.Sort(seen)
	distinct := slices.Compact(slices.Clone(seen))
	if len(seen) != n || len(distinct) != n || slices.ContainsFunc(seen, func(id string) bool { return id >= "op_relay-60" }) {
		t.Fatalf("%d claims of %d distinct entries, want %d each, all of orders", len(seen), len(distinct), n)
	}
	// Each is held for the horizon: nothing of orders is due now.
	if got, err := l.ClaimOutbox(ctx, routes, 100, time.Minute); err != nil || len(got) != 0 {
		t.Fatalf("claimed again inside the horizon: %d, %v", len(got), err)
	}
}

// An entry is created with its operation, taken by the relay while the
// effect is open, held off by a reschedule, and emptied by the sweep once
// the effect is evidenced. The entries of operations that ended otherwise
// keep their message for a replay, and no relay takes them.
func TestOutboxEntryLifecycle(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	op := handoffOp("lifecycle")
	m := handedOffMessage("m-1")
	create(t, l, creatingHandoff(t, op, m, t0))
	if got := mustFind(t, l, op.ID); got.State != gate.StatePendingEffect || got.HandedOffAt == nil || !got.HandedOffAt.Equal(t0) ||
		got.AttemptCount != 0 {
		t.Fatalf("handed-off operation: %+v", got)
	}

	got, err := l.ClaimOutbox(ctx, []string{"orders"}, 10, 0)
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %d, %v", len(got), err)
	}
	e := got[0]
	if e.OperationID != op.ID || e.Route != "orders" || e.PublicationID != op.IdempotencyKey || e.Passes != 1 ||
		!e.CreatedAt.Equal(t0) || string(e.Message.Data) != `{"n":1}` || e.Message.Attributes["region"] != "eu" ||
		len(e.Message.Attributes) != 1 || e.Message.MessageID != "m-1" || e.Message.OrderingKey != "customer-7" ||
		!e.Message.PublishTime.Equal(m.PublishTime) || e.Message.Broker != gate.BrokerPubSub || e.Message.Source != m.Source {
		t.Fatalf("entry %+v / %+v", e, e.Message)
	}
	stats, err := l.OutboxStats(ctx)
	if err != nil || len(stats) != 1 || stats[0].Route != "orders" || stats[0].Depth != 1 || !stats[0].Oldest.Equal(t0) {
		t.Fatalf("stats %+v, %v", stats, err)
	}
	// Not evidenced yet: the sweep leaves it; the pass's reschedule holds
	// it off, and one to the past makes it due again. A reschedule is a
	// compare-and-set on the schedule its pass claimed: once the schedule
	// has moved, a pass's reschedule does nothing.
	if n, err := l.SweepOutbox(ctx, 100); err != nil || n != 0 {
		t.Fatalf("sweep before the effect: %d, %v", n, err)
	}
	hold := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	must(t, l.RescheduleOutbox(ctx, op.ID, e.NextAttemptAt, hold))
	if got, err := l.ClaimOutbox(ctx, []string{"orders"}, 10, 0); err != nil || len(got) != 0 {
		t.Fatalf("a rescheduled entry was due: %d, %v", len(got), err)
	}
	must(t, l.RescheduleOutbox(ctx, op.ID, e.NextAttemptAt, t0))
	if got, err := l.ClaimOutbox(ctx, []string{"orders"}, 10, 0); err != nil || len(got) != 0 {
		t.Fatalf("a reschedule against a schedule that had moved applied: %d, %v", len(got), err)
	}
	must(t, l.RescheduleOutbox(ctx, op.ID, hold, t0))
	if got, err := l.ClaimOutbox(ctx, []string{"orders"}, 10, 0); err != nil || len(got) != 1 || got[0].Passes != 2 {
		t.Fatalf("a rescheduled entry due again: %+v, %v", got, err)
	}

	// The relay takes the operation, starts attempt 1, and the effect is
	// confirmed: the entry is no longer due, and the sweep empties it.
	at := t0.Add(time.Minute)
	must(t, l.Write(ctx, gate.StartChange(claiming(op.ID, gate.StatePendingEffect, 2, "relay", at, nil),
		steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StatePendingEffect),
		&gate.Attempt{N: 1, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, Fence: 2, StartedAt: at}, "relay", at)))
	if got, err := l.ClaimOutbox(ctx, []string{"orders"}, 10, 0); err != nil || len(got) != 1 {
		t.Fatalf("an entry whose attempt is open: %d, %v; want it due", len(got), err)
	}
	must(t, l.Write(ctx, gate.ConfirmChange(
		gate.Settling(&gate.Operation{ID: op.ID, State: gate.StatePendingEffect}, 2,
			&gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "pub-1"}, nil, gate.LeaseFacts{Deadline: at}),
		steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "pub-1", "published", at)))
	if got, err := l.ClaimOutbox(ctx, []string{"orders"}, 10, 0); err != nil || len(got) != 0 {
		t.Fatalf("an evidenced entry was due: %d, %v", len(got), err)
	}
	if n, err := l.SweepOutbox(ctx, 100); err != nil || n != 1 {
		t.Fatalf("sweep after the effect: %d, %v", n, err)
	}
	if n, err := l.SweepOutbox(ctx, 100); err != nil || n != 0 {
		t.Fatalf("a second sweep: %d, %v", n, err)
	}
	var emptied bool
	if err := pool.QueryRow(ctx, `SELECT data IS NULL AND attributes IS NULL AND delivered_at IS NOT NULL FROM outbox WHERE operation_id = $1`,
		op.ID).Scan(&emptied); err != nil || !emptied {
		t.Fatalf("after the sweep the message is still kept: %v", err)
	}
	if stats, err := l.OutboxStats(ctx); err != nil || len(stats) != 0 {
		t.Fatalf("stats after delivery %+v, %v", stats, err)
	}

	// Ended without evidence: terminal, or parked as indeterminate.
	ended := map[string]func(id string, at time.Time) *gate.Change{
		"terminal": func(id string, at time.Time) *gate.Change {
			return gate.TerminalChange(claiming(id, gate.StatePendingEffect, 2, "relay", at, nil),
				steps(t, gate.StatePendingEffect, gate.StateTerminalFailure), &gate.DeadLetter{Reason: "refused"}, "refused", at)
		},
		"indeterminate": func(id string, at time.Time) *gate.Change {
			return gate.IndeterminateChange(claiming(id, gate.StatePendingEffect, 2, "relay", at, nil),
				steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StateEffectIndeterminate), gate.LaneOperator, "lost", at)
		},
	}
	for name, change := range ended {
		o := handoffOp(name)
		create(t, l, creatingHandoff(t, o, handedOffMessage("m-"+name), t0))
		must(t, l.Write(ctx, change(o.ID, at)))
	}
	if got, err := l.ClaimOutbox(ctx, []string{"orders"}, 10, 0); err != nil || len(got) != 0 {
		t.Fatalf("entries of ended operations were due: %d, %v", len(got), err)
	}
	if n, err := l.SweepOutbox(ctx, 100); err != nil || n != 0 {
		t.Fatalf("the sweep emptied %d entries of ended operations, %v", n, err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM outbox WHERE data IS NOT NULL AND delivered_at IS NULL`); n != 2 {
		t.Fatalf("%d entries keep their message for a replay, want 2", n)
	}

	// What an ended entry keeps lasts no longer than its operation: past
	// retention the purge takes the terminal one's message with it. The
	// parked one stays as long as its operation is unsettled, as the
	// operation itself does, and is counted as kept open.
	if _, err := pool.Exec(ctx, `UPDATE operations SET retain_until = now() - interval '1 second'
		WHERE id = ANY($1)`, []string{handoffOp("terminal").ID, handoffOp("indeterminate").ID}); err != nil {
		t.Fatal(err)
	}
	maint := storage.NewMaintenance(pool)
	purged, err := maint.PurgeBatch(ctx, 100)
	if err != nil || !slices.Equal(purged["orders"], []string{handoffOp("terminal").ID}) {
		t.Fatalf("purged %v, %v; want the terminal operation alone", purged, err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM outbox WHERE operation_id = '`+handoffOp("terminal").ID+`'`); n != 0 {
		t.Fatalf("the purged operation's outbox entry is still kept")
	}
	if n := countRows(t, pool, `SELECT count(*) FROM outbox WHERE operation_id = '`+handoffOp("indeterminate").ID+`' AND data IS NOT NULL`); n != 1 {
		t.Fatalf("the parked operation's entry lost its message before an operator settled it")
	}
	if kept, err := maint.KeptOpen(ctx); err != nil || kept["orders"] != 1 {
		t.Fatalf("kept open: %v, %v", kept, err)
	}
}

var tokens atomic.Int64

// A handoff route's private attributes reach neither the outbox nor any
// other row of the ledger: the gate, as production runs it (only the
// downstream faked), hands off, acks a redelivery from the ledger, and the
// relay delivers what the outbox kept.
func TestHandoffStoresNoPrivateAttribute(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.Redis(t)})
	t.Cleanup(func() { rdb.Close() })
	fx := &gatetest.Effects{Dedupe: true}
	g := &gate.Gate{Ledger: l, Reservations: storage.NewReservations(rdb), Effects: fx, Local: l,
		Owner: "gw-test", Now: time.Now, NewToken: func() string { return fmt.Sprint(tokens.Add(1)) }}
	route := &gate.Route{Name: "orders", Tenant: "t1", Broker: gate.BrokerPubSub, Shape: gate.ShapeHandoff,
		Key: gate.KeySource{Kind: gate.KeyMessageID}, Fingerprint: gate.FingerprintSpec{Version: 1, Data: true},
		Effect: gate.EffectSpec{Timeout: 5 * time.Second}, MaxAttempts: 3, DeadLetter: gate.DeadLetterGateway,
		AckDeadline: 10 * time.Second, Retention: 8 * 24 * time.Hour, ContractVersion: "v1", DedupeWindow: time.Hour,
		Private: []string{"secret"}}
	push := func() *gate.Result {
		t.Helper()
		res, err := g.Deliver(ctx, route, &gate.Message{Broker: gate.BrokerPubSub, Source: "projects/p/subscriptions/s",
			MessageID: "m-1", Data: []byte(`{"n":1}`), Attributes: map[string]string{"secret": "s3cr3t", "region": "eu"},
			PublishTime: time.Now().Add(-time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		res.Finish(ctx, nil, true)
		return res
	}
	res := push()
	if res.Decision != gate.Ack || fx.Calls() != 0 {
		t.Fatalf("%s (%s), %d calls", res.Decision, res.Reason, fx.Calls())
	}
	rec := mustGet(t, l, res.OperationID)
	var (
		pub   string
		data  []byte
		names []string
	)
	if err := pool.QueryRow(ctx, `SELECT publication_id, data, ARRAY(SELECT jsonb_object_keys(attributes) ORDER BY 1)
		FROM outbox WHERE operation_id = $1`, res.OperationID).Scan(&pub, &data, &names); err != nil {
		t.Fatal(err)
	}
	if pub != rec.IdempotencyKey || string(data) != `{"n":1}` || !slices.Equal(names, []string{"region"}) ||
		rec.HandedOffAt == nil || rec.State != gate.StatePendingEffect {
		t.Fatalf("entry %q %q %v, record %+v", pub, data, names, rec.Operation)
	}
	// A redelivery acks from the ledger, with no second entry.
	if res := push(); res.Decision != gate.Ack || fx.Calls() != 0 {
		t.Fatalf("redelivery: %s, %d calls", res.Decision, fx.Calls())
	}
	if n := countRows(t, pool, `SELECT count(*) FROM outbox`); n != 1 {
		t.Fatalf("%d entries", n)
	}
	// The relay delivers it once, from what the outbox kept.
	entries, err := l.ClaimOutbox(ctx, []string{"orders"}, 10, time.Minute)
	if err != nil || len(entries) != 1 {
		t.Fatalf("claim: %d, %v", len(entries), err)
	}
	if _, ok := entries[0].Message.Attributes["secret"]; ok {
		t.Fatalf("the relay was handed the private attribute: %v", entries[0].Message.Attributes)
	}
	out, err := g.Relay(ctx, route, entries[0])
	if err != nil {
		t.Fatal(err)
	}
	out.Finish(ctx, nil, true)
	if rec := mustGet(t, l, res.OperationID); out.Decision != gate.Ack || rec.State != gate.StateAcknowledged || fx.Calls() != 1 {
		t.Fatalf("relay: %s, %+v, %d calls", out.Decision, rec.Operation, fx.Calls())
	}
	if n, err := l.SweepOutbox(ctx, 10); err != nil || n != 1 {
		t.Fatalf("sweep: %d, %v", n, err)
	}
	// Nowhere in the ledger.
	if n := countRows(t, pool, `SELECT (SELECT count(*) FROM operations o WHERE o::text LIKE '%s3cr3t%')
		+ (SELECT count(*) FROM deliveries d WHERE d::text LIKE '%s3cr3t%') + (SELECT count(*) FROM attempts a WHERE a::text LIKE '%s3cr3t%')
		+ (SELECT count(*) FROM transitions x WHERE x::text LIKE '%s3cr3t%') + (SELECT count(*) FROM outbox e WHERE e::text LIKE '%s3cr3t%')`); n != 0 {
		t.Fatalf("the private attribute's value is in %d rows of the ledger", n)
	}
}

// An operator's retry-now makes a held-off entry due for the next relay
// pass, and a cancel takes it out of the relay's queue into the terminal
// lane; each is kept as an intervention under the operator's name, and
// neither applies where it would mean nothing or hide an effect.
func TestOutboxRetryNowAndCancel(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.Redis(t)})
	t.Cleanup(func() { rdb.Close() })
	res := storage.NewReservations(rdb)
	fx := &gatetest.Effects{Dedupe: true}
	g := &gate.Gate{Ledger: l, Reservations: res, Effects: fx, Local: l,
		Owner: "gw-test", Now: time.Now, NewToken: func() string { return fmt.Sprint(tokens.Add(1)) }}
	route := &gate.Route{Name: "orders", Tenant: "t1", Broker: gate.BrokerPubSub, Shape: gate.ShapeHandoff,
		Key: gate.KeySource{Kind: gate.KeyMessageID}, Fingerprint: gate.FingerprintSpec{Version: 1, Data: true},
		Effect: gate.EffectSpec{Timeout: 5 * time.Second}, MaxAttempts: 3, DeadLetter: gate.DeadLetterGateway,
		AckDeadline: 10 * time.Second, Retention: 8 * 24 * time.Hour, ContractVersion: "v1", DedupeWindow: time.Hour}
	out, err := g.Deliver(ctx, route, &gate.Message{Broker: gate.BrokerPubSub, Source: "projects/p/subscriptions/s",
		MessageID: "m-retry", Data: []byte(`{"n":1}`), PublishTime: time.Now().Add(-time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	out.Finish(ctx, nil, true)
	id := out.OperationID
	claim := func() []*gate.OutboxEntry {
		t.Helper()
		got, err := l.ClaimOutbox(ctx, []string{"orders"}, 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	stateOnPage := func() gate.State {
		t.Helper()
		page, err := l.OutboxPage(ctx, adminapi.OutboxFilter{Route: "orders"})
		if err != nil || len(page.Entries) != 1 || page.Entries[0].OperationID != id {
			t.Fatalf("outbox page: %+v, %v", page, err)
		}
		return page.Entries[0].State
	}

	// A pass takes the entry and, failing, holds it off for an hour;
	// retry-now makes it due.
	pass := claim()
	if len(pass) != 1 {
		t.Fatalf("a fresh handoff was not due: %d", len(pass))
	}
	must(t, l.RescheduleOutbox(ctx, id, pass[0].NextAttemptAt, time.Now().Add(time.Hour)))
	if got := claim(); len(got) != 0 {
		t.Fatalf("a held-off entry was due: %d", len(got))
	}
	if err := l.RetryOutbox(ctx, id, "console:alice", ""); !errors.Is(err, gate.ErrInvalidResolution) {
		t.Fatalf("retry without a reason: %v", err)
	}
	if err := l.RetryOutbox(ctx, "op_nosuch", "console:alice", "downstream is back"); !errors.Is(err, gate.ErrNotFound) {
		t.Fatalf("retry of no entry: %v", err)
	}
	must(t, l.RetryOutbox(ctx, id, "console:alice", "downstream is back"))
	// A pass that was out when the operator asked, finishing after it: its
	// backoff does not undo the retry.
	must(t, l.RescheduleOutbox(ctx, id, pass[0].NextAttemptAt, time.Now().Add(time.Hour)))
	if got := claim(); len(got) != 1 || got[0].OperationID != id {
		t.Fatalf("after retry-now the entry was not due: %d", len(got))
	}
	if s := stateOnPage(); s != gate.StatePendingEffect {
		t.Fatalf("outbox page state %s", s)
	}
	rec := mustGet(t, l, id)
	if n := len(rec.Interventions); n != 1 || rec.Interventions[0].Kind != gate.OutboxRetryNow ||
		rec.Interventions[0].Actor != "console:alice" || rec.Interventions[0].Reason != "downstream is back" ||
		rec.Interventions[0].From != gate.StatePendingEffect || rec.Interventions[0].To != gate.StatePendingEffect {
		t.Fatalf("interventions after retry-now: %+v", rec.Interventions)
	}

	// A relay pass holding the lease: cancel waits for it.
	lease, err := res.Acquire(ctx, id, "relay-x", time.Minute, rec.Fence)
	if err != nil {
		t.Fatal(err)
	}
	cancel := gate.Resolution{Kind: gate.ResolveCancel, Actor: "console:bob", Reason: "customer withdrew the order"}
	if _, _, err := g.Resolve(ctx, id, cancel); !errors.Is(err, gate.ErrHeld) {
		t.Fatalf("cancel under a relay's lease: %v", err)
	}
	must(t, res.Release(ctx, lease))

	op, changed, err := g.Resolve(ctx, id, cancel)
	if err != nil || !changed || op.State != gate.StateTerminalFailure {
		t.Fatalf("cancel: %+v, %v, %v", op, changed, err)
	}
	if _, changed, err := g.Resolve(ctx, id, cancel); err != nil || changed {
		t.Fatalf("the same cancel again: changed %v, %v", changed, err)
	}
	if got := claim(); len(got) != 0 {
		t.Fatalf("a cancelled entry was due: %d", len(got))
	}
	if s := stateOnPage(); s != gate.StateTerminalFailure {
		t.Fatalf("outbox page state after cancel %s", s)
	}
	if err := l.RetryOutbox(ctx, id, "console:alice", "try again"); !errors.Is(err, gate.ErrRefused) {
		t.Fatalf("retry of a cancelled entry: %v", err)
	}
	rec = mustGet(t, l, id)
	last := rec.Interventions[len(rec.Interventions)-1]
	if len(rec.Interventions) != 2 || last.Kind != gate.ResolveCancel || last.Actor != "console:bob" ||
		last.From != gate.StatePendingEffect || last.To != gate.StateTerminalFailure || len(rec.DeadLetters) != 1 {
		t.Fatalf("after cancel: interventions %+v, dead letters %+v", rec.Interventions, rec.DeadLetters)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM outbox WHERE operation_id = $1 AND data IS NOT NULL AND delivered_at IS NULL`, id); n != 1 {
		t.Fatalf("the cancelled entry did not keep its message for a replay")
	}
	// Cancel is not a way to end what already ended.
	if _, _, err := g.Resolve(ctx, id, gate.Resolution{Kind: gate.ResolveCancel, Actor: "console:bob", Reason: "again"}); !errors.Is(err, gate.ErrRefused) {
		t.Fatalf("cancel of a terminal operation: %v", err)
	}

	// A replay hands it back to the relay at once, whatever backoff its
	// last failed pass had set.
	if _, err := pool.Exec(ctx, `UPDATE outbox SET next_attempt_at = now() + interval '5 minutes' WHERE operation_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Resolve(ctx, id, gate.Resolution{Kind: gate.ResolveReplay, Actor: "console:bob", Reason: "order reinstated"}); err != nil {
		t.Fatal(err)
	}
	if got := claim(); len(got) != 1 {
		t.Fatalf("a replayed entry was not due: %d", len(got))
	}
}
