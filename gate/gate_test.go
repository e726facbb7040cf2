package gate_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/gate/gatetest"
)

// These are the design note's failure-shaped cases at the gate's own level:
// fake ports, so each interleaving is a step the test takes, not a race it
// hopes to win. The HTTP-level tests in handlers/ hold the broker contract.

type rig struct {
	t      *testing.T
	gate   *gate.Gate
	ledger *gatetest.Ledger
	leases *gatetest.Reservations
	fx     *gatetest.Effects
	clock  *gatetest.Clock
	route  *gate.Route
	tokens atomic.Int64
}

func newRig(t *testing.T, shape gate.Shape, policy gate.DeadLetterPolicy) *rig {
	t.Helper()
	// The clock starts at the real time because the gate bounds each
	// delivery's context by a deadline taken from it.
	clock := gatetest.NewClock(time.Now())
	r := &rig{t: t, ledger: gatetest.NewLedger(), fx: &gatetest.Effects{Dedupe: shape == gate.ShapeIdempotent}, clock: clock}
	r.leases = gatetest.NewReservations(clock.Now)
	r.route = &gate.Route{
		Name: "orders", Tenant: "t1", Broker: gate.BrokerPubSub, Shape: shape,
		Key:          gate.KeySource{Kind: gate.KeyMessageID},
		Fingerprint:  gate.FingerprintSpec{Version: 1, Data: true},
		Effect:       gate.EffectSpec{Timeout: 5 * time.Second},
		DedupeWindow: time.Hour, MaxAttempts: 3, DeadLetter: policy,
		AckDeadline: 10 * time.Second, Retention: 8 * 24 * time.Hour, ContractVersion: "v1",
	}
	r.gate = &gate.Gate{
		Ledger: r.ledger, Reservations: r.leases, Effects: r.fx, Owner: "gw-1", Now: clock.Now,
		NewToken: func() string { return fmt.Sprint(r.tokens.Add(1)) },
	}
	return r
}

func (r *rig) msg(id, data string) *gate.Message {
	return &gate.Message{Broker: gate.BrokerPubSub, Source: "projects/p/subscriptions/s", MessageID: id,
		Data: []byte(data), PublishTime: r.clock.Now().Add(-time.Second)}
}

// push delivers m and finishes the result as a handler does once the
// response was (sent) or was not (!sent) written to the broker.
func (r *rig) push(m *gate.Message, sent bool) *gate.Result {
	r.t.Helper()
	res, err := r.gate.Deliver(context.Background(), r.route, m)
	var ie *gate.InfraError
	if err != nil && !errors.As(err, &ie) {
		r.t.Fatalf("Deliver: %v is not an InfraError", err)
	}
	res.Finish(context.Background(), nil, sent)
	return res
}

func (r *rig) snapshot(m *gate.Message) gatetest.Snapshot {
	r.t.Helper()
	id, err := gate.Identify(r.route, m)
	if err != nil {
		r.t.Fatal(err)
	}
	s, ok := r.ledger.Snapshot(id.OperationID)
	if !ok {
		r.t.Fatalf("no operation for %s", m.MessageID)
	}
	return s
}

func (r *rig) key(m *gate.Message) string {
	id, err := gate.Identify(r.route, m)
	if err != nil {
		r.t.Fatal(err)
	}
	return id.IdempotencyKey
}

func want(t *testing.T, res *gate.Result, d gate.Decision, s gate.State) {
	t.Helper()
	if res.Decision != d || res.State != s {
		t.Fatalf("answer %s in %s (%s), want %s in %s", res.Decision, res.State, res.Reason, d, s)
	}
}

func wantState(t *testing.T, s gatetest.Snapshot, st gate.State) {
	t.Helper()
	if s.Op.State != st {
		t.Fatalf("operation is %s (%s), want %s", s.Op.State, s.Op.Reason, st)
	}
}

// ownerDied lets the lease the ledger records for the delivery before run
// out, as it does for a process that died mid-delivery.
func (r *rig) ownerDied() { r.clock.Advance(r.route.AckDeadline + time.Second) }

