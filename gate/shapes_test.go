package gate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/gate/gatetest"
)

// The two shapes whose evidence is a commit: local (the statement inside
// the ledger's transaction) and handoff (the outbox, then the relay).

func localRig(t *testing.T) (*rig, *gatetest.Local) {
	r := newRig(t, gate.ShapeLocal, gate.DeadLetterBroker)
	r.route.Local = &gate.LocalSpec{SQL: "INSERT ... RETURNING id", Timeout: time.Second}
	x := &gatetest.Local{Ledger: r.ledger}
	r.gate.Local = x
	return r, x
}

func TestLocalEffectCommitsWithItsEvidence(t *testing.T) {
	t.Parallel()
	r, x := localRig(t)
	m := r.msg("m-1", `{"order":1}`)
	want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
	s := r.snapshot(m)
	if s.Op.State != gate.StateAcknowledged || s.Op.ResultID != "row-1" || x.Rows(r.key(m)) != 1 ||
		len(s.Attempts) != 1 || s.Attempts[0].Outcome != gate.OutcomeConfirmed || s.Attempts[0].FinishedAt == nil {
		t.Fatalf("%+v, attempts %+v, %d rows", s.Op, s.Attempts, x.Rows(r.key(m)))
	}
	// A redelivery reads the committed result and never runs it again.
	want(t, r.push(m, true), gate.Ack, gate.StateAcknowledged)
	if x.Runs() != 1 || r.fx.Calls() != 0 {
		t.Fatalf("%d runs, %d calls", x.Runs(), r.fx.Calls())
	}
}

func TestLocalStatementFailureRollsBackOnlyTheStatement(t *testing.T) {
	t.Parallel()
	r, x := localRig(t)
	m := r.msg("m-1", `{"order":1}`)
	x.Script = func(n int, _ *gate.EffectRequest) gate.EffectResult {
		if n == 1 {
			return gate.EffectResult{Outcome: gate.OutcomeRetryable, Reason: "SQLSTATE 57014: statement timeout"}
		}
		return gate.EffectResult{Outcome: gate.OutcomeConfirmed, ResultID: "row-2"}
	}
	want(t, r.push(m, true), gate.Nack, gate.StatePendingEffect)
	s := r.snapshot(m)
	if x.Rows(r.key(m)) != 0 || s.Op.ResultID != "" || len(s.Attempts) != 1 || s.Attempts[0].Outcome != gate.OutcomeRetryable {
		t.Fatalf("after a timeout: %+v, attempts %+v", s.Op, s.Attempts)
	}
	want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
	if x.Rows(r.key(m)) != 1 {
		t.Fatalf("%d rows", x.Rows(r.key(m)))
	}
}

func TestLocalCommitFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	r, x := localRig(t)
	m := r.msg("m-1", `{"order":1}`)
	r.ledger.BeforeWrite = func(c *gate.Change) error {
		if c.Settle != nil {
			return errors.New("connection reset during commit")
		}
		return nil
	}
	want(t, r.push(m, true), gate.Nack, "")
	// The operation's creation, its statement and its evidence are one
	// transaction: none of them is on record, and no attempt is counted.
	id, err := gate.Identify(r.route, m)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := r.ledger.Snapshot(id.OperationID); ok || x.Rows(r.key(m)) != 0 {
		t.Fatalf("a failed transaction left %+v and %d rows", s.Op, x.Rows(r.key(m)))
	}
	r.ledger.BeforeWrite = nil
	want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
	if s := r.snapshot(m); s.Op.AttemptCount != 1 {
		t.Fatalf("%d attempts counted, want the one that committed", s.Op.AttemptCount)
	}
	if x.Rows(r.key(m)) != 1 || x.Runs() != 2 {
		t.Fatalf("%d rows after %d runs", x.Rows(r.key(m)), x.Runs())
	}
}

func TestLocalTerminalStatementIsDeadLettered(t *testing.T) {
	t.Parallel()
	r, x := localRig(t)
	r.route.DeadLetter = gate.DeadLetterGateway
	x.Script = func(int, *gate.EffectRequest) gate.EffectResult {
		return gate.EffectResult{Outcome: gate.OutcomeTerminal, Reason: "SQLSTATE 23514: check constraint orders_total_positive"}
	}
	m := r.msg("m-1", `{"order":-1}`)
	want(t, r.push(m, true), gate.Ack, gate.StateTerminalFailure)
	if s := r.snapshot(m); len(s.DeadLetters) != 1 || x.Rows(r.key(m)) != 0 {
		t.Fatalf("dead letters %+v, %d rows", s.DeadLetters, x.Rows(r.key(m)))
	}
}

func handoffRig(t *testing.T, lookup bool, dedupe time.Duration) *rig {
	r := newRig(t, gate.ShapeHandoff, gate.DeadLetterGateway)
	r.route.DedupeWindow = dedupe
	r.fx.Dedupe = dedupe > 0
	if lookup {
		r.route.Effect.LookupURL = "http://provider/effects/{key}"
	}
	r.route.Private = []string{"secret"}
	return r
}

