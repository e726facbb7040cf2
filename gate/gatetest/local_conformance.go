package gatetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// LocalHarness is a gate.Local under test with the ledger it commits to.
// The gate's local-shape tests run against the fake Local; these cases hold
// it to storage's, where the statement, the claim and the settlement share
// one Postgres transaction.
type LocalHarness struct {
	LedgerHarness
	Local gate.Local
	// Route returns a local route whose statement adds one row under the
	// request's idempotency key and returns the row's id, or, with refuse
	// set, a statement the database refuses for its data (a terminal
	// outcome, as a CHECK violation is).
	Route func(refuse bool) *gate.Route
	// Rows counts the statement's committed rows under key.
	Rows func(t *testing.T, key string) int
}

// RunLocal runs the local-statement conformance cases.
func RunLocal(t *testing.T, newHarness func(t *testing.T) LocalHarness) {
	for _, c := range localCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newHarness(t))
		})
	}
}

type localCase struct {
	name string
	run  func(t *testing.T, h LocalHarness)
}

func localOp(name string) *gate.Operation {
	op := newOp(name)
	op.Shape, op.DeadLetterPolicy = gate.ShapeLocal, gate.DeadLetterGateway
	return op
}

// localTakeover is the claim of a later delivery of a local route,
// committed with its statement: it takes the operation (pending_effect
// after a failed attempt 1) under fence and records attempt 2.
func localTakeover(t *testing.T, h LocalHarness, op *gate.Operation, fence int64) *gate.Change {
	t.Helper()
	d := redeliver(t, h.Ledger, op, "m-2", t0)
	w := claim(op, gate.StatePendingEffect, "owner-b", fence, t0, d)
	return gate.StartChange(w, steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StatePendingEffect),
		&gate.Attempt{N: 2, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, StartedAt: t0}, "retry", t0)
}

func localRequest(h LocalHarness, op *gate.Operation, refuse bool, fence int64) *gate.EffectRequest {
	return &gate.EffectRequest{Route: h.Route(refuse), OperationID: op.ID, IdempotencyKey: op.IdempotencyKey, Fence: fence,
		Message: &gate.Message{Broker: gate.BrokerPubSub, Source: "projects/p/subscriptions/s", MessageID: "m-1",
			Data: []byte(`{"order":1}`), Attributes: map[string]string{}}}
}

// settleAs builds the settlement the gate's decision table makes of the
// statement's result: confirmed with its row id, or terminal.
func settleAs(t *testing.T, op *gate.Operation, fence int64, n int, er gate.EffectResult) *gate.Change {
	t.Helper()
	done := t0.Add(time.Millisecond)
	fin := &gate.Attempt{N: n, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, Fence: fence, StartedAt: t0,
		FinishedAt: &done, Outcome: er.Outcome, ResultID: er.ResultID, Reason: er.Reason}
	if er.Outcome == gate.OutcomeConfirmed {
		w := settle(op, gate.StatePendingEffect, fence, fin, n, gate.Ack)
		return gate.ConfirmChange(w, steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending),
			er.ResultID, "the statement committed", done)
	}
	w := settle(op, gate.StatePendingEffect, fence, fin, n, gate.Ack)
	return gate.TerminalChange(w, steps(t, gate.StatePendingEffect, gate.StateTerminalFailure),
		&gate.DeadLetter{Reason: "the statement was refused", At: done}, "the statement was refused", done)
}

var errSettle = errors.New("settlement could not be built")