// failSettling makes every write that settles an attempt fail, as a process
// that dies after its call and before its commit leaves things.
func (r *rig) failSettling() {
	r.ledger.BeforeWrite = func(c *gate.Change) error {
		if c.Settle != nil {
			return errors.New("connection reset")
		}
		return nil
	}
}

func TestAckOnlyAfterCommittedEvidence(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeIdempotent, gate.DeadLetterBroker)
	m := r.msg("m-1", "x")
	want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
	s := r.snapshot(m)
	wantState(t, s, gate.StateAcknowledged)
	if s.Op.ResultID == "" || s.Op.EvidenceAt == nil || s.Op.AckedAt == nil || s.Op.EvidenceAt.After(*s.Op.AckedAt) {
		t.Fatalf("evidence %q at %v, acked at %v", s.Op.ResultID, s.Op.EvidenceAt, s.Op.AckedAt)
	}
	if len(s.Deliveries) != 1 || s.Deliveries[0].Decision != gate.Ack || r.fx.Applied(r.key(m)) != 1 {
		t.Fatalf("deliveries %+v, %d effects", s.Deliveries, r.fx.Applied(r.key(m)))
	}
	if r.leases.Held(s.Op.ID) {
		t.Fatal("the lease outlived the delivery")
	}
}

// The ack could not be written to the broker: the operation stays
// ack_pending, and the redelivery that follows acks without a new effect.
func TestFailedAckWriteIsNotAcknowledged(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeUnsafe, gate.DeadLetterBroker)
	m := r.msg("m-1", "x")
	want(t, r.push(m, false), gate.Ack, gate.StateAckPending)
	s := r.snapshot(m)
	wantState(t, s, gate.StateAckPending)
	if s.Op.AckedAt != nil {
		t.Fatalf("acked at %v although the ack never reached the broker", s.Op.AckedAt)
	}
	want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
	s = r.snapshot(m)
	wantState(t, s, gate.StateAcknowledged)
	if r.fx.Calls() != 1 || len(s.Deliveries) != 2 {
		t.Fatalf("%d calls, %d deliveries", r.fx.Calls(), len(s.Deliveries))
	}
}

// A changed payload under the key of an operation still in flight is a
// conflict: it never runs under the original's idempotency key.
func TestConflictWhileTheOriginalIsOpen(t *testing.T) {
	t.Parallel()
	for _, policy := range []gate.DeadLetterPolicy{gate.DeadLetterBroker, gate.DeadLetterGateway} {
		t.Run(string(policy), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, gate.ShapeIdempotent, policy)
			r.fx.Script = func(_ int, _ *gate.EffectRequest, _ func() string) gate.EffectResult {
				return gate.EffectResult{Outcome: gate.OutcomeRetryable, StatusCode: 503, Reason: "busy"}
			}
			orig := r.msg("m-1", "original")
			want(t, r.push(orig, true), gate.Nack, gate.StatePendingEffect)
			changed := r.msg("m-1", "changed")
			res := r.push(changed, true)
			if res.State != gate.StateConflicting || res.Decision != gate.AnswerFor(gate.StateConflicting, policy) {
				t.Fatalf("changed payload: %s in %s (%s)", res.Decision, res.State, res.Reason)
			}
			if r.fx.Calls() != 1 {
				t.Fatalf("%d effect calls, want only the original's", r.fx.Calls())
			}
			if s := r.snapshot(orig); s.Op.State != gate.StatePendingEffect || s.Op.DeliveryCount != 1 {
				t.Fatalf("the original was touched: %+v", s.Op)
			}
		})
	}
}