func (r *rig) relay(m *gate.Message) *gate.Result {
	r.t.Helper()
	s := r.snapshot(m)
	if s.Outbox == nil {
		r.t.Fatal("no outbox entry")
	}
	res, err := r.gate.Relay(context.Background(), r.route, s.Outbox)
	if err != nil {
		r.t.Fatalf("relay: %v", err)
	}
	res.Finish(context.Background(), nil, true)
	return res
}

func TestHandoffAcksOnTheOutboxCommit(t *testing.T) {
	t.Parallel()
	r := handoffRig(t, false, time.Hour)
	m := r.msg("m-1", "x")
	m.Attributes = map[string]string{"secret": "s3", "region": "eu"}
	want(t, r.push(m, true), gate.Ack, gate.StatePendingEffect)
	s := r.snapshot(m)
	if s.Op.HandedOffAt == nil || s.Outbox == nil || r.fx.Calls() != 0 || s.Outbox.PublicationID != r.key(m) {
		t.Fatalf("%+v, outbox %+v, %d calls", s.Op, s.Outbox, r.fx.Calls())
	}
	if _, ok := s.Outbox.Message.Attributes["secret"]; ok || s.Outbox.Message.Attributes["region"] != "eu" {
		t.Fatalf("outbox attributes %v", s.Outbox.Message.Attributes)
	}
	// A redelivery acks from the ledger; a changed payload is a conflict.
	want(t, r.push(m, true), gate.Ack, gate.StatePendingEffect)
	if r.snapshot(m).Outbox.CreatedAt != s.Outbox.CreatedAt || r.fx.Calls() != 0 {
		t.Fatal("a redelivery wrote a second entry or called")
	}
	changed := r.msg("m-1", "y")
	if res := r.push(changed, true); res.State != gate.StateConflicting {
		t.Fatalf("changed payload: %s in %s", res.Decision, res.State)
	}
	// The relay performs it once, and the record ends acknowledged.
	if res := r.relay(m); res.Decision != gate.Ack {
		t.Fatalf("relay: %s (%s)", res.Decision, res.Reason)
	}
	s = r.snapshot(m)
	if s.Op.State != gate.StateAcknowledged || r.fx.Calls() != 1 || s.Op.ResultID == "" {
		t.Fatalf("after the relay: %+v, %d calls", s.Op, r.fx.Calls())
	}
	if res := r.relay(m); res.Decision != gate.Ack || r.fx.Calls() != 1 {
		t.Fatalf("a second relay pass: %s, %d calls", res.Decision, r.fx.Calls())
	}
}

// The failure-matrix row: publish an outbox item, then crash before marking
// it sent. The relay's next pass reconciles by the stable publication id.
func TestRelayCrashBeforeRecordingReconciles(t *testing.T) {
	t.Parallel()
	crash := func(r *rig) {
		r.failSettling()
		e := r.snapshot(r.msg("m-1", "x")).Outbox
		if _, err := r.gate.Relay(context.Background(), r.route, e); err == nil {
			r.t.Fatal("the relay recorded its result through a failing ledger")
		}
		r.ledger.BeforeWrite = nil
		r.leases.Flush() // the crashed relay's lease is gone with it
		r.clock.Advance(time.Minute)
	}
	t.Run("by lookup", func(t *testing.T) {
		t.Parallel()
		r := handoffRig(t, true, 0)
		m := r.msg("m-1", "x")
		r.push(m, true)
		crash(r)
		if res := r.relay(m); res.Decision != gate.Ack {
			t.Fatalf("%s (%s)", res.Decision, res.Reason)
		}
		s := r.snapshot(m)
		if r.fx.Calls() != 1 || r.fx.Lookups() != 1 || r.fx.Applied(r.key(m)) != 1 || s.Op.State != gate.StateAcknowledged {
			t.Fatalf("%d calls, %d lookups, %s", r.fx.Calls(), r.fx.Lookups(), s.Op.State)
		}
	})
	t.Run("inside the provider's dedupe window", func(t *testing.T) {
		t.Parallel()
		r := handoffRig(t, false, time.Hour)
		m := r.msg("m-1", "x")
		r.push(m, true)
		crash(r)
		r.relay(m)
		if r.fx.Calls() != 2 || r.fx.Applied(r.key(m)) != 1 {
			t.Fatalf("%d calls, %d applied", r.fx.Calls(), r.fx.Applied(r.key(m)))
		}
	})
	t.Run("neither: parked, never resent", func(t *testing.T) {
		t.Parallel()
		r := handoffRig(t, false, 0)
		m := r.msg("m-1", "x")
		r.push(m, true)
		crash(r)
		if res := r.relay(m); res.Decision != gate.Nack || res.State != gate.StateEffectIndeterminate {
			t.Fatalf("%s in %s", res.Decision, res.State)
		}
		r.relay(m)
		if r.fx.Calls() != 1 {
			t.Fatalf("%d calls", r.fx.Calls())
		}
		// The broker is still told ack: it was acked when the entry committed.
		want(t, r.push(m, true), gate.Ack, gate.StateEffectIndeterminate)
	})
}

