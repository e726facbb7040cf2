package gate_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/gate/gatetest"
)

// These hold the executors of gate/recovery.go to what the recovery rows
// promise: each writes exactly its row, under the lease, and a grant is
// exactly one attempt.

// loseResponses makes every call apply the effect and lose the answer.
func (r *rig) loseResponses() {
	r.fx.Script = func(_ int, _ *gate.EffectRequest, apply func() string) gate.EffectResult {
		apply()
		return gate.EffectResult{Outcome: gate.OutcomeUnknown, Reason: "connection reset after sending"}
	}
}

// indeterminate pushes m once on an unsafe or lookup rig whose responses
// are lost, leaving it in effect_indeterminate.
func (r *rig) indeterminate(m *gate.Message) gatetest.Snapshot {
	r.t.Helper()
	r.loseResponses()
	if r.route.Shape == gate.ShapeLookup {
		r.fx.LookupDown = true
	}
	r.push(m, true)
	s := r.snapshot(m)
	wantState(r.t, s, gate.StateEffectIndeterminate)
	r.fx.Script, r.fx.LookupDown = nil, false
	return s
}

func (r *rig) resolve(id string, k gate.ResolutionKind, resultID string) (*gate.Operation, bool, error) {
	return r.gate.Resolve(context.Background(), id, gate.Resolution{Kind: k, ResultID: resultID, Reason: "asked the provider", Actor: "alice"})
}

func TestNotHappenedAllowsExactlyOneAttempt(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeUnsafe, gate.DeadLetterBroker)
	m := r.msg("m-1", "x")
	id := r.indeterminate(m).Op.ID
	op, changed, err := r.resolve(id, gate.ResolveNotHappened, "")
	if err != nil || !changed || op.State != gate.StatePendingEffect || op.Grant != op.AttemptCount+1 {
		t.Fatalf("resolve: %+v changed %v, %v", op, changed, err)
	}
	// The granted attempt is lost too: the unsafe rules apply again, and no
	// third call is ever made.
	r.loseResponses()
	want(t, r.push(m, true), gate.Nack, gate.StateEffectIndeterminate)
	want(t, r.push(m, true), gate.Nack, gate.StateEffectIndeterminate)
	s := r.snapshot(m)
	if r.fx.Calls() != 2 || s.Attempts[0].IdempotencyKey != s.Attempts[1].IdempotencyKey {
		t.Fatalf("%d calls, attempts %+v", r.fx.Calls(), s.Attempts)
	}
	if len(s.Interventions) != 1 || s.Interventions[0].Actor != "alice" || s.Interventions[0].To != gate.StatePendingEffect {
		t.Fatalf("interventions %+v", s.Interventions)
	}
}

func TestReplayOfATerminalOperationMakesAtMostOneEffect(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeIdempotent, gate.DeadLetterGateway)
	r.fx.Dedupe = false
	m := r.msg("m-1", "x")
	r.fx.Script = func(n int, _ *gate.EffectRequest, apply func() string) gate.EffectResult {
		if n == 1 {
			return gate.EffectResult{Outcome: gate.OutcomeTerminal, StatusCode: 422, Reason: "HTTP 422"}
		}
		return gate.EffectResult{Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: apply()}
	}
	want(t, r.push(m, true), gate.Ack, gate.StateTerminalFailure)
	id := r.snapshot(m).Op.ID
	if _, _, err := r.resolve(id, gate.ResolveReplay, ""); err != nil {
		t.Fatal(err)
	}
	want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
	want(t, r.push(m, true), gate.Ack, gate.StateAcknowledged)
	if r.fx.Calls() != 2 || r.fx.Applied(r.key(m)) != 1 {
		t.Fatalf("%d calls, %d applied", r.fx.Calls(), r.fx.Applied(r.key(m)))
	}
	// Confirmed work is never replayed.
	before := r.snapshot(m)
	if _, _, err := r.resolve(id, gate.ResolveReplay, ""); !errors.Is(err, gate.ErrRefused) {
		t.Fatalf("replay of acknowledged work: %v, want ErrRefused", err)
	}
	if after := r.snapshot(m); len(after.Transitions) != len(before.Transitions) || len(after.Interventions) != 1 {
		t.Fatalf("a refused replay wrote something: %d -> %d transitions", len(before.Transitions), len(after.Transitions))
	}
}

func TestTheSameResolutionTwiceWritesOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeUnsafe, gate.DeadLetterBroker)
	m := r.msg("m-1", "x")
	id := r.indeterminate(m).Op.ID
	if _, changed, err := r.resolve(id, gate.ResolveHappened, "res-ext"); err != nil || !changed {
		t.Fatalf("first: %v %v", changed, err)
	}
	op, changed, err := r.resolve(id, gate.ResolveHappened, "res-ext")
	if err != nil || changed || op.State != gate.StateEffectConfirmed || op.ResultID != "res-ext" {
		t.Fatalf("second: %+v changed %v, %v", op, changed, err)
	}
	// Another request is judged on its own: the effect is confirmed now.
	if _, _, err := r.resolve(id, gate.ResolveHappened, "res-other"); !errors.Is(err, gate.ErrRefused) {
		t.Fatalf("a different happened: %v, want ErrRefused", err)
	}
	if s := r.snapshot(m); len(s.Interventions) != 1 {
		t.Fatalf("%d interventions", len(s.Interventions))
	}
	// The next delivery acks on the operator's evidence, with no new call.
	want(t, r.push(m, true), gate.Ack, gate.StateEffectConfirmed)
	if s := r.snapshot(m); r.fx.Calls() != 1 || s.Op.State != gate.StateAcknowledged {
		t.Fatalf("%d calls, %s", r.fx.Calls(), s.Op.State)
	}
}

func TestResolutionWaitsForTheLeaseHolder(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeUnsafe, gate.DeadLetterBroker)
	m := r.msg("m-1", "x")
	id := r.indeterminate(m).Op.ID
	lease, err := r.leases.Acquire(context.Background(), id, "someone-else", 30e9, 100)
	if err != nil {
		t.Fatal(err)
	}
	before := r.snapshot(m)
	if _, _, err := r.resolve(id, gate.ResolveAbandon, ""); !errors.Is(err, gate.ErrHeld) {
		t.Fatalf("resolve under a held lease: %v, want ErrHeld", err)
	}
	if after := r.snapshot(m); after.Op.State != before.Op.State || len(after.Interventions) != 0 {
		t.Fatalf("it wrote: %+v", after.Op)
	}
	if err := r.leases.Release(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
	if op, _, err := r.resolve(id, gate.ResolveAbandon, ""); err != nil || op.State != gate.StateTerminalFailure {
		t.Fatalf("after release: %+v, %v", op, err)
	}
}

// Two resolutions decided on the same evidence: the ledger lets one write.
func TestRacingResolutionsLeaveOneOutcome(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeUnsafe, gate.DeadLetterBroker)
	m := r.msg("m-1", "x")
	id := r.indeterminate(m).Op.ID
	var second error
	r.ledger.BeforeWrite = func(c *gate.Change) error {
		if c.Kind == gate.ChangeResolve && c.Intervene.Intervention.Kind == gate.ResolveHappened {
			r.ledger.BeforeWrite = nil
			_, _, second = r.resolve(id, gate.ResolveNotHappened, "")
		}
		return nil
	}
	// happened decided and holds its lease while not_happened tries.
	_, _, first := r.resolve(id, gate.ResolveHappened, "res-1")
	if first != nil || !errors.Is(second, gate.ErrHeld) {
		t.Fatalf("first %v, second %v", first, second)
	}
	s := r.snapshot(m)
	if s.Op.State != gate.StateEffectConfirmed || len(s.Interventions) != 1 {
		t.Fatalf("%s with %d interventions", s.Op.State, len(s.Interventions))
	}
	// Had the lease lapsed, the ledger's guard is what refuses the loser.
	r2 := newRig(t, gate.ShapeUnsafe, gate.DeadLetterBroker)
	id2 := r2.indeterminate(m).Op.ID
	r2.ledger.BeforeWrite = func(c *gate.Change) error {
		if c.Kind == gate.ChangeResolve && c.Intervene.Intervention.Kind == gate.ResolveHappened {
			r2.ledger.BeforeWrite = nil
			r2.leases.Flush()
			if _, _, err := r2.resolve(id2, gate.ResolveNotHappened, ""); err != nil {
				t.Errorf("the interloper: %v", err)
			}
		}
		return nil
	}
	if _, _, err := r2.resolve(id2, gate.ResolveHappened, "res-1"); !errors.Is(err, gate.ErrRefused) {
		t.Fatalf("the fenced-off resolution: %v, want ErrRefused", err)
	}
	if s := r2.snapshot(m); s.Op.State != gate.StatePendingEffect || len(s.Interventions) != 1 || s.Op.ResultID != "" {
		t.Fatalf("%s, %d interventions, result %q", s.Op.State, len(s.Interventions), s.Op.ResultID)
	}
}

