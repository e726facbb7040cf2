package gatetest

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// LedgerHarness is one ledger under test and a way to read everything it
// recorded about an operation.
type LedgerHarness struct {
	Ledger  gate.Ledger
	Inspect func(t *testing.T, id string) Snapshot
}

// RunLedger runs the ledger conformance cases. newHarness returns an empty
// ledger for each case.
func RunLedger(t *testing.T, newHarness func(t *testing.T) LedgerHarness) {
	for _, c := range ledgerCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newHarness(t))
		})
	}
}

// ReservationsHarness is one reservation store under test. Wait lets time
// pass for it (a real sleep, or a fake clock's advance); Flush loses all its
// data, as a Redis restart without persistence does.
type ReservationsHarness struct {
	Reservations gate.Reservations
	Wait         func(d time.Duration)
	Flush        func()
}

// RunReservations runs the reservation conformance cases.
func RunReservations(t *testing.T, newHarness func(t *testing.T) ReservationsHarness) {
	for _, c := range reservationCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newHarness(t))
		})
	}
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newOp(name string) *gate.Operation {
	return &gate.Operation{
		ID: "op_" + name, ScopeKey: "t1|orders|" + name, Tenant: "t1", Route: "orders",
		KeySource: gate.KeyMessageID, Key: name, Fingerprint: "fp-" + name, FingerprintVersion: 1,
		Shape: gate.ShapeIdempotent, DeadLetterPolicy: gate.DeadLetterBroker, ContractVersion: "v1",
		IdempotencyKey: "ik-" + name, CreatedAt: t0, RetainUntil: t0.AddDate(0, 0, 8),
	}
}

func delivery(msg string, n int, at time.Time) *gate.Delivery {
	return &gate.Delivery{N: n, Broker: gate.BrokerPubSub, Source: "projects/p/subscriptions/s", MessageID: msg,
		ReceivedAt: at, TraceID: "trace-" + msg}
}

func steps(t *testing.T, from gate.State, to ...gate.State) []gate.Step {
	t.Helper()
	edges, err := gate.Path(from, to...)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]gate.Step, len(edges))
	for i, e := range edges {
		out[i] = gate.Step{Transition: e, Reason: "to " + string(e.To)}
	}
	return out
}

func lease(owner string, fence int64, at time.Time) gate.Lease {
	return gate.Lease{Key: "k", Owner: owner, Fence: fence, Expires: at.Add(30 * time.Second)}
}

// creating is the claim a first delivery makes of op: received, reserved,
// intent and attempt 1 recorded under fence 1.
func creating(t *testing.T, op *gate.Operation, msg string) *gate.Change {
	t.Helper()
	w := gate.Claiming(nil, op, lease("owner-a", 1, t0), delivery(msg, 1, t0))
	c := gate.StartChange(w, steps(t, "", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect),
		&gate.Attempt{N: 1, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, ContractVersion: op.ContractVersion,
			StartedAt: t0}, "new operation", t0)
	c.Claim.AckedAnswer = &gate.Answer{Decision: gate.Ack, Reason: "redelivered after the ack was sent", Anomaly: "redelivered_after_ack"}
	return c
}

// start creates op as a first delivery does.
func start(t *testing.T, l gate.Ledger, op *gate.Operation) {
	t.Helper()
	create(t, l, creating(t, op, "m-1"))
}

// create makes c, a creating claim of an operation nobody has, which
// creates it and, as gate.Ledger.Claim says, returns no operation: the
// delivery holds it as c describes it.
func create(t *testing.T, l gate.Ledger, c *gate.Change) {
	t.Helper()
	got, created, err := l.Claim(context.Background(), c)
	if err != nil || !created || got != nil {
		t.Fatalf("create %s: %+v, created %v, %v; want created with no operation returned", c.OperationID, got, created, err)
	}
}

// found makes c, a creating claim of an operation that exists, and returns
// the operation it found, which as gate.Ledger.Claim says is whole: equal
// to what FindByID returns right after.
func found(t *testing.T, l gate.Ledger, c *gate.Change) *gate.Operation {
	t.Helper()
	got, created, err := l.Claim(context.Background(), c)
	if err != nil || created || got == nil {
		t.Fatalf("claim of %s: %+v, created %v, %v; want the operation found", c.OperationID, got, created, err)
	}
	want := find(t, l, &gate.Operation{ID: c.OperationID})
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("claim of %s found\n%+v with last attempt %+v;\nFindByID right after has\n%+v with last attempt %+v",
			c.OperationID, got, got.LastAttempt, want, want.LastAttempt)
	}
	return got
}

func find(t *testing.T, l gate.Ledger, op *gate.Operation) *gate.Operation {
	t.Helper()
	got, _, err := l.FindByID(context.Background(), op.ID)
	if err != nil {
		t.Fatalf("find %s: %v", op.ID, err)
	}
	return got
}

// redeliver records a further delivery of op, as its claim finds it, and
// returns the delivery as the ledger numbered it.
func redeliver(t *testing.T, l gate.Ledger, op *gate.Operation, msg string, at time.Time) *gate.Delivery {
	t.Helper()
	c := creating(t, op, msg)
	c.Claim.Delivery.ReceivedAt = at
	got := found(t, l, c)
	d := delivery(msg, got.DeliveryCount, at)
	d.OperationID = op.ID
	return d
}

// claim is delivery d taking op (in state from) under fence.
func claim(op *gate.Operation, from gate.State, owner string, fence int64, at time.Time, d *gate.Delivery) gate.Writer {
	return gate.Claiming(&gate.Operation{ID: op.ID, State: from}, nil, lease(owner, fence, at), d)
}

func settle(op *gate.Operation, from gate.State, fence int64, fin *gate.Attempt, n int, d gate.Decision) gate.Writer {
	return gate.Settling(&gate.Operation{ID: op.ID, State: from}, fence, fin, &gate.Answer{N: n, Decision: d, Reason: "settled"},
		gate.LeaseFacts{Extensions: 1, Deadline: t0.Add(time.Hour)})
}

type ledgerCase struct {
	name string
	run  func(t *testing.T, h LedgerHarness)
}