// On a lookup route, a redelivery after an owner died mid-call asks the
// provider first; when it cannot answer, the operation goes indeterminate and
// the effect is not attempted again.
func TestRedeliveryWithLookupDownGoesIndeterminate(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeLookup, gate.DeadLetterBroker)
	m := r.msg("m-1", "x")
	r.failSettling()
	want(t, r.push(m, true), gate.Nack, "")
	wantState(t, r.snapshot(m), gate.StatePendingEffect)
	r.ledger.BeforeWrite = nil
	// Until the dead owner's recorded lease runs out, a redelivery holds off.
	held := r.push(m, true)
	if held.Decision != gate.Nack || !strings.Contains(held.Reason, "holds the lease") || r.fx.Lookups() != 0 {
		t.Fatalf("inside the recorded lease: %s (%s), %d lookups", held.Decision, held.Reason, r.fx.Lookups())
	}
	r.ownerDied()
	r.fx.LookupDown = true
	want(t, r.push(m, true), gate.Nack, gate.StateEffectIndeterminate)
	s := r.snapshot(m)
	if s.Op.Lane != gate.LaneOperator || r.fx.Calls() != 1 || r.fx.Lookups() != 1 {
		t.Fatalf("lane %q, %d calls, %d lookups", s.Op.Lane, r.fx.Calls(), r.fx.Lookups())
	}
	// And it stays there: no later delivery re-executes it.
	r.fx.LookupDown = false
	want(t, r.push(m, true), gate.Nack, gate.StateEffectIndeterminate)
	if r.fx.Calls() != 1 {
		t.Fatalf("%d calls after the hold", r.fx.Calls())
	}
}

// The same redelivery with the lookup up: found settles without a call,
// absent allows exactly one new attempt under the same key.
func TestRedeliveryLooksUpBeforeRetrying(t *testing.T) {
	t.Parallel()
	t.Run("found", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, gate.ShapeLookup, gate.DeadLetterBroker)
		m := r.msg("m-1", "x")
		r.failSettling()
		r.push(m, true)
		r.ledger.BeforeWrite = nil
		r.ownerDied()
		want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
		if s := r.snapshot(m); s.Op.State != gate.StateAcknowledged || s.Op.ResultID == "" || r.fx.Calls() != 1 || r.fx.Applied(r.key(m)) != 1 {
			t.Fatalf("%s result %q, %d calls", s.Op.State, s.Op.ResultID, r.fx.Calls())
		}
	})
	t.Run("absent", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, gate.ShapeLookup, gate.DeadLetterBroker)
		m := r.msg("m-1", "x")
		// The first call fails before applying, and its owner dies.
		r.fx.Script = func(n int, _ *gate.EffectRequest, apply func() string) gate.EffectResult {
			if n == 1 {
				return gate.EffectResult{Outcome: gate.OutcomeUnknown, Reason: "connection refused"}
			}
			return gate.EffectResult{Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: apply()}
		}
		r.failSettling()
		r.push(m, true)
		r.ledger.BeforeWrite = nil
		r.ownerDied()
		want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
		s := r.snapshot(m)
		// The lookup is an attempt of its own, between the two calls.
		if r.fx.Calls() != 2 || r.fx.Applied(r.key(m)) != 1 || s.Op.AttemptCount != 3 || s.Attempts[1].Kind != gate.AttemptLookup ||
			s.Attempts[1].Outcome != gate.OutcomeAbsent || s.Attempts[2].IdempotencyKey != s.Attempts[0].IdempotencyKey {
			t.Fatalf("%d calls, %d applied, attempts %+v", r.fx.Calls(), r.fx.Applied(r.key(m)), s.Attempts)
		}
	})
}