func TestReconcileByLookup(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T) (*rig, *gate.Message, *gate.Operation) {
		r := newRig(t, gate.ShapeLookup, gate.DeadLetterBroker)
		r.route.Effect.LookupURL = "http://provider/effects/{key}"
		m := r.msg("m-1", "x")
		s := r.indeterminate(m)
		return r, m, &s.Op
	}
	t.Run("found confirms, and the next delivery acks without a call", func(t *testing.T) {
		t.Parallel()
		r, m, op := setup(t)
		p, err := r.gate.Reconcile(context.Background(), r.route, op)
		if err != nil || p.Action != gate.ActConfirm {
			t.Fatalf("%s, %v", p.Action, err)
		}
		s := r.snapshot(m)
		if s.Op.State != gate.StateEffectConfirmed || s.Op.ResultID == "" || s.Attempts[len(s.Attempts)-1].Kind != gate.AttemptLookup {
			t.Fatalf("%+v / %+v", s.Op, s.Attempts)
		}
		want(t, r.push(m, true), gate.Ack, gate.StateEffectConfirmed)
		if s := r.snapshot(m); r.fx.Calls() != 1 || s.Op.State != gate.StateAcknowledged {
			t.Fatalf("%d calls, %s", r.fx.Calls(), s.Op.State)
		}
	})
	t.Run("absent grants one attempt with the same key", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, gate.ShapeLookup, gate.DeadLetterBroker)
		r.route.Effect.LookupURL = "http://provider/effects/{key}"
		m := r.msg("m-1", "x")
		// The call failed before applying, and the lookup was down then.
		r.fx.Script = func(int, *gate.EffectRequest, func() string) gate.EffectResult {
			return gate.EffectResult{Outcome: gate.OutcomeUnknown, Reason: "timeout"}
		}
		r.fx.LookupDown = true
		r.push(m, true)
		r.fx.Script, r.fx.LookupDown = nil, false
		op := r.snapshot(m).Op
		if p, err := r.gate.Reconcile(context.Background(), r.route, &op); err != nil || p.Action != gate.ActGrant {
			t.Fatalf("%s, %v", p.Action, err)
		}
		want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
		s := r.snapshot(m)
		effects := 0
		for _, a := range s.Attempts {
			if a.Kind == gate.AttemptEffect {
				effects++
				if a.IdempotencyKey != r.key(m) {
					t.Fatalf("attempt under key %q", a.IdempotencyKey)
				}
			}
		}
		if r.fx.Calls() != 2 || r.fx.Applied(r.key(m)) != 1 || effects != 2 {
			t.Fatalf("%d calls, %d applied, %d effect attempts", r.fx.Calls(), r.fx.Applied(r.key(m)), effects)
		}
	})
	t.Run("unavailable stays and is checked later", func(t *testing.T) {
		t.Parallel()
		r, m, op := setup(t)
		r.fx.LookupDown = true
		for i := 1; i <= 2; i++ {
			cur := r.snapshot(m).Op
			if p, err := r.gate.Reconcile(context.Background(), r.route, &cur); err != nil || p.Action != gate.ActCheckLater {
				t.Fatalf("%s, %v", p.Action, err)
			}
			s := r.snapshot(m)
			if s.Op.State != gate.StateEffectIndeterminate || s.Op.Checks != i || s.Op.NextCheckAt == nil || !s.Op.NextCheckAt.After(r.clock.Now()) {
				t.Fatalf("check %d: %+v", i, s.Op)
			}
		}
		// A reconciler that read the operation before those checks is
		// refused: its evidence is stale.
		if _, err := r.gate.Reconcile(context.Background(), r.route, op); !errors.Is(err, gate.ErrRefused) {
			t.Fatalf("stale read: %v, want ErrRefused", err)
		}
	})
	t.Run("an unsafe route's lane is never looked up", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, gate.ShapeUnsafe, gate.DeadLetterBroker)
		r.route.Effect.LookupURL = "http://provider/effects/{key}"
		m := r.msg("m-1", "x")
		op := r.indeterminate(m).Op
		if _, err := r.gate.Reconcile(context.Background(), r.route, &op); !errors.Is(err, gate.ErrRefused) {
			t.Fatalf("%v, want ErrRefused", err)
		}
		if r.fx.Lookups() != 0 {
			t.Fatalf("%d lookups", r.fx.Lookups())
		}
	})
}