var localCases = []localCase{
	{"a confirmed statement commits with its evidence", func(t *testing.T, h LocalHarness) {
		op := localOp("local-ok")
		start(t, h.Ledger, op)
		var got gate.EffectResult
		err := h.Local.Apply(context.Background(), nil, localRequest(h, op, false, 1), func(er gate.EffectResult) (*gate.Change, error) {
			got = er
			return settleAs(t, op, 1, 1, er), nil
		})
		if err != nil {
			t.Fatalf("Apply: %v", err)
		}
		if got.Outcome != gate.OutcomeConfirmed || got.ResultID == "" {
			t.Fatalf("the statement's result reached settle as %+v, want confirmed with a row id", got)
		}
		stored := find(t, h.Ledger, op)
		if stored.State != gate.StateAckPending || stored.ResultID != got.ResultID || stored.Fence != 1 {
			t.Fatalf("stored %s with result %q under fence %d, want ack_pending with %q under 1", stored.State, stored.ResultID, stored.Fence, got.ResultID)
		}
		if n := h.Rows(t, op.IdempotencyKey); n != 1 {
			t.Fatalf("%d rows under the key, want the statement's one", n)
		}
		s := h.Inspect(t, op.ID)
		if len(s.Attempts) != 1 || s.Attempts[0].Outcome != gate.OutcomeConfirmed || s.Attempts[0].ResultID != got.ResultID {
			t.Fatalf("attempts %+v, want one confirmed with the row id", s.Attempts)
		}
		if len(s.Transitions) != 5 {
			t.Fatalf("%d transitions, want the claim's three and the settlement's two", len(s.Transitions))
		}
	}},
	{"a refused statement is recorded without its effect", func(t *testing.T, h LocalHarness) {
		op := localOp("local-refused")
		start(t, h.Ledger, op)
		var got gate.EffectResult
		err := h.Local.Apply(context.Background(), nil, localRequest(h, op, true, 1), func(er gate.EffectResult) (*gate.Change, error) {
			got = er
			return settleAs(t, op, 1, 1, er), nil
		})
		if err != nil {
			t.Fatalf("Apply: %v", err)
		}
		if got.Outcome != gate.OutcomeTerminal || got.Reason == "" {
			t.Fatalf("the refusal reached settle as %+v, want terminal with a reason", got)
		}
		if stored := find(t, h.Ledger, op); stored.State != gate.StateTerminalFailure || stored.ResultID != "" {
			t.Fatalf("stored %s with result %q, want terminal_failure without a result", stored.State, stored.ResultID)
		}
		if n := h.Rows(t, op.IdempotencyKey); n != 0 {
			t.Fatalf("%d rows under the key after a refused statement, want none", n)
		}
		s := h.Inspect(t, op.ID)
		if len(s.Attempts) != 1 || s.Attempts[0].Outcome != gate.OutcomeTerminal || len(s.DeadLetters) != 1 {
			t.Fatalf("attempts %+v, dead letters %+v: want the terminal attempt and its dead letter", s.Attempts, s.DeadLetters)
		}
	}},
	{"a creating claim commits with its statement and evidence, or not at all", func(t *testing.T, h LocalHarness) {
		op := localOp("local-create")
		err := h.Local.Apply(context.Background(), creating(t, op, "m-1"), localRequest(h, op, false, 1),
			func(gate.EffectResult) (*gate.Change, error) { return nil, errSettle })
		if !errors.Is(err, errSettle) {
			t.Fatalf("Apply: %v, want the settlement's error", err)
		}
		if _, _, err := h.Ledger.FindByID(context.Background(), op.ID); !errors.Is(err, gate.ErrNotFound) {
			t.Fatalf("an unsettled creation left the operation: %v", err)
		}
		if n := h.Rows(t, op.IdempotencyKey); n != 0 {
			t.Fatalf("%d rows under the key, want none", n)
		}
		err = h.Local.Apply(context.Background(), creating(t, op, "m-1"), localRequest(h, op, false, 1),
			func(er gate.EffectResult) (*gate.Change, error) { return settleAs(t, op, 1, 1, er), nil })
		if err != nil {
			t.Fatalf("Apply: %v", err)
		}
		if got := find(t, h.Ledger, op); got.State != gate.StateAckPending || got.AttemptCount != 1 || got.DeliveryCount != 1 {
			t.Fatalf("created %+v, want ack_pending after one attempt and one delivery", got)
		}
		if n := h.Rows(t, op.IdempotencyKey); n != 1 {
			t.Fatalf("%d rows under the key, want 1", n)
		}
	}},
	{"a creating claim that finds the operation records the delivery and runs nothing", func(t *testing.T, h LocalHarness) {
		op := localOp("local-found")
		start(t, h.Ledger, op)
		ran := false
		err := h.Local.Apply(context.Background(), creating(t, op, "m-2"), localRequest(h, op, false, 1),
			func(er gate.EffectResult) (*gate.Change, error) { ran = true; return settleAs(t, op, 1, 1, er), nil })
		var found *gate.Found
		if !errors.As(err, &found) || found.Op.ID != op.ID || found.Op.DeliveryCount != 2 {
			t.Fatalf("Apply: %v, want Found with the operation and its second delivery", err)
		}
		if ran || h.Rows(t, op.IdempotencyKey) != 0 {
			t.Fatalf("the statement ran (settled %v, %d rows) for an operation that existed", ran, h.Rows(t, op.IdempotencyKey))
		}
		if got := find(t, h.Ledger, op); got.State != gate.StatePendingEffect || got.DeliveryCount != 2 {
			t.Fatalf("stored %+v, want pending_effect with two deliveries", got)
		}
	}},
	{"a settlement that cannot be built takes the statement back", func(t *testing.T, h LocalHarness) {
		op := localOp("local-unsettled")
		start(t, h.Ledger, op)
		err := h.Local.Apply(context.Background(), nil, localRequest(h, op, false, 1), func(gate.EffectResult) (*gate.Change, error) {
			return nil, errSettle
		})
		if !errors.Is(err, errSettle) {
			t.Fatalf("Apply: %v, want the settlement's error", err)
		}
		if got := find(t, h.Ledger, op); got.State != gate.StatePendingEffect || got.LastAttempt == nil || got.LastAttempt.Outcome != "" {
			t.Fatalf("an unsettled statement changed the operation: %+v", got)
		}
		if n := h.Rows(t, op.IdempotencyKey); n != 0 {
			t.Fatalf("%d rows under the key, want none: the statement committed without its evidence", n)
		}
	}},
	{"a settlement the ledger refuses takes the statement back", func(t *testing.T, h LocalHarness) {
		op := localOp("local-stale")
		start(t, h.Ledger, op)
		err := h.Local.Apply(context.Background(), nil, localRequest(h, op, false, 1), func(er gate.EffectResult) (*gate.Change, error) {
			return settleAs(t, op, 2, 1, er), nil // a fence the ledger never gave
		})
		if !errors.Is(err, gate.ErrFenced) {
			t.Fatalf("Apply: %v, want ErrFenced", err)
		}
		if got := find(t, h.Ledger, op); got.State != gate.StatePendingEffect {
			t.Fatalf("a refused settlement changed the operation: %+v", got)
		}
		if n := h.Rows(t, op.IdempotencyKey); n != 0 {
			t.Fatalf("%d rows under the key, want none", n)
		}
	}},
	{"a later claim, its statement and its settlement commit together", func(t *testing.T, h LocalHarness) {
		op := localOp("local-takeover")
		start(t, h.Ledger, op)
		must(t, h.Ledger.Write(context.Background(), gate.RetryLaterChange(settle(op, gate.StatePendingEffect, 1,
			&gate.Attempt{N: 1, Outcome: gate.OutcomeRetryable}, 1, gate.Nack), "busy", t0)))
		take := localTakeover(t, h, op, 2)
		err := h.Local.Apply(context.Background(), take, localRequest(h, op, false, 2), func(er gate.EffectResult) (*gate.Change, error) {
			return settleAs(t, op, 2, 2, er), nil
		})
		if err != nil {
			t.Fatalf("Apply: %v", err)
		}
		if got := find(t, h.Ledger, op); got.State != gate.StateAckPending || got.Fence != 2 || got.AttemptCount != 2 {
			t.Fatalf("after the takeover: %+v", got)
		}
		if n := h.Rows(t, op.IdempotencyKey); n != 1 {
			t.Fatalf("%d rows under the key, want one", n)
		}
	}},
	{"a claim the ledger refuses commits no statement", func(t *testing.T, h LocalHarness) {
		op := localOp("local-fenced")
		start(t, h.Ledger, op) // fence 1, pending_effect, one delivery
		again := localTakeover(t, h, op, 1)
		err := h.Local.Apply(context.Background(), again, localRequest(h, op, false, 1), func(er gate.EffectResult) (*gate.Change, error) {
			return settleAs(t, op, 1, 2, er), nil
		})
		if !errors.Is(err, gate.ErrFenced) {
			t.Fatalf("Apply under a fence that is not higher: %v, want ErrFenced", err)
		}
		if n := h.Rows(t, op.IdempotencyKey); n != 0 {
			t.Fatalf("%d rows under the key, want none", n)
		}
		if got := find(t, h.Ledger, op); got.State != gate.StatePendingEffect || got.Fence != 1 || got.DeliveryCount != 2 || got.AttemptCount != 1 {
			t.Fatalf("a refused claim changed the operation: %+v", got)
		}
	}},
}