// A response lost after the effect, by shape.
func TestLostResponseByShape(t *testing.T) {
	t.Parallel()
	lose := func(_ int, _ *gate.EffectRequest, apply func() string) gate.EffectResult {
		apply()
		return gate.EffectResult{Outcome: gate.OutcomeUnknown, Reason: "timeout"}
	}
	t.Run("idempotent retries under the same key, inside the window", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, gate.ShapeIdempotent, gate.DeadLetterBroker)
		r.fx.Script = lose
		m := r.msg("m-1", "x")
		want(t, r.push(m, true), gate.Nack, gate.StatePendingEffect)
		r.fx.Script = nil
		want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
		if r.fx.Applied(r.key(m)) != 1 || r.fx.Calls() != 2 {
			t.Fatalf("%d applied over %d calls", r.fx.Applied(r.key(m)), r.fx.Calls())
		}
	})
	t.Run("idempotent past the window is indeterminate", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, gate.ShapeIdempotent, gate.DeadLetterBroker)
		r.fx.Script = lose
		m := r.msg("m-1", "x")
		r.push(m, true)
		r.clock.Advance(2 * time.Hour)
		want(t, r.push(m, true), gate.Nack, gate.StateEffectIndeterminate)
		if r.fx.Calls() != 1 {
			t.Fatalf("%d calls", r.fx.Calls())
		}
	})
	t.Run("lookup finds the effect at once", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, gate.ShapeLookup, gate.DeadLetterBroker)
		r.fx.Script = lose
		m := r.msg("m-1", "x")
		want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
		if r.fx.Lookups() != 1 || r.fx.Calls() != 1 {
			t.Fatalf("%d lookups, %d calls", r.fx.Lookups(), r.fx.Calls())
		}
	})
	t.Run("unsafe is indeterminate and stays so", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, gate.ShapeUnsafe, gate.DeadLetterGateway)
		r.fx.Script = lose
		m := r.msg("m-1", "x")
		want(t, r.push(m, true), gate.Nack, gate.StateEffectIndeterminate)
		want(t, r.push(m, true), gate.Nack, gate.StateEffectIndeterminate)
		if r.fx.Calls() != 1 {
			t.Fatalf("%d calls", r.fx.Calls())
		}
	})
	t.Run("repeatable repeats, then stops at the limit", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, gate.ShapeRepeatable, gate.DeadLetterGateway)
		r.fx.Script = lose
		m := r.msg("m-1", "x")
		want(t, r.push(m, true), gate.Nack, gate.StatePendingEffect)
		want(t, r.push(m, true), gate.Nack, gate.StatePendingEffect)
		want(t, r.push(m, true), gate.Ack, gate.StateTerminalFailure)
		s := r.snapshot(m)
		if r.fx.Calls() != 3 || len(s.DeadLetters) != 1 {
			t.Fatalf("%d calls, dead letters %+v", r.fx.Calls(), s.DeadLetters)
		}
		want(t, r.push(m, true), gate.Ack, gate.StateTerminalFailure)
		if r.fx.Calls() != 3 {
			t.Fatalf("a terminal operation was called again: %d calls", r.fx.Calls())
		}
	})
}

// Kill the worker after durable intent and before its call: the next owner
// resumes with the recorded idempotency key, under a higher fence.
func TestOrphanedIntentIsResumed(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeIdempotent, gate.DeadLetterBroker)
	m := r.msg("m-1", "x")
	r.fx.OnCall = func(*gate.EffectRequest) {}
	r.failSettling()
	r.fx.Script = func(int, *gate.EffectRequest, func() string) gate.EffectResult {
		return gate.EffectResult{Outcome: gate.OutcomeUnknown, Reason: "died before sending"}
	}
	r.push(m, true)
	r.ledger.BeforeWrite, r.fx.Script = nil, nil
	r.ownerDied()
	want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
	s := r.snapshot(m)
	if s.Op.Fence < 2 || s.Attempts[1].IdempotencyKey != s.Attempts[0].IdempotencyKey || r.fx.Applied(r.key(m)) != 1 {
		t.Fatalf("fence %d, attempts %+v", s.Op.Fence, s.Attempts)
	}
}