var ledgerCases = []ledgerCase{
	{"a first claim creates the operation whole", func(t *testing.T, h LedgerHarness) {
		op := newOp("first")
		start(t, h.Ledger, op)
		got := find(t, h.Ledger, op)
		if got.ID != op.ID || got.State != gate.StatePendingEffect || got.Fence != 1 || got.Owner != "owner-a" ||
			got.DeliveryCount != 1 || got.AttemptCount != 1 || got.FirstAttemptAt == nil || !got.FirstAttemptAt.Equal(t0) ||
			got.LeaseStart == nil || !got.LeaseStart.Equal(t0) || got.TraceID != "trace-m-1" || got.Reason != "new operation" ||
			got.Fingerprint != op.Fingerprint || got.IdempotencyKey != op.IdempotencyKey || !got.CreatedAt.Equal(t0) {
			t.Fatalf("found %+v", got)
		}
		if la := got.LastAttempt; la == nil || la.N != 1 || la.Fence != 1 || la.Outcome != "" || la.FinishedAt != nil ||
			la.ContractVersion != "v1" {
			t.Fatalf("last attempt %+v, want attempt 1 started under contract v1", la)
		}
		s := h.Inspect(t, op.ID)
		if len(s.Transitions) != 3 || len(s.Deliveries) != 1 || s.Deliveries[0].Decision != "" || s.Deliveries[0].N != 1 ||
			s.Deliveries[0].Fence != 1 || s.Deliveries[0].MessageID != "m-1" || len(s.Attempts) != 1 {
			t.Fatalf("recorded %d transitions, %+v deliveries, %d attempts", len(s.Transitions), s.Deliveries, len(s.Attempts))
		}
	}},
	{"a missing operation is not found", func(t *testing.T, h LedgerHarness) {
		if _, _, err := h.Ledger.FindByID(context.Background(), "op_nobody"); !errors.Is(err, gate.ErrNotFound) {
			t.Fatalf("FindByID: %v, want ErrNotFound", err)
		}
		err := h.Ledger.Write(context.Background(), gate.RetryLaterChange(settle(newOp("nobody"), gate.StatePendingEffect, 1, nil, 1, ""), "x", t0))
		if !errors.Is(err, gate.ErrNotFound) {
			t.Fatalf("Write: %v, want ErrNotFound", err)
		}
		must(t, h.Ledger.AnswerDelivery(context.Background(), "op_nobody", &gate.Answer{N: 1, Decision: gate.Nack}))
	}},
	{"a second claim finds the operation and records its delivery", func(t *testing.T, h LedgerHarness) {
		op := newOp("twice")
		start(t, h.Ledger, op)
		at := t0.Add(time.Second)
		c := creating(t, op, "m-2")
		c.Claim.Delivery.ReceivedAt = at
		c.Claim.Owner = "owner-b"
		got := found(t, h.Ledger, c)
		if got.Owner != "owner-a" || got.DeliveryCount != 2 || got.State != gate.StatePendingEffect || got.LastAttempt == nil ||
			got.LastAttempt.N != 1 || got.TraceID != "trace-m-1" {
			t.Fatalf("found %+v", got)
		}
		s := h.Inspect(t, op.ID)
		if len(s.Deliveries) != 2 || s.Deliveries[1].N != 2 || s.Deliveries[1].Found != gate.StatePendingEffect ||
			s.Deliveries[1].Decision != "" || s.Deliveries[1].MessageID != "m-2" || s.Deliveries[1].TraceID != "trace-m-2" ||
			s.Deliveries[1].Fence != 0 || len(s.Attempts) != 1 || len(s.Transitions) != 3 {
			t.Fatalf("after the second claim: deliveries %+v, %d attempts, %d transitions", s.Deliveries, len(s.Attempts), len(s.Transitions))
		}
		// Another fingerprint under the same key records nothing on the
		// operation: that delivery belongs to a conflict record.
		other := *op
		other.Fingerprint = "fp-other"
		got = found(t, h.Ledger, creating(t, &other, "m-3"))
		if got.Fingerprint != op.Fingerprint || got.DeliveryCount != 2 {
			t.Fatalf("claim with another fingerprint found %+v", got)
		}
		if s := h.Inspect(t, op.ID); len(s.Deliveries) != 2 {
			t.Fatalf("a conflicting delivery was recorded on the original: %+v", s.Deliveries)
		}
	}},
	{"a redelivery of acknowledged work is answered by the claim that finds it", func(t *testing.T, h LedgerHarness) {
		op := newOp("acked")
		start(t, h.Ledger, op)
		ctx := context.Background()
		fin := &gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "res-a"}
		must(t, h.Ledger.Write(ctx, gate.ConfirmChange(settle(op, gate.StatePendingEffect, 1, fin, 1, gate.Ack),
			steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "res-a", "confirmed", t0)))
		must(t, h.Ledger.Write(ctx, gate.AckedChange(op.ID, gate.StateAckPending, 1, steps(t, gate.StateAckPending, gate.StateAcknowledged), t0)))
		c := creating(t, op, "m-again")
		c.Claim.Delivery.ReceivedAt = t0.Add(time.Hour)
		// The claim alone answers the redelivery: it brings back all the
		// gate decides on.
		got := found(t, h.Ledger, c)
		if got.State != gate.StateAcknowledged || got.ResultID != "res-a" || got.AckedAt == nil || got.DeliveryCount != 2 ||
			got.LastAttempt == nil || got.LastAttempt.Outcome != gate.OutcomeConfirmed || got.LastAttempt.ResultID != "res-a" {
			t.Fatalf("the redelivery found %+v with last attempt %+v", got, got.LastAttempt)
		}
		s := h.Inspect(t, op.ID)
		if len(s.Deliveries) != 2 || s.Deliveries[1].N != got.DeliveryCount || s.Deliveries[1].Found != gate.StateAcknowledged ||
			s.Deliveries[1].Decision != gate.Ack || s.Deliveries[1].Anomaly != "redelivered_after_ack" ||
			s.Deliveries[0].Decision != gate.Ack {
			t.Fatalf("deliveries %+v", s.Deliveries)
		}
		if s.Op.State != gate.StateAcknowledged || s.Op.DeliveryCount != 2 || len(s.Transitions) != 6 {
			t.Fatalf("after the redelivery: %+v, %d transitions", s.Op, len(s.Transitions))
		}
	}},
	{"an illegal path leaves nothing behind", func(t *testing.T, h LedgerHarness) {
		op := newOp("illegal")
		w := gate.Claiming(nil, op, lease("a", 1, t0), delivery("m-1", 1, t0))
		bad := []gate.Step{{Transition: gate.Transition{From: "", To: gate.StateReceived}},
			{Transition: gate.Transition{From: gate.StateReceived, To: gate.StateAcknowledged}}}
		if got, created, err := h.Ledger.Claim(context.Background(), gate.StartChange(w, bad, nil, "x", t0)); err == nil || got != nil || created {
			t.Fatalf("a creation along an illegal edge: %+v, created %v, %v; want an error alone", got, created, err)
		}
		if _, _, err := h.Ledger.FindByID(context.Background(), op.ID); !errors.Is(err, gate.ErrNotFound) {
			t.Fatalf("FindByID after a refused creation: %v", err)
		}
		start(t, h.Ledger, op)
		bad = []gate.Step{{Transition: gate.Transition{From: gate.StatePendingEffect, To: gate.StateAcknowledged}}}
		d := redeliver(t, h.Ledger, op, "m-2", t0)
		if err := h.Ledger.Write(context.Background(), gate.ConfirmChange(claim(op, gate.StatePendingEffect, "b", 2, t0, d), bad, "r", "x", t0)); err == nil {
			t.Fatal("an illegal edge was accepted")
		}
		if got := find(t, h.Ledger, op); got.State != gate.StatePendingEffect || got.Fence != 1 || got.DeliveryCount != 2 || got.Reason != "new operation" {
			t.Fatalf("half a refused change survived: %+v", got)
		}
	}},
	{"claims need a higher fence, settlements the same one", func(t *testing.T, h LedgerHarness) {
		op := newOp("fence")
		start(t, h.Ledger, op)
		ctx := context.Background()
		d := redeliver(t, h.Ledger, op, "m-2", t0)
		indet := func(w gate.Writer, from gate.State) *gate.Change {
			return gate.IndeterminateChange(w, steps(t, from, gate.StateReserved, gate.StateEffectIndeterminate), gate.LaneOperator, "x", t0)
		}
		for _, f := range []int64{0, 1} {
			if err := h.Ledger.Write(ctx, indet(claim(op, gate.StatePendingEffect, "b", f, t0, d), gate.StatePendingEffect)); !errors.Is(err, gate.ErrFenced) {
				t.Fatalf("claim under fence %d over 1: %v, want ErrFenced", f, err)
			}
		}
		for _, f := range []int64{0, 2} {
			fin := &gate.Attempt{N: 1, Outcome: gate.OutcomeRetryable}
			if err := h.Ledger.Write(ctx, gate.RetryLaterChange(settle(op, gate.StatePendingEffect, f, fin, 1, gate.Nack), "x", t0)); !errors.Is(err, gate.ErrFenced) {
				t.Fatalf("settle under fence %d over 1: %v, want ErrFenced", f, err)
			}
		}
		if err := h.Ledger.Write(ctx, gate.RetryLaterChange(settle(op, gate.StateReserved, 1, nil, 1, gate.Nack), "x", t0)); !errors.Is(err, gate.ErrStateChanged) {
			t.Fatalf("settle expecting reserved: %v, want ErrStateChanged", err)
		}
		at := t0.Add(time.Minute)
		if err := h.Ledger.Write(ctx, gate.StartChange(claim(op, gate.StatePendingEffect, "b", 5, at, d),
			steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StatePendingEffect),
			&gate.Attempt{N: 2, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, ContractVersion: "v2", StartedAt: at}, "retry", at)); err != nil {
			t.Fatalf("claim under fence 5: %v", err)
		}
		got := find(t, h.Ledger, op)
		if got.Fence != 5 || got.Owner != "b" || !got.LeaseStart.Equal(at) || got.LeaseExtensions != 0 ||
			got.DeliveryCount != 2 || got.AttemptCount != 2 || got.LastAttempt.N != 2 || got.LastAttempt.Fence != 5 ||
			got.LastAttempt.ContractVersion != "v2" || !got.FirstAttemptAt.Equal(t0) {
			t.Fatalf("after the claim: %+v / %+v", got, got.LastAttempt)
		}
		if s := h.Inspect(t, op.ID); s.Deliveries[1].Fence != 5 {
			t.Fatalf("the claiming delivery is not marked with its fence: %+v", s.Deliveries[1])
		}
		// The first owner, fenced off, cannot record its result.
		fin := &gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "stale"}
		err := h.Ledger.Write(ctx, gate.ConfirmChange(settle(op, gate.StatePendingEffect, 1, fin, 1, gate.Ack),
			steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "stale", "x", at))
		if !errors.Is(err, gate.ErrFenced) {
			t.Fatalf("stale owner's confirm: %v, want ErrFenced", err)
		}
		if got := find(t, h.Ledger, op); got.State != gate.StatePendingEffect || got.ResultID != "" {
			t.Fatalf("a fenced write left %s / %q", got.State, got.ResultID)
		}
	}},
	{"a whole life: retry, confirm, ack", func(t *testing.T, h LedgerHarness) {
		op := newOp("life")
		start(t, h.Ledger, op)
		ctx := context.Background()
		t1 := t0.Add(time.Second)
		must(t, h.Ledger.Write(ctx, gate.RetryLaterChange(settle(op, gate.StatePendingEffect, 1,
			&gate.Attempt{N: 1, Outcome: gate.OutcomeRetryable, StatusCode: 503, Reason: "busy"}, 1, gate.Nack), "busy", t1)))
		got := find(t, h.Ledger, op)
		if got.State != gate.StatePendingEffect || got.Reason != "busy" || got.LeaseExtensions != 1 ||
			got.LeaseDeadline == nil || !got.LeaseDeadline.Equal(t0.Add(time.Hour)) || got.LeaseLostAt != nil ||
			got.LastAttempt.Outcome != gate.OutcomeRetryable || got.LastAttempt.StatusCode != 503 || !got.LastAttempt.FinishedAt.Equal(t1) {
			t.Fatalf("after the retryable attempt: %+v / %+v", got, got.LastAttempt)
		}
		t2 := t0.Add(time.Minute)
		d := redeliver(t, h.Ledger, op, "m-2", t2)
		must(t, h.Ledger.Write(ctx, gate.StartChange(claim(op, gate.StatePendingEffect, "owner-b", 2, t2, d),
			steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StatePendingEffect),
			&gate.Attempt{N: 2, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, StartedAt: t2}, "retry", t2)))
		t3 := t2.Add(time.Second)
		must(t, h.Ledger.Write(ctx, gate.ConfirmChange(settle(op, gate.StatePendingEffect, 2,
			&gate.Attempt{N: 2, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "res-1"}, d.N, gate.Ack),
			steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "res-1", "confirmed", t3)))
		t4 := t3.Add(time.Millisecond)
		must(t, h.Ledger.Write(ctx, gate.AckedChange(op.ID, gate.StateAckPending, 2, steps(t, gate.StateAckPending, gate.StateAcknowledged), t4)))
		got = find(t, h.Ledger, op)
		if got.State != gate.StateAcknowledged || got.ResultID != "res-1" || !got.EvidenceAt.Equal(t3) || !got.AckedAt.Equal(t4) ||
			got.Reason != "confirmed" || got.DeliveryCount != 2 || got.AttemptCount != 2 || !got.UpdatedAt.Equal(t4) ||
			got.TraceID != "trace-m-1" {
			t.Fatalf("final: %+v", got)
		}
		s := h.Inspect(t, op.ID)
		if len(s.Transitions) != 8 || len(s.Deliveries) != 2 || s.Deliveries[0].Decision != gate.Nack ||
			s.Deliveries[1].Decision != gate.Ack || s.Deliveries[1].Fence != 2 || len(s.DeadLetters) != 0 || len(s.Attempts) != 2 ||
			s.Attempts[1].Outcome != gate.OutcomeConfirmed || s.Attempts[0].Outcome != gate.OutcomeRetryable {
			t.Fatalf("record: %d transitions, deliveries %+v, attempts %+v, %d dead letters", len(s.Transitions), s.Deliveries, s.Attempts, len(s.DeadLetters))
		}
		// Acked work cannot be acked again, nor moved anywhere.
		err := h.Ledger.Write(ctx, gate.AckedChange(op.ID, gate.StateAckPending, 2, steps(t, gate.StateAckPending, gate.StateAcknowledged), t4))
		if !errors.Is(err, gate.ErrStateChanged) {
			t.Fatalf("second ack mark: %v, want ErrStateChanged", err)
		}
		// A redelivery finds it with its newest attempt, the second, and
		// the first's start as the dedupe window's anchor.
		c := creating(t, op, "m-3")
		c.Claim.Delivery.ReceivedAt = t4.Add(time.Minute)
		again := found(t, h.Ledger, c)
		if again.State != gate.StateAcknowledged || again.DeliveryCount != 3 || again.LastAttempt == nil ||
			again.LastAttempt.N != 2 || again.LastAttempt.ResultID != "res-1" || again.LastAttempt.Fence != 2 ||
			again.FirstAttemptAt == nil || !again.FirstAttemptAt.Equal(t0) {
			t.Fatalf("the redelivery found %+v with last attempt %+v", again, again.LastAttempt)
		}
	}},
	{"a claim that creates returns no operation; one that finds returns it whole", func(t *testing.T, h LedgerHarness) {
		// Each kind of creating claim: an attempt started, a terminal
		// refusal dead-lettered, a handoff with its outbox entry.
		started := newOp("created-started")
		create(t, h.Ledger, creating(t, started, "m-1"))
		refused := newOp("created-refused")
		w := gate.Claiming(nil, refused, lease("owner-a", 1, t0), delivery("m-1", 1, t0))
		create(t, h.Ledger, gate.TerminalChange(w, steps(t, "", gate.StateReceived, gate.StateTerminalFailure),
			&gate.DeadLetter{Reason: "refused", At: t0}, "refused", t0))
		handed := newOp("created-handed")
		d := delivery("m-1", 1, t0)
		d.Decision = gate.Ack
		w = gate.Claiming(nil, handed, lease("owner-a", 1, t0), d)
		create(t, h.Ledger, gate.HandoffChange(w, steps(t, "", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect),
			&gate.OutboxEntry{OperationID: handed.ID, Route: handed.Route, PublicationID: handed.IdempotencyKey, CreatedAt: t0, NextAttemptAt: t0,
				Message: &gate.Message{Broker: gate.BrokerPubSub, Source: "projects/p/subscriptions/s", MessageID: "m-1",
					Data: []byte(`{"n":1}`), Attributes: map[string]string{}}},
			"handed off", t0))
		// Each is there as its claim described it.
		for _, want := range []struct {
			op    *gate.Operation
			state gate.State
		}{{started, gate.StatePendingEffect}, {refused, gate.StateTerminalFailure}, {handed, gate.StatePendingEffect}} {
			got := find(t, h.Ledger, want.op)
			if got.State != want.state || got.Fence != 1 || got.Owner != "owner-a" || got.DeliveryCount != 1 ||
				got.Fingerprint != want.op.Fingerprint {
				t.Fatalf("created %s: %+v", want.op.ID, got)
			}
		}
		// A further delivery of each, and one with another fingerprint,
		// finds the operation whole.
		for _, op := range []*gate.Operation{started, refused, handed} {
			c := creating(t, op, "m-2")
			c.Claim.Delivery.ReceivedAt = t0.Add(time.Second)
			if got := found(t, h.Ledger, c); got.ID != op.ID || got.DeliveryCount != 2 || got.IdempotencyKey != op.IdempotencyKey {
				t.Fatalf("the further delivery of %s found %+v", op.ID, got)
			}
			other := *op
			other.Fingerprint = "fp-other"
			if got := found(t, h.Ledger, creating(t, &other, "m-3")); got.Fingerprint != op.Fingerprint || got.DeliveryCount != 2 {
				t.Fatalf("the conflicting delivery of %s found %+v", op.ID, got)
			}
		}
	}},
	{"the common path is three writes of one row", func(t *testing.T, h LedgerHarness) {
		op := newOp("common")
		start(t, h.Ledger, op)
		ctx := context.Background()
		t1, t2 := t0.Add(time.Second), t0.Add(2*time.Second)
		must(t, h.Ledger.Write(ctx, gate.ConfirmChange(settle(op, gate.StatePendingEffect, 1,
			&gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, StatusCode: 200, ResultID: "res-c"}, 1, gate.Ack),
			steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "res-c", "confirmed", t1)))
		must(t, h.Ledger.Write(ctx, gate.AckedChange(op.ID, gate.StateAckPending, 1, steps(t, gate.StateAckPending, gate.StateAcknowledged), t2)))
		s := h.Inspect(t, op.ID)
		want := []gate.Transition{{From: "", To: gate.StateReceived}, {From: gate.StateReceived, To: gate.StateReserved},
			{From: gate.StateReserved, To: gate.StatePendingEffect}, {From: gate.StatePendingEffect, To: gate.StateEffectConfirmed},
			{From: gate.StateEffectConfirmed, To: gate.StateAckPending}, {From: gate.StateAckPending, To: gate.StateAcknowledged}}
		if !slices.Equal(s.Transitions, want) || len(s.Deliveries) != 1 || s.Deliveries[0].Decision != gate.Ack ||
			len(s.Attempts) != 1 || s.Attempts[0].ResultID != "res-c" || s.Attempts[0].StatusCode != 200 ||
			!s.Op.EvidenceAt.Equal(t1) || !s.Op.AckedAt.Equal(t2) {
			t.Fatalf("record: transitions %v, deliveries %+v, attempts %+v, op %+v", s.Transitions, s.Deliveries, s.Attempts, s.Op)
		}
	}},
	{"a settlement records what became of the lease", func(t *testing.T, h LedgerHarness) {
		op := newOp("lease")
		start(t, h.Ledger, op)
		lost, deadline := t0.Add(3*time.Second), t0.Add(5*time.Second)
		w := gate.Settling(&gate.Operation{ID: op.ID, State: gate.StatePendingEffect}, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown},
			nil, gate.LeaseFacts{Extensions: 4, Deadline: deadline, LostAt: &lost})
		must(t, h.Ledger.Write(context.Background(), gate.RetryLaterChange(w, "lost", t0.Add(6*time.Second))))
		got := find(t, h.Ledger, op)
		if got.LeaseExtensions != 4 || got.LeaseDeadline == nil || !got.LeaseDeadline.Equal(deadline) ||
			got.LeaseLostAt == nil || !got.LeaseLostAt.Equal(lost) {
			t.Fatalf("lease facts: %d extensions, deadline %v, lost at %v", got.LeaseExtensions, got.LeaseDeadline, got.LeaseLostAt)
		}
		if s := h.Inspect(t, op.ID); !slices.Equal(s.LeaseEvents, []LeaseEvent{{Kind: "lost", Fence: 1}}) {
			t.Fatalf("lease events %+v, want the loss under fence 1", s.LeaseEvents)
		}
		// A new claim starts a new lease with nothing lost yet; a lease from
		// a store that had lost the counter is kept as a reset.
		at := t0.Add(time.Minute)
		d := redeliver(t, h.Ledger, op, "m-2", at)
		l := lease("b", 2, at)
		l.Reset = true
		must(t, h.Ledger.Write(context.Background(), gate.StartChange(gate.Claiming(&gate.Operation{ID: op.ID, State: gate.StatePendingEffect}, nil, l, d),
			steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StatePendingEffect),
			&gate.Attempt{N: 2, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, StartedAt: at}, "retry", at)))
		if got := find(t, h.Ledger, op); got.LeaseLostAt != nil || got.LeaseExtensions != 0 {
			t.Fatalf("after a new claim: lost at %v, %d extensions", got.LeaseLostAt, got.LeaseExtensions)
		}
		// A delivery that met a reset and held the lease says so with its answer.
		d3 := redeliver(t, h.Ledger, op, "m-3", at)
		must(t, h.Ledger.AnswerDelivery(context.Background(), op.ID, &gate.Answer{N: d3.N, Decision: gate.Nack, Reason: "held", ResetFence: 7}))
		if s := h.Inspect(t, op.ID); !slices.Equal(s.LeaseEvents, []LeaseEvent{{Kind: "lost", Fence: 1}, {Kind: "reset", Fence: 2}, {Kind: "reset", Fence: 7}}) {
			t.Fatalf("lease events %+v", s.LeaseEvents)
		}
	}},
	{"finishing an attempt twice or one never started is refused", func(t *testing.T, h LedgerHarness) {
		op := newOp("finish")
		start(t, h.Ledger, op)
		ctx := context.Background()
		err := h.Ledger.Write(ctx, gate.RetryLaterChange(settle(op, gate.StatePendingEffect, 1, &gate.Attempt{N: 7, Outcome: gate.OutcomeUnknown}, 1, gate.Nack), "no", t0))
		if err == nil {
			t.Fatal("finishing attempt 7 was accepted")
		}
		must(t, h.Ledger.Write(ctx, gate.RetryLaterChange(settle(op, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown}, 1, gate.Nack), "lost", t0)))
		if err := h.Ledger.Write(ctx, gate.RetryLaterChange(settle(op, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeRetryable}, 1, gate.Nack), "again", t0)); err == nil {
			t.Fatal("finishing attempt 1 twice was accepted")
		}
		if got := find(t, h.Ledger, op); got.Reason != "lost" || got.LastAttempt.Outcome != gate.OutcomeUnknown {
			t.Fatalf("after the refusals: %+v", got)
		}
	}},
	{"indeterminate keeps its lane; terminal its dead letter", func(t *testing.T, h LedgerHarness) {
		ctx := context.Background()
		a, b := newOp("indet"), newOp("term")
		start(t, h.Ledger, a)
		start(t, h.Ledger, b)
		must(t, h.Ledger.Write(ctx, gate.IndeterminateChange(settle(a, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown}, 1, gate.Nack),
			steps(t, gate.StatePendingEffect, gate.StateEffectIndeterminate), gate.LaneOperator, "lost on an unsafe effect", t0)))
		must(t, h.Ledger.Write(ctx, gate.TerminalChange(settle(b, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeTerminal}, 1, gate.Ack),
			steps(t, gate.StatePendingEffect, gate.StateTerminalFailure), &gate.DeadLetter{Reason: "refused"}, "refused", t0)))
		if got := find(t, h.Ledger, a); got.State != gate.StateEffectIndeterminate || got.Lane != gate.LaneOperator {
			t.Fatalf("indeterminate: %+v", got)
		}
		s := h.Inspect(t, b.ID)
		if s.Op.State != gate.StateTerminalFailure || s.Op.Lane != "" || len(s.DeadLetters) != 1 || s.DeadLetters[0].Reason != "refused" ||
			s.DeadLetters[0].OperationID != b.ID || s.Deliveries[0].Decision != gate.Ack {
			t.Fatalf("terminal: %+v dead letters %+v deliveries %+v", s.Op, s.DeadLetters, s.Deliveries)
		}
	}},
	{"a delivery is answered once", func(t *testing.T, h LedgerHarness) {
		op := newOp("answer")
		start(t, h.Ledger, op)
		ctx := context.Background()
		d := redeliver(t, h.Ledger, op, "m-2", t0)
		must(t, h.Ledger.AnswerDelivery(ctx, op.ID, &gate.Answer{N: 1, Decision: gate.Nack, Reason: "fenced"}))
		must(t, h.Ledger.AnswerDelivery(ctx, op.ID, &gate.Answer{N: 1, Decision: gate.Ack, Reason: "again"}))
		must(t, h.Ledger.AnswerDelivery(ctx, op.ID, &gate.Answer{N: d.N, Decision: gate.Nack, Reason: "held", Anomaly: "a"}))
		must(t, h.Ledger.AnswerDelivery(ctx, op.ID, &gate.Answer{N: d.N, Decision: gate.Ack, Reason: "again"}))
		s := h.Inspect(t, op.ID)
		if d := s.Deliveries[0]; d.Decision != gate.Nack || d.Reason != "fenced" {
			t.Fatalf("first delivery: %+v", d)
		}
		if d := s.Deliveries[1]; d.Decision != gate.Nack || d.Reason != "held" || d.Anomaly != "a" {
			t.Fatalf("second delivery: %+v", d)
		}
	}},
	{"a conflict is its own record, once", func(t *testing.T, h LedgerHarness) {
		orig := newOp("conflict")
		start(t, h.Ledger, orig)
		rec := *orig
		rec.ID, rec.Fingerprint, rec.State, rec.Reason = "op_conflict-2", "fp-other", gate.StateConflicting, "reused"
		var first *gate.Operation
		for i := range 2 {
			got, err := h.Ledger.RecordConflict(context.Background(), &gate.Conflict{Original: orig, Record: &rec,
				Delivery: &gate.Delivery{OperationID: rec.ID, Broker: gate.BrokerPubSub, Source: "s", MessageID: "m-c", ReceivedAt: t0, Decision: gate.Nack},
				At:       t0})
			if err != nil {
				t.Fatal(err)
			}
			if got.ID != rec.ID || got.State != gate.StateConflicting || got.ConflictOf != orig.ID || got.Fence != 0 {
				t.Fatalf("conflict record %d: %+v", i, got)
			}
			first = got
		}
		if s := h.Inspect(t, first.ID); len(s.Deliveries) != 2 || s.Op.DeliveryCount != 2 || len(s.Transitions) != 2 ||
			s.Deliveries[1].N != 2 || s.Deliveries[1].Decision != gate.Nack {
			t.Fatalf("conflict record: deliveries %+v (%d counted), %d transitions", s.Deliveries, s.Op.DeliveryCount, len(s.Transitions))
		}
		if got := find(t, h.Ledger, orig); got.ID != orig.ID || got.DeliveryCount != 1 {
			t.Fatalf("the original changed: %+v", got)
		}
		// A conflict record is never moved or claimed.
		err := h.Ledger.Write(context.Background(), gate.RetryLaterChange(claim(&rec, gate.StateConflicting, "x", 9, t0, nil), "claim", t0))
		if !errors.Is(err, gate.ErrNotFound) {
			t.Fatalf("claiming a conflict record: %v, want ErrNotFound", err)
		}
		// Nor taken by an operator or the reconciler.
		iv := &gate.Intervention{Resolution: gate.Resolution{Kind: gate.ResolveAbandon, Reason: "r", Actor: "alice"},
			From: gate.StateConflicting, To: gate.StateConflicting, Fence: 9, At: t0}
		err = h.Ledger.Write(context.Background(), gate.ResolveChange(intervening(&rec, gate.StateConflicting, "op-x", 9), nil, iv, 0, "", nil, "abandon", t0))
		if !errors.Is(err, gate.ErrNotFound) {
			t.Fatalf("resolving a conflict record: %v, want ErrNotFound", err)
		}
	}},
	{"a lookup before the claim is an attempt of its own", func(t *testing.T, h LedgerHarness) {
		op := newOp("lookup-first")
		start(t, h.Ledger, op)
		ctx := context.Background()
		must(t, h.Ledger.Write(ctx, gate.RetryLaterChange(settle(op, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown}, 1, gate.Nack), "lost", t0)))
		at := t0.Add(time.Minute)
		d := redeliver(t, h.Ledger, op, "m-2", at)
		done := at.Add(time.Millisecond)
		c := gate.ConfirmChange(claim(op, gate.StatePendingEffect, "b", 2, at, d),
			steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StateEffectConfirmed, gate.StateAckPending), "res-l", "lookup found it", done)
		c.Lookup = &gate.Attempt{N: 2, Kind: gate.AttemptLookup, IdempotencyKey: op.IdempotencyKey, ContractVersion: "v1",
			StartedAt: at, FinishedAt: &done, Outcome: gate.OutcomeConfirmed, StatusCode: 200, ResultID: "res-l", Reason: "found"}
		must(t, h.Ledger.Write(ctx, c))
		got := find(t, h.Ledger, op)
		if got.State != gate.StateAckPending || got.ResultID != "res-l" || got.AttemptCount != 2 || got.LastAttempt.N != 1 || got.Fence != 2 {
			t.Fatalf("after the lookup: %+v", got)
		}
		s := h.Inspect(t, op.ID)
		if len(s.Attempts) != 2 || s.Attempts[1].Kind != gate.AttemptLookup || s.Attempts[1].Fence != 2 ||
			s.Attempts[1].Outcome != gate.OutcomeConfirmed || s.Attempts[1].ResultID != "res-l" || len(s.Transitions) != 6 {
			t.Fatalf("attempts %+v, %d transitions", s.Attempts, len(s.Transitions))
		}
	}},
}