func TestRelayRetriesThenDeadLetters(t *testing.T) {
	t.Parallel()
	r := handoffRig(t, false, time.Hour)
	r.fx.Script = func(int, *gate.EffectRequest, func() string) gate.EffectResult {
		return gate.EffectResult{Outcome: gate.OutcomeRetryable, StatusCode: 503, Reason: "HTTP 503"}
	}
	m := r.msg("m-1", "x")
	r.push(m, true)
	for i := 1; i <= 2; i++ {
		if res := r.relay(m); res.Decision != gate.Nack || res.State != gate.StatePendingEffect {
			t.Fatalf("pass %d: %s in %s", i, res.Decision, res.State)
		}
		r.clock.Advance(time.Minute)
	}
	// The third attempt reaches the limit: terminal, dead-lettered by the
	// gateway (the broker was acked long ago), and no fourth call.
	res := r.relay(m)
	r.relay(m)
	s := r.snapshot(m)
	if res.State != gate.StateTerminalFailure || len(s.DeadLetters) != 1 || r.fx.Calls() != 3 {
		t.Fatalf("%s, dead letters %+v, %d calls", res.State, s.DeadLetters, r.fx.Calls())
	}
}

// A relay pass whose response was lost while the lookup was down parks the
// operation; the reconciler's lookup settles it later, all the way to
// acknowledged, since its broker was acked at the handoff.
func TestParkedHandoffIsReconciledByLookup(t *testing.T) {
	t.Parallel()
	r := handoffRig(t, true, 0)
	m := r.msg("m-1", "x")
	r.push(m, true)
	r.loseResponses()
	r.fx.LookupDown = true
	if res := r.relay(m); res.State != gate.StateEffectIndeterminate {
		t.Fatalf("%s in %s (%s)", res.Decision, res.State, res.Reason)
	}
	r.fx.Script, r.fx.LookupDown = nil, false
	op := r.snapshot(m).Op
	p, err := r.gate.Reconcile(context.Background(), r.route, &op)
	if err != nil || p.Action != gate.ActConfirm {
		t.Fatalf("%s, %v", p.Action, err)
	}
	s := r.snapshot(m)
	if s.Op.State != gate.StateAcknowledged || s.Op.ResultID == "" || r.fx.Calls() != 1 || r.fx.Applied(r.key(m)) != 1 {
		t.Fatalf("%+v, %d calls", s.Op, r.fx.Calls())
	}
}

// Issue 21, item 9: the broker was acked when the outbox entry committed, so
// a redelivery met while the relay is mid-call (its lease taken in the
// reservation store, its attempt open in the ledger) must be answered from
// the ledger at once. Nacking it as contended would make the broker retry a
// message whose fate no longer depends on it.
func TestHandoffRedeliveryAcksWhileTheRelayHoldsTheLease(t *testing.T) {
	t.Parallel()
	r := handoffRig(t, false, time.Hour)
	m := r.msg("m-1", "x")
	want(t, r.push(m, true), gate.Ack, gate.StatePendingEffect)

	calling, release := make(chan struct{}), make(chan struct{})
	r.fx.Script = func(_ int, _ *gate.EffectRequest, apply func() string) gate.EffectResult {
		close(calling)
		<-release
		return gate.EffectResult{Outcome: gate.OutcomeConfirmed, ResultID: apply()}
	}
	entry := r.snapshot(m).Outbox
	relayed := make(chan *gate.Result, 1)
	go func() {
		res, err := r.gate.Relay(context.Background(), r.route, entry)
		if err != nil {
			t.Errorf("relay: %v", err)
			close(relayed)
			return
		}
		res.Finish(context.Background(), nil, true)
		relayed <- res
	}()
	<-calling
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	id, err := gate.Identify(r.route, m)
	if err != nil {
		t.Fatal(err)
	}
	// The premise: the relay's lease is taken and its attempt is open.
	if _, err := r.leases.Acquire(context.Background(), id.OperationID, "someone-else", time.Minute, 0); !errors.Is(err, gate.ErrHeld) {
		t.Fatalf("the relay does not hold the lease mid-call: %v", err)
	}
	if s := r.snapshot(m); s.Op.LastAttempt == nil || s.Op.LastAttempt.Outcome != "" {
		t.Fatalf("no open attempt mid-call: %+v", s.Op.LastAttempt)
	}
	for i := range 3 {
		res := r.push(m, true)
		if res.Decision != gate.Ack {
			t.Fatalf("redelivery %d while the relay calls: %s (%s), want ack", i+1, res.Decision, res.Reason)
		}
	}
	if r.fx.Calls() != 1 {
		t.Fatalf("%d calls while the relay held the lease, want its one", r.fx.Calls())
	}
	close(release)
	if res := <-relayed; res == nil || res.Decision != gate.Ack {
		t.Fatalf("relay: %+v", res)
	}
	// Once the effect is confirmed, the redelivery still acks and the
	// record stays acknowledged.
	want(t, r.push(m, true), gate.Ack, gate.StateAcknowledged)
	if s := r.snapshot(m); s.Op.State != gate.StateAcknowledged || r.fx.Applied(r.key(m)) != 1 {
		t.Fatalf("%s, %d applied", s.Op.State, r.fx.Applied(r.key(m)))
	}
}