// The lease is lost while the first owner's call is in flight (Redis lost
// its data) and the call runs past its bound; a second delivery takes over
// and settles. The first owner's
// late result is fenced off: it answers nack and commits nothing.
func TestStaleOwnerIsFenced(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeIdempotent, gate.DeadLetterBroker)
	m := r.msg("m-1", "x")
	var second *gate.Result
	r.fx.OnCall = func(req *gate.EffectRequest) {
		if req.Fence != 1 {
			return
		}
		r.leases.Flush()
		// The first call outlives every bound the route puts on it (a
		// downstream that ignores the request's deadline), so the ledger's
		// fence is all that stands between it and a second commit.
		r.clock.Advance(r.route.AckDeadline + time.Second)
		second = r.push(m, true)
	}
	first := r.push(m, true)
	want(t, second, gate.Ack, gate.StateAckPending)
	if first.Decision != gate.Nack || !strings.Contains(first.Reason, "fenced") {
		t.Fatalf("stale owner answered %s (%s)", first.Decision, first.Reason)
	}
	s := r.snapshot(m)
	wantState(t, s, gate.StateAcknowledged)
	if s.Op.Fence != 2 || r.fx.Applied(r.key(m)) != 1 || s.Attempts[0].FinishedAt != nil {
		t.Fatalf("fence %d, %d applied, attempt 1 %+v", s.Op.Fence, r.fx.Applied(r.key(m)), s.Attempts[0])
	}
	// The stale owner's delivery was the first, under fence 1.
	if d := s.Deliveries[0]; d.Fence != 1 || d.Decision != gate.Nack {
		t.Fatalf("the stale owner's delivery: %+v", d)
	}
}

// A delivery that finds the lease held answers nack and calls nothing.
func TestContendedDeliveryNacks(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeIdempotent, gate.DeadLetterBroker)
	m := r.msg("m-1", "x")
	var second *gate.Result
	r.fx.OnCall = func(*gate.EffectRequest) {
		if second == nil {
			second = r.push(m, true)
		}
	}
	want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
	if second.Decision != gate.Nack || r.fx.Calls() != 1 {
		t.Fatalf("contender: %s (%s), %d calls", second.Decision, second.Reason, r.fx.Calls())
	}
}

// Documented failures retry until the limit, then the operation is terminal
// and dead-lettered per policy; a later delivery never calls again.
func TestRetriesThenTerminal(t *testing.T) {
	t.Parallel()
	for _, policy := range []gate.DeadLetterPolicy{gate.DeadLetterBroker, gate.DeadLetterGateway} {
		t.Run(string(policy), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, gate.ShapeIdempotent, policy)
			r.fx.Script = func(int, *gate.EffectRequest, func() string) gate.EffectResult {
				return gate.EffectResult{Outcome: gate.OutcomeRetryable, StatusCode: 503, Reason: "HTTP 503"}
			}
			m := r.msg("m-1", "x")
			want(t, r.push(m, true), gate.Nack, gate.StatePendingEffect)
			want(t, r.push(m, true), gate.Nack, gate.StatePendingEffect)
			final := gate.AnswerFor(gate.StateTerminalFailure, policy)
			want(t, r.push(m, true), final, gate.StateTerminalFailure)
			want(t, r.push(m, true), final, gate.StateTerminalFailure)
			s := r.snapshot(m)
			if r.fx.Calls() != 3 || (len(s.DeadLetters) == 1) != (policy == gate.DeadLetterGateway) {
				t.Fatalf("%d calls, dead letters %+v", r.fx.Calls(), s.DeadLetters)
			}
		})
	}
}

// The evidence store goes dark after the attempt: no ack, no automatic
// success, and the error says it was the store.
func TestLedgerDownAfterTheAttemptNacks(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeIdempotent, gate.DeadLetterBroker)
	r.failSettling()
	m := r.msg("m-1", "x")
	res, err := r.gate.Deliver(context.Background(), r.route, m)
	var ie *gate.InfraError
	if !errors.As(err, &ie) || res.Decision != gate.Nack {
		t.Fatalf("answer %s, err %v", res.Decision, err)
	}
	res.Finish(context.Background(), nil, true)
	if s := r.snapshot(m); s.Op.State != gate.StatePendingEffect || s.Op.AckedAt != nil {
		t.Fatalf("after a failed settle: %+v", s.Op)
	}
}