type reservationCase struct {
	name string
	run  func(t *testing.T, h ReservationsHarness)
}

// indeterminate brings a started op into effect_indeterminate under fence
// 2, as a redelivery whose lookup was unavailable does.
func indeterminate(t *testing.T, l gate.Ledger, op *gate.Operation) {
	t.Helper()
	at := t0.Add(time.Minute)
	d := redeliver(t, l, op, "m-indet", at)
	must(t, l.Write(context.Background(), gate.IndeterminateChange(claim(op, gate.StatePendingEffect, "owner-b", 2, at, d),
		steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StateEffectIndeterminate), gate.LaneOperator, "lookup down", at)))
}

func intervening(op *gate.Operation, from gate.State, owner string, fence int64) gate.Writer {
	return gate.Intervening(&gate.Operation{ID: op.ID, State: from}, lease(owner, fence, t0))
}

var interventionCases = []ledgerCase{
	{"a resolution is fenced, guarded and recorded with who and why", func(t *testing.T, h LedgerHarness) {
		op := newOp("resolve")
		start(t, h.Ledger, op)
		indeterminate(t, h.Ledger, op)
		ctx := context.Background()
		at := t0.Add(time.Hour)
		iv := func(fence int64) *gate.Intervention {
			return &gate.Intervention{Resolution: gate.Resolution{Kind: gate.ResolveNotHappened, Reason: "checked the provider", Actor: "alice"},
				From: gate.StateEffectIndeterminate, To: gate.StatePendingEffect, Fence: fence, At: at}
		}
		reopen := func(w gate.Writer, fence int64) *gate.Change {
			return gate.ResolveChange(w, steps(t, gate.StateEffectIndeterminate, gate.StatePendingEffect), iv(fence), 3, "", nil, "operator not_happened", at)
		}
		for _, f := range []int64{1, 2} {
			if err := h.Ledger.Write(ctx, reopen(intervening(op, gate.StateEffectIndeterminate, "op-x", f), f)); !errors.Is(err, gate.ErrFenced) {
				t.Fatalf("resolution under fence %d over 2: %v, want ErrFenced", f, err)
			}
		}
		replay := gate.ResolveChange(intervening(op, gate.StateTerminalFailure, "op-x", 3),
			steps(t, gate.StateTerminalFailure, gate.StatePendingEffect), iv(3), 3, "", nil, "operator replay", at)
		if err := h.Ledger.Write(ctx, replay); !errors.Is(err, gate.ErrStateChanged) {
			t.Fatalf("resolution expecting terminal_failure: %v, want ErrStateChanged", err)
		}
		if _, last, err := h.Ledger.FindByID(ctx, op.ID); err != nil || last != nil {
			t.Fatalf("refused resolutions left an intervention: %+v, %v", last, err)
		}
		must(t, h.Ledger.Write(ctx, reopen(intervening(op, gate.StateEffectIndeterminate, "op-x", 3), 3)))
		got, last, err := h.Ledger.FindByID(ctx, op.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != gate.StatePendingEffect || got.Fence != 3 || got.Owner != "op-x" || got.Grant != 3 || got.Lane != "" ||
			got.Reason != "operator not_happened" || got.AttemptCount != 1 || got.DeliveryCount != 2 || got.LastAttempt == nil || got.LastAttempt.N != 1 {
			t.Fatalf("after the resolution: %+v", got)
		}
		if last == nil || last.Resolution != iv(3).Resolution || last.From != gate.StateEffectIndeterminate || last.To != gate.StatePendingEffect ||
			last.Fence != 3 || !last.At.Equal(at) {
			t.Fatalf("latest intervention %+v", last)
		}
		// The owner it fenced off can no longer record anything.
		fin := &gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "late"}
		err = h.Ledger.Write(ctx, gate.ConfirmChange(settle(op, gate.StatePendingEffect, 2, fin, 2, gate.Ack),
			steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending), "late", "x", at))
		if !errors.Is(err, gate.ErrFenced) {
			t.Fatalf("the fenced owner's confirm: %v, want ErrFenced", err)
		}
		s := h.Inspect(t, op.ID)
		if len(s.Interventions) != 1 || len(s.Transitions) != 6 || s.Transitions[5] != (gate.Transition{From: gate.StateEffectIndeterminate, To: gate.StatePendingEffect}) {
			t.Fatalf("record: %d interventions, transitions %+v", len(s.Interventions), s.Transitions)
		}
	}},
	{"an abandoned operation ends terminal; every dead-lettering is kept", func(t *testing.T, h LedgerHarness) {
		op := newOp("abandon")
		start(t, h.Ledger, op)
		indeterminate(t, h.Ledger, op)
		ctx := context.Background()
		at := t0.Add(time.Hour)
		iv := &gate.Intervention{Resolution: gate.Resolution{Kind: gate.ResolveAbandon, Reason: "gave up", Actor: "bob"},
			From: gate.StateEffectIndeterminate, To: gate.StateTerminalFailure, Fence: 3, At: at}
		dl := &gate.DeadLetter{OperationID: op.ID, Reason: "operator abandon", At: at}
		must(t, h.Ledger.Write(ctx, gate.ResolveChange(intervening(op, gate.StateEffectIndeterminate, "op-y", 3),
			steps(t, gate.StateEffectIndeterminate, gate.StateTerminalFailure), iv, 0, "", dl, "operator abandon", at)))
		got, last, err := h.Ledger.FindByID(ctx, op.ID)
		if err != nil || got.State != gate.StateTerminalFailure || got.Grant != 0 || last == nil || last.Kind != gate.ResolveAbandon {
			t.Fatalf("after abandon: %+v, %+v, %v", got, last, err)
		}
		// Replayed, attempted once more and refused for good: dead-lettered
		// a second time, and both are on the record.
		t1 := at.Add(time.Minute)
		replay := &gate.Intervention{Resolution: gate.Resolution{Kind: gate.ResolveReplay, Reason: "fixed", Actor: "bob"},
			From: gate.StateTerminalFailure, To: gate.StatePendingEffect, Fence: 4, At: t1}
		must(t, h.Ledger.Write(ctx, gate.ResolveChange(intervening(op, gate.StateTerminalFailure, "op-z", 4),
			steps(t, gate.StateTerminalFailure, gate.StatePendingEffect), replay, 2, "", nil, "operator replay", t1)))
		d := redeliver(t, h.Ledger, op, "m-replayed", t1)
		must(t, h.Ledger.Write(ctx, gate.StartChange(claim(op, gate.StatePendingEffect, "owner-c", 5, t1, d),
			steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StatePendingEffect),
			&gate.Attempt{N: 2, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, StartedAt: t1}, "granted", t1)))
		must(t, h.Ledger.Write(ctx, gate.TerminalChange(settle(op, gate.StatePendingEffect, 5, &gate.Attempt{N: 2, Outcome: gate.OutcomeTerminal}, d.N, gate.Ack),
			steps(t, gate.StatePendingEffect, gate.StateTerminalFailure), &gate.DeadLetter{Reason: "refused again"}, "refused again", t1)))
		if s := h.Inspect(t, op.ID); len(s.DeadLetters) != 2 || s.DeadLetters[0].Reason != "operator abandon" ||
			s.DeadLetters[1].Reason != "refused again" || len(s.Interventions) != 2 {
			t.Fatalf("dead letters %+v, interventions %+v", s.DeadLetters, s.Interventions)
		}
	}},
	{"a reconciling lookup is an attempt of its own", func(t *testing.T, h LedgerHarness) {
		op := newOp("reconcile")
		start(t, h.Ledger, op)
		indeterminate(t, h.Ledger, op)
		ctx := context.Background()
		t1 := t0.Add(time.Hour)
		next := t1.Add(time.Minute)
		lookup := func(n int, at time.Time, o gate.Outcome, result string) *gate.Attempt {
			done := at
			return &gate.Attempt{N: n, Kind: gate.AttemptLookup, IdempotencyKey: op.IdempotencyKey, StartedAt: at,
				FinishedAt: &done, Outcome: o, StatusCode: 503, ResultID: result, Reason: string(o)}
		}
		must(t, h.Ledger.Write(ctx, gate.ReconcileChange(intervening(op, gate.StateEffectIndeterminate, "rec-1", 3), nil,
			lookup(2, t1, gate.OutcomeUnknown, ""), "", 0, &next, 1, "lookup could not tell", t1)))
		got := find(t, h.Ledger, op)
		if got.State != gate.StateEffectIndeterminate || got.Fence != 3 || got.AttemptCount != 2 || got.Checks != 1 ||
			got.NextCheckAt == nil || !got.NextCheckAt.Equal(next) || got.Lane != gate.LaneOperator || got.LastAttempt.N != 1 {
			t.Fatalf("after an unavailable lookup: %+v", got)
		}
		// A lookup numbered out of turn is refused whole.
		t2 := next
		if err := h.Ledger.Write(ctx, gate.ReconcileChange(intervening(op, gate.StateEffectIndeterminate, "rec-2", 4),
			steps(t, gate.StateEffectIndeterminate, gate.StateEffectConfirmed), lookup(2, t2, gate.OutcomeConfirmed, "res-9"), "res-9", 0, nil, 0, "found", t2)); !errors.Is(err, gate.ErrStateChanged) {
			t.Fatalf("a lookup reusing attempt number 2: %v, want ErrStateChanged", err)
		}
		must(t, h.Ledger.Write(ctx, gate.ReconcileChange(intervening(op, gate.StateEffectIndeterminate, "rec-2", 4),
			steps(t, gate.StateEffectIndeterminate, gate.StateEffectConfirmed), lookup(3, t2, gate.OutcomeConfirmed, "res-9"), "res-9", 0, nil, 0, "found", t2)))
		got = find(t, h.Ledger, op)
		if got.State != gate.StateEffectConfirmed || got.ResultID != "res-9" || got.EvidenceAt == nil || !got.EvidenceAt.Equal(t2) ||
			got.Checks != 0 || got.NextCheckAt != nil || got.Lane != "" || got.AttemptCount != 3 || got.Fence != 4 {
			t.Fatalf("after the lookup found it: %+v", got)
		}
		s := h.Inspect(t, op.ID)
		if len(s.Attempts) != 3 || s.Attempts[1].Kind != gate.AttemptLookup || s.Attempts[2].Outcome != gate.OutcomeConfirmed ||
			s.Attempts[2].Fence != 4 || len(s.Interventions) != 0 {
			t.Fatalf("attempts %+v, interventions %+v", s.Attempts, s.Interventions)
		}
	}},
}

func init() { ledgerCases = append(ledgerCases, interventionCases...) }

var reservationCases = []reservationCase{
	{"one holder at a time; fences only go up", func(t *testing.T, h ReservationsHarness) {
		ctx, r := context.Background(), h.Reservations
		a, err := r.Acquire(ctx, "op_a", "owner-a", time.Minute, 0)
		if err != nil || a.Fence < 1 || a.Owner != "owner-a" || a.Key != "op_a" || a.Reset {
			t.Fatalf("first acquire: %+v, %v", a, err)
		}
		if _, err := r.Acquire(ctx, "op_a", "owner-b", time.Minute, 0); !errors.Is(err, gate.ErrHeld) {
			t.Fatalf("second owner: %v, want ErrHeld", err)
		}
		must(t, r.Release(ctx, a))
		b, err := r.Acquire(ctx, "op_a", "owner-b", time.Minute, a.Fence)
		if err != nil || b.Fence <= a.Fence || b.Reset {
			t.Fatalf("after release: %+v, %v (first fence %d)", b, err, a.Fence)
		}
		// Releasing a lease one no longer holds does nothing.
		must(t, r.Release(ctx, a))
		if _, err := r.Acquire(ctx, "op_a", "owner-c", time.Minute, 0); !errors.Is(err, gate.ErrHeld) {
			t.Fatalf("a stale release freed the lease: %v", err)
		}
	}},
	{"a batch release frees its own leases and leaves newer owners' alone", func(t *testing.T, h ReservationsHarness) {
		ctx, r := context.Background(), h.Reservations
		mine, err := r.Acquire(ctx, "op_batch_mine", "owner-a", time.Minute, 0)
		must(t, err)
		other, err := r.Acquire(ctx, "op_batch_other", "owner-a", time.Minute, 0)
		must(t, err)
		// op_batch_taken was released and taken over by a newer owner
		// before the batch ran: its stale lease must not free the new one.
		stale, err := r.Acquire(ctx, "op_batch_taken", "owner-a", time.Minute, 0)
		must(t, err)
		must(t, r.Release(ctx, stale))
		newer, err := r.Acquire(ctx, "op_batch_taken", "owner-b", time.Minute, stale.Fence)
		must(t, err)
		// The same owner name under a newer fence is another holder too.
		old, err := r.Acquire(ctx, "op_batch_same", "owner-a", time.Minute, 0)
		must(t, err)
		must(t, r.Release(ctx, old))
		same, err := r.Acquire(ctx, "op_batch_same", "owner-a", time.Minute, old.Fence)
		must(t, err)
		must(t, r.ReleaseAll(ctx, nil))
		must(t, r.ReleaseAll(ctx, []gate.Lease{mine, stale, old, other, {Key: "op_batch_never", Owner: "owner-a", Fence: 1}}))
		for _, k := range []string{"op_batch_mine", "op_batch_other"} {
			if _, err := r.Acquire(ctx, k, "owner-c", time.Minute, 0); err != nil {
				t.Fatalf("%s still held after the batch release: %v", k, err)
			}
		}
		if _, err := r.Acquire(ctx, "op_batch_taken", "owner-c", time.Minute, 0); !errors.Is(err, gate.ErrHeld) {
			t.Fatalf("a stale lease in a batch freed the newer owner's: %v", err)
		}
		if _, err := r.Renew(ctx, newer, time.Minute); err != nil {
			t.Fatalf("the newer owner lost its lease to a batch release: %v", err)
		}
		if _, err := r.Renew(ctx, same, time.Minute); err != nil {
			t.Fatalf("the same owner's newer lease was freed by its older one: %v", err)
		}
	}},
	{"a lease taken at the ledger's fence raises the counter past it", func(t *testing.T, h ReservationsHarness) {
		ctx, r := context.Background(), h.Reservations
		l, err := r.Take(ctx, gate.Lease{Key: "op_take", Owner: "owner-a", Fence: 1}, time.Minute)
		if err != nil || l.Fence != 1 || l.Owner != "owner-a" || l.Reset || l.Expires.IsZero() {
			t.Fatalf("take at fence 1: %+v, %v", l, err)
		}
		if _, err := r.Take(ctx, gate.Lease{Key: "op_take", Owner: "owner-b", Fence: 1}, time.Minute); !errors.Is(err, gate.ErrHeld) {
			t.Fatalf("a second take: %v, want ErrHeld", err)
		}
		if _, err := r.Acquire(ctx, "op_take", "owner-b", time.Minute, 0); !errors.Is(err, gate.ErrHeld) {
			t.Fatalf("acquire while taken: %v, want ErrHeld", err)
		}
		if l, err = r.Renew(ctx, l, time.Minute); err != nil {
			t.Fatalf("renew a taken lease: %v", err)
		}
		must(t, r.Release(ctx, l))
		next, err := r.Acquire(ctx, "op_take", "owner-b", time.Minute, 0)
		if err != nil || next.Fence != 2 || next.Reset {
			t.Fatalf("acquire after the taken lease: %+v, %v, want fence 2", next, err)
		}
	}},
	{"the floor raises the fence", func(t *testing.T, h ReservationsHarness) {
		l, err := h.Reservations.Acquire(context.Background(), "op_floor", "owner-a", time.Minute, 41)
		if err != nil || l.Fence != 42 || !l.Reset {
			t.Fatalf("acquire over floor 41: %+v, %v", l, err)
		}
	}},
	{"a lapsed lease is lost and taken", func(t *testing.T, h ReservationsHarness) {
		ctx, r := context.Background(), h.Reservations
		a, err := r.Acquire(ctx, "op_lapse", "owner-a", 100*time.Millisecond, 0)
		must(t, err)
		if a, err = r.Renew(ctx, a, 100*time.Millisecond); err != nil {
			t.Fatalf("renew while held: %v", err)
		}
		h.Wait(300 * time.Millisecond)
		if _, err := r.Renew(ctx, a, time.Minute); !errors.Is(err, gate.ErrLeaseLost) {
			t.Fatalf("renew after lapse: %v, want ErrLeaseLost", err)
		}
		b, err := r.Acquire(ctx, "op_lapse", "owner-b", time.Minute, 0)
		if err != nil || b.Fence <= a.Fence {
			t.Fatalf("acquire after lapse: %+v, %v", b, err)
		}
		if _, err := r.Renew(ctx, a, time.Minute); !errors.Is(err, gate.ErrLeaseLost) {
			t.Fatalf("the old owner renewed another's lease: %v", err)
		}
	}},
	{"after data loss the floor still fences", func(t *testing.T, h ReservationsHarness) {
		ctx, r := context.Background(), h.Reservations
		a, err := r.Acquire(ctx, "op_lost", "owner-a", time.Minute, 0)
		must(t, err)
		h.Flush()
		if _, err := r.Renew(ctx, a, time.Minute); !errors.Is(err, gate.ErrLeaseLost) {
			t.Fatalf("renew after data loss: %v, want ErrLeaseLost", err)
		}
		b, err := r.Acquire(ctx, "op_lost", "owner-b", time.Minute, a.Fence)
		if err != nil || b.Fence <= a.Fence || !b.Reset {
			t.Fatalf("acquire after data loss with floor %d: %+v, %v", a.Fence, b, err)
		}
	}},
	{"forget drops an idle counter and never a held lease", func(t *testing.T, h ReservationsHarness) {
		ctx, r := context.Background(), h.Reservations
		f, ok := r.(interface {
			Forget(ctx context.Context, keys []string) error
		})
		if !ok {
			t.Fatalf("%T has no Forget", r)
		}
		idle, err := r.Acquire(ctx, "op_idle", "owner-a", time.Minute, 0)
		must(t, err)
		must(t, r.Release(ctx, idle))
		held, err := r.Acquire(ctx, "op_held", "owner-a", time.Minute, 0)
		must(t, err)
		must(t, f.Forget(ctx, []string{"op_idle", "op_held", "op_never"}))
		// The idle counter is gone: without a floor it starts again.
		again, err := r.Acquire(ctx, "op_idle", "owner-b", time.Minute, 0)
		if err != nil || again.Fence != 1 {
			t.Fatalf("acquire after forget: %+v, %v, want fence 1", again, err)
		}
		// The held lease still holds, and its counter still counts.
		if _, err := r.Acquire(ctx, "op_held", "owner-b", time.Minute, 0); !errors.Is(err, gate.ErrHeld) {
			t.Fatalf("forget freed a held lease: %v", err)
		}
		must(t, r.Release(ctx, held))
		next, err := r.Acquire(ctx, "op_held", "owner-b", time.Minute, 0)
		if err != nil || next.Fence <= held.Fence {
			t.Fatalf("after forget of a held lease: %+v, %v (held fence %d)", next, err, held.Fence)
		}
	}},
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