// A redelivery of acknowledged work is acked from the ledger and flagged.
func TestRedeliveryAfterAckIsAnAnomaly(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeUnsafe, gate.DeadLetterBroker)
	m := r.msg("m-1", "x")
	r.push(m, true)
	writes := r.ledger.Writes
	want(t, r.push(m, true), gate.Ack, gate.StateAcknowledged)
	s := r.snapshot(m)
	if r.fx.Calls() != 1 || r.ledger.Writes != writes || s.Deliveries[1].Anomaly != "redelivered_after_ack" {
		t.Fatalf("%d calls, %d writes (had %d), delivery %+v", r.fx.Calls(), r.ledger.Writes, writes, s.Deliveries[1])
	}
}

// A message older than the evidence horizon is not taken for new work.
func TestRetentionGapIsTerminal(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeIdempotent, gate.DeadLetterGateway)
	m := r.msg("m-old", "x")
	m.PublishTime = r.clock.Now().Add(-9 * 24 * time.Hour)
	want(t, r.push(m, true), gate.Ack, gate.StateTerminalFailure)
	if s := r.snapshot(m); r.fx.Calls() != 0 || len(s.DeadLetters) != 1 {
		t.Fatalf("%d calls, dead letters %+v", r.fx.Calls(), s.DeadLetters)
	}
}

// Redis loses its data while a slow call is in flight on a lookup route whose
// downstream does not deduplicate. A new delivery must not claim before the
// first owner must have stopped: asked too early, the lookup would answer
// "absent" and a second call would apply the effect again.
func TestLostReservationsWaitForTheOwnersBound(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeLookup, gate.DeadLetterBroker)
	// Renewing: the lease the ledger records is two intervals long, and an
	// owner may go on renewing up to MaxExtension past it.
	r.route.Renewal = gate.Renewal{Interval: time.Second, MaxExtension: 30 * time.Second}
	m := r.msg("m-1", "x")
	var during []*gate.Result
	r.fx.Script = func(n int, req *gate.EffectRequest, apply func() string) gate.EffectResult {
		if n == 1 {
			r.leases.Flush()
			during = append(during, r.push(m, true)) // inside the lease the ledger records
			r.clock.Advance(3 * time.Second)
			during = append(during, r.push(m, true), r.push(m, true)) // past it, inside the owner's bound
		}
		return gate.EffectResult{Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: apply()}
	}
	want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
	for i, res := range during {
		if res.Decision != gate.Nack {
			t.Fatalf("delivery %d during the call: %s (%s)", i, res.Decision, res.Reason)
		}
	}
	if !strings.Contains(during[0].Reason, "holds the lease") {
		t.Fatalf("the first delivery was not held by the recorded lease: %s", during[0].Reason)
	}
	if !strings.Contains(during[1].Reason, "lost its state") {
		t.Fatalf("the first delivery after the loss was not held: %s", during[1].Reason)
	}
	s := r.snapshot(m)
	if r.fx.Calls() != 1 || r.fx.Lookups() != 0 || r.fx.Applied(r.key(m)) != 1 || s.Op.Fence != 1 || s.Op.State != gate.StateAcknowledged {
		t.Fatalf("%d calls, %d lookups, %d applied, fence %d, %s", r.fx.Calls(), r.fx.Lookups(), r.fx.Applied(r.key(m)), s.Op.Fence, s.Op.State)
	}
	if !slices.Contains(s.LeaseEvents, gatetest.LeaseEvent{Kind: "reset", Fence: 2}) {
		t.Fatalf("lease events %+v, want the reset the held delivery met", s.LeaseEvents)
	}
}

// When the owner died (no call can still be running past its bound), a
// delivery after the loss takes over as usual.
func TestLostReservationsAfterTheBoundTakeOver(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeLookup, gate.DeadLetterBroker)
	r.route.Renewal = gate.Renewal{Interval: time.Second, MaxExtension: 30 * time.Second}
	m := r.msg("m-1", "x")
	r.failSettling()
	r.push(m, true) // the owner dies after its call
	r.ledger.BeforeWrite = nil
	r.leases.Flush()
	r.clock.Advance(3 * time.Second) // past the lease the ledger records
	held := r.push(m, true)
	if held.Decision != gate.Nack || !strings.Contains(held.Reason, "lost its state") {
		t.Fatalf("inside the bound: %s (%s)", held.Decision, held.Reason)
	}
	r.clock.Advance(r.route.AckDeadline + r.route.Renewal.MaxExtension)
	want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
	if r.fx.Calls() != 1 || r.fx.Lookups() != 1 || r.fx.Applied(r.key(m)) != 1 {
		t.Fatalf("%d calls, %d lookups, %d applied", r.fx.Calls(), r.fx.Lookups(), r.fx.Applied(r.key(m)))
	}
}

// A lease lost while the call runs is recorded as a fact of its own, beside
// an effect that still settles under the owner's unchanged fence.
func TestLeaseLossIsRecorded(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeIdempotent, gate.DeadLetterBroker)
	r.route.Renewal = gate.Renewal{Interval: 5 * time.Millisecond, MaxExtension: time.Second}
	m := r.msg("m-1", "x")
	r.fx.OnCall = func(*gate.EffectRequest) {
		r.leases.Flush()
		deadline := time.Now().Add(10 * time.Second)
		for r.leases.LostRenewals() == 0 {
			if time.Now().After(deadline) {
				t.Error("no renewal noticed the lost lease")
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
	s := r.snapshot(m)
	if s.Op.LeaseLostAt == nil || s.Op.LeaseDeadline == nil || !strings.Contains(s.Op.Reason, "lease lost") {
		t.Fatalf("lease lost at %v, deadline %v, reason %q", s.Op.LeaseLostAt, s.Op.LeaseDeadline, s.Op.Reason)
	}
}

// A delivery whose claim the ledger refused (another owner moved the
// operation first) is on the record all the same: the claim that found the
// operation recorded it, and its answer follows.
func TestRefusedClaimIsStillRecorded(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeIdempotent, gate.DeadLetterBroker)
	m := r.msg("m-1", "x")
	r.fx.Script = func(int, *gate.EffectRequest, func() string) gate.EffectResult {
		return gate.EffectResult{Outcome: gate.OutcomeRetryable, StatusCode: 503, Reason: "HTTP 503"}
	}
	want(t, r.push(m, true), gate.Nack, gate.StatePendingEffect)
	r.ledger.BeforeWrite = func(c *gate.Change) error {
		if c.Claim != nil && c.Claim.Row == nil {
			return gate.ErrStateChanged
		}
		return nil
	}
	res := r.push(m, true)
	if res.Decision != gate.Nack {
		t.Fatalf("%s (%s)", res.Decision, res.Reason)
	}
	s := r.snapshot(m)
	if len(s.Deliveries) != 2 || s.Deliveries[1].Decision != gate.Nack || s.Deliveries[1].Reason != res.Reason || s.Op.DeliveryCount != 2 {
		t.Fatalf("deliveries %+v, count %d", s.Deliveries, s.Op.DeliveryCount)
	}
}

// A call that hangs keeps its lease only up to the route's cap on extension
// (max_extension): the renewer stops there and the lease lapses, so the
// operation is not hidden for as long as the call hangs.
func TestRenewalStopsAtTheCap(t *testing.T) {
	t.Parallel()
	r := newRig(t, gate.ShapeIdempotent, gate.DeadLetterBroker)
	r.route.Renewal = gate.Renewal{Interval: 2 * time.Millisecond, MaxExtension: 40 * time.Millisecond}
	m := r.msg("m-1", "x")
	id, err := gate.Identify(r.route, m)
	if err != nil {
		t.Fatal(err)
	}
	var first time.Time
	r.fx.OnCall = func(*gate.EffectRequest) {
		first = r.leases.LatestExpiry(id.OperationID)
		// The call hangs while the clock runs far past the cap; the renewer
		// keeps trying on its own timers meanwhile.
		// The gate's clock moves slower than the renewer's timers, so
		// renewals keep the lease alive until the cap, not longer.
		for range 300 {
			r.clock.Advance(500 * time.Microsecond)
			time.Sleep(time.Millisecond)
		}
	}
	want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
	limit := first.Add(r.route.Renewal.MaxExtension)
	if got := r.leases.LatestExpiry(id.OperationID); got.After(limit) {
		t.Fatalf("the lease was renewed to %s, past the cap at %s", got.Format(time.RFC3339Nano), limit.Format(time.RFC3339Nano))
	}
	if s := r.snapshot(m); s.Op.LeaseExtensions == 0 {
		t.Fatalf("no renewal recorded before the cap; the test proves nothing: %+v", s.Op)
	}
}

// A delivery waiting on its call holds one goroutine, its own: the lease
// renewer runs on the runtime's timers and borrows a goroutine only while
// a renewal is on its way. Not parallel: it counts the process's
// goroutines.
func TestRenewalHoldsNoGoroutineOfItsOwn(t *testing.T) {
	r := newRig(t, gate.ShapeIdempotent, gate.DeadLetterBroker)
	r.route.Renewal = gate.Renewal{Interval: 20 * time.Millisecond, MaxExtension: time.Hour}
	m := r.msg("m-1", "x")
	fewest := -1
	var renewedBefore, renewedAfter int
	r.fx.OnCall = func(*gate.EffectRequest) {
		for range 50 {
			if n := runtime.NumGoroutine(); fewest < 0 || n < fewest {
				fewest = n
			}
			time.Sleep(2 * time.Millisecond)
		}
		renewedBefore = r.leases.CallCount()
		time.Sleep(100 * time.Millisecond)
		renewedAfter = r.leases.CallCount()
	}
	base := runtime.NumGoroutine()
	want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
	if fewest > base {
		t.Fatalf("during the call the process held at least %d goroutines, %d before it: the renewer keeps one of its own", fewest, base)
	}
	if renewedAfter <= renewedBefore {
		t.Fatalf("no renewal while the call ran (%d store calls before, %d after): the test proves nothing", renewedBefore, renewedAfter)
	}
}

// No call is made without the reservation store's lease: a store that
// cannot take it makes the delivery a nack, with the attempt the creation
// recorded ended as not made, so that the next delivery makes it (on an
// unsafe route too, which would otherwise have to park an attempt of
// unknown outcome). The outage costs one attempt, not one per redelivery.
func TestNoCallWithoutTheReservation(t *testing.T) {
	t.Parallel()
	for _, shape := range []gate.Shape{gate.ShapeIdempotent, gate.ShapeUnsafe} {
		r := newRig(t, shape, gate.DeadLetterGateway)
		m := r.msg("m-1", "x")
		r.leases.Fail = errors.New("dial tcp: connection refused")
		for range 3 {
			res := r.push(m, true)
			if res.Decision != gate.Nack || r.fx.Calls() != 0 {
				t.Fatalf("%s: %s (%s) with %d calls while the store is down", shape, res.Decision, res.Reason, r.fx.Calls())
			}
			r.ownerDied()
		}
		s := r.snapshot(m)
		if s.Op.State != gate.StatePendingEffect || s.Op.AttemptCount != 1 || len(s.Attempts) != 1 ||
			s.Attempts[0].Outcome != gate.OutcomeRetryable || !strings.Contains(s.Attempts[0].Reason, "not called") {
			t.Fatalf("%s: %+v, attempts %+v", shape, s.Op, s.Attempts)
		}
		r.leases.Fail = nil
		want(t, r.push(m, true), gate.Ack, gate.StateAckPending)
		if r.fx.Calls() != 1 || r.fx.Applied(r.key(m)) != 1 {
			t.Fatalf("%s: %d calls, %d applied", shape, r.fx.Calls(), r.fx.Applied(r.key(m)))
		}
	}
}
