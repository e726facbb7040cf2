package gate

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

func testRoute(shape Shape) *Route {
	return &Route{
		Name: "orders", Tenant: "t1", Broker: BrokerPubSub, Shape: shape,
		Key: KeySource{Kind: KeyMessageID}, Fingerprint: FingerprintSpec{Version: 1, Data: true},
		Effect:       EffectSpec{Timeout: 5 * time.Second},
		DedupeWindow: time.Hour, MaxAttempts: 3, DeadLetter: DeadLetterBroker,
		AckDeadline: 10 * time.Second, Retention: 8 * 24 * time.Hour,
	}
}

// row is one line of the decision table: the evidence, and the action, the
// state path and the broker's answer it leads to.
type row struct {
	name   string
	shape  Shape
	policy DeadLetterPolicy
	op     *Operation
	pub    time.Time
	fp     string
	held   bool
	want   Action
	path   []State
	answer Decision
	// sent is the path recorded once the ack is on the wire.
	sent []State
}

func (r row) evidence(now time.Time) Evidence {
	route := testRoute(r.shape)
	if r.policy != "" {
		route.DeadLetter = r.policy
	}
	fp := r.fp
	if fp == "" {
		fp = "fp-1"
	}
	return Evidence{Route: route, Op: r.op, Fingerprint: fp, Held: r.held, PublishTime: r.pub, Now: now}
}

func (r row) check(t *testing.T, got Plan) {
	t.Helper()
	if got.Action != r.want || !slices.Equal(got.Path, r.path) || got.Answer != r.answer || !slices.Equal(got.AfterSent, r.sent) {
		t.Fatalf("plan = %s path %v answer %s sent %v (%s)\nwant %s path %v answer %s sent %v",
			got.Action, got.Path, got.Answer, got.AfterSent, got.Reason, r.want, r.path, r.answer, r.sent)
	}
	if got.Reason == "" {
		t.Fatalf("plan %s has no reason", got.Action)
	}
	// The gateway dead-letters exactly the terminal plans it acks.
	if got.DeadLetter != (got.Target() == StateTerminalFailure && got.Answer == Ack) {
		t.Fatalf("plan %s to %s answering %s: dead letter %v", got.Action, got.Target(), got.Answer, got.DeadLetter)
	}
	// Every path the table plans is one the ledger will accept.
	from := State("")
	if r.op != nil && got.Action != ActConflict {
		from = r.op.State
	}
	if _, err := Path(from, got.Path...); err != nil {
		t.Fatalf("planned path %v from %q: %v", got.Path, from, err)
	}
	if len(got.AfterSent) > 0 {
		if _, err := Path(r.op.stateAfter(got.Path), got.AfterSent...); err != nil {
			t.Fatalf("after-send path %v: %v", got.AfterSent, err)
		}
	}
}

func (o *Operation) stateAfter(path []State) State {
	if len(path) > 0 {
		return path[len(path)-1]
	}
	if o == nil {
		return ""
	}
	return o.State
}

var (
	now     = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	first   = now.Add(-10 * time.Minute)
	longAgo = now.Add(-2 * time.Hour)
)

func op(state State, count int, outcome Outcome, firstAt *time.Time) *Operation {
	o := &Operation{ID: "op_1", Key: "k", Fingerprint: "fp-1", State: state, AttemptCount: count,
		FirstAttemptAt: firstAt, DeadLetterPolicy: DeadLetterBroker, Reason: "earlier reason"}
	if count > 0 {
		o.LastAttempt = &Attempt{N: count, Outcome: outcome, Reason: "HTTP 503"}
	}
	return o
}

var (
	pending  = StatePendingEffect
	toRetry  = []State{StateReserved, StatePendingEffect}
	toIndet  = []State{StateReserved, StateEffectIndeterminate}
	toTerm   = []State{StateReserved, StateTerminalFailure}
	toAckPen = []State{StateReserved, StateEffectConfirmed, StateAckPending}
	acked    = []State{StateAcknowledged}
)

// TestDecideTable walks every row of the arrival table.
func TestDecideTable(t *testing.T) {
	t.Parallel()
	gatewayTerminal := op(StateTerminalFailure, 3, OutcomeRetryable, &first)
	gatewayTerminal.DeadLetterPolicy = DeadLetterGateway
	rows := []row{
		{name: "new operation is attempted", shape: ShapeUnsafe, pub: now.Add(-time.Minute),
			want: ActAttempt, path: []State{StateReceived, StateReserved, pending}, answer: Nack},
		{name: "new operation older than retention is a gap", shape: ShapeIdempotent, pub: now.Add(-9 * 24 * time.Hour),
			want: ActRetentionGap, path: []State{StateReceived, StateTerminalFailure}, answer: Nack},
		{name: "retention gap under gateway dead-lettering is acked", shape: ShapeIdempotent, policy: DeadLetterGateway, pub: now.Add(-9 * 24 * time.Hour),
			want: ActRetentionGap, path: []State{StateReceived, StateTerminalFailure}, answer: Ack},
		{name: "key reused with another payload while the original is open", shape: ShapeIdempotent, fp: "fp-2", op: op(pending, 1, "", &first),
			want: ActConflict, path: []State{StateReceived, StateConflicting}, answer: Nack},
		{name: "key reused with another payload after the ack", shape: ShapeIdempotent, policy: DeadLetterGateway, fp: "fp-2", op: op(StateAcknowledged, 1, OutcomeConfirmed, &first),
			want: ActConflict, path: []State{StateReceived, StateConflicting}, answer: Ack},
		{name: "intent without attempt resumes", shape: ShapeUnsafe, op: op(pending, 0, "", nil),
			want: ActAttempt, path: toRetry, answer: Nack},
		{name: "reserved without attempt resumes without reserving twice", shape: ShapeUnsafe, op: op(StateReserved, 0, "", nil),
			want: ActAttempt, path: []State{pending}, answer: Nack},
		{name: "received without attempt is reserved first", shape: ShapeUnsafe, op: op(StateReceived, 0, "", nil),
			want: ActAttempt, path: toRetry, answer: Nack},
		{name: "documented failure retries", shape: ShapeUnsafe, op: op(pending, 1, OutcomeRetryable, &first),
			want: ActAttempt, path: toRetry, answer: Nack},
		{name: "documented failure at the limit exhausts", shape: ShapeUnsafe, op: op(pending, 3, OutcomeRetryable, &first),
			want: ActExhaust, path: toTerm, answer: Nack},
		{name: "exhausted under gateway dead-lettering is acked", shape: ShapeUnsafe, policy: DeadLetterGateway, op: op(pending, 3, OutcomeRetryable, &first),
			want: ActExhaust, path: toTerm, answer: Ack},
		{name: "lost response, idempotent inside window retries", shape: ShapeIdempotent, op: op(pending, 1, OutcomeUnknown, &first),
			want: ActAttempt, path: toRetry, answer: Nack},
		{name: "lost response, idempotent outside window is indeterminate", shape: ShapeIdempotent, op: op(pending, 1, OutcomeUnknown, &longAgo),
			want: ActMarkIndeterminate, path: toIndet, answer: Nack},
		{name: "lost response, idempotent at limit is indeterminate not terminal", shape: ShapeIdempotent, op: op(pending, 3, OutcomeUnknown, &first),
			want: ActMarkIndeterminate, path: toIndet, answer: Nack},
		{name: "owner died mid-attempt, unsafe is indeterminate", shape: ShapeUnsafe, op: op(pending, 1, "", &first),
			want: ActMarkIndeterminate, path: toIndet, answer: Nack},
		{name: "lost response, lookup asks first and writes nothing yet", shape: ShapeLookup, op: op(pending, 1, OutcomeUnknown, &first),
			want: ActLookupFirst, answer: Nack},
		{name: "lost response, unsafe is indeterminate", shape: ShapeUnsafe, op: op(pending, 1, OutcomeUnknown, &first),
			want: ActMarkIndeterminate, path: toIndet, answer: Nack},
		{name: "lost response, repeatable repeats", shape: ShapeRepeatable, op: op(pending, 1, OutcomeUnknown, &first),
			want: ActAttempt, path: toRetry, answer: Nack},
		{name: "lost response, repeatable at limit exhausts", shape: ShapeRepeatable, op: op(pending, 3, OutcomeUnknown, &first),
			want: ActExhaust, path: toTerm, answer: Nack},
		{name: "confirmed acks without effect, then records the ack", shape: ShapeUnsafe, op: op(StateEffectConfirmed, 1, OutcomeConfirmed, &first),
			want: ActAckExisting, answer: Ack, sent: []State{StateAckPending, StateAcknowledged}},
		{name: "ack pending acks without effect, then records the ack", shape: ShapeUnsafe, op: op(StateAckPending, 1, OutcomeConfirmed, &first),
			want: ActAckExisting, answer: Ack, sent: acked},
		{name: "acknowledged acks without effect", shape: ShapeUnsafe, op: op(StateAcknowledged, 1, OutcomeConfirmed, &first),
			want: ActAckExisting, answer: Ack},
		{name: "indeterminate holds", shape: ShapeIdempotent, op: op(StateEffectIndeterminate, 1, OutcomeUnknown, &first),
			want: ActHoldIndeterminate, answer: Nack},
		{name: "terminal holds, broker dead-letters", shape: ShapeRepeatable, op: op(StateTerminalFailure, 3, OutcomeRetryable, &first),
			want: ActHoldTerminal, answer: Nack},
		{name: "terminal holds, gateway dead-lettered", shape: ShapeRepeatable, op: gatewayTerminal,
			want: ActHoldTerminal, answer: Ack},
		{name: "confirmed attempt in an open state is never retried", shape: ShapeRepeatable, op: op(pending, 1, OutcomeConfirmed, &first),
			want: ActMarkIndeterminate, path: toIndet, answer: Nack},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) { r.check(t, Decide(r.evidence(now))) })
	}
	t.Run("an acknowledged redelivery is flagged", func(t *testing.T) {
		got := Decide(row{shape: ShapeUnsafe, op: op(StateAcknowledged, 1, OutcomeConfirmed, &first)}.evidence(now))
		if got.Anomaly != "redelivered_after_ack" {
			t.Fatalf("anomaly %q", got.Anomaly)
		}
	})
}

// TestAfterAttemptTable walks the rows for an attempt this delivery made;
// the operation is as its claim left it (pending_effect, attempt started).
func TestAfterAttemptTable(t *testing.T) {
	t.Parallel()
	started := func(count int) *Operation { return op(pending, count, "", &first) }
	cases := []struct {
		row
		res EffectResult
	}{
		{row{name: "confirmed commits the evidence and acks", shape: ShapeUnsafe, op: started(1),
			want: ActConfirm, path: []State{StateEffectConfirmed, StateAckPending}, answer: Ack, sent: acked},
			EffectResult{Outcome: OutcomeConfirmed, ResultID: "r-1"}},
		{row{name: "refused for good is terminal", shape: ShapeIdempotent, op: started(1),
			want: ActExhaust, path: []State{StateTerminalFailure}, answer: Nack},
			EffectResult{Outcome: OutcomeTerminal, Reason: "HTTP 422"}},
		{row{name: "refused for good, gateway dead-letters and acks", shape: ShapeIdempotent, policy: DeadLetterGateway, op: started(1),
			want: ActExhaust, path: []State{StateTerminalFailure}, answer: Ack},
			EffectResult{Outcome: OutcomeTerminal, Reason: "HTTP 422"}},
		{row{name: "documented failure leaves it open for a redelivery", shape: ShapeUnsafe, op: started(1),
			want: ActRetryLater, answer: Nack},
			EffectResult{Outcome: OutcomeRetryable, Reason: "HTTP 503"}},
		{row{name: "documented failure at the limit is terminal", shape: ShapeUnsafe, op: started(3),
			want: ActExhaust, path: []State{StateTerminalFailure}, answer: Nack},
			EffectResult{Outcome: OutcomeRetryable, Reason: "HTTP 503"}},
		{row{name: "lost response, idempotent inside the window waits for a redelivery", shape: ShapeIdempotent, op: started(1),
			want: ActRetryLater, answer: Nack},
			EffectResult{Outcome: OutcomeUnknown, Reason: "timeout"}},
		{row{name: "lost response, unsafe is indeterminate", shape: ShapeUnsafe, op: started(1),
			want: ActMarkIndeterminate, path: []State{StateEffectIndeterminate}, answer: Nack},
			EffectResult{Outcome: OutcomeUnknown, Reason: "timeout"}},
		{row{name: "lost response, lookup asks", shape: ShapeLookup, op: started(1),
			want: ActLookupFirst, answer: Nack},
			EffectResult{Outcome: OutcomeUnknown, Reason: "timeout"}},
		{row{name: "lost response, repeatable at the limit is terminal", shape: ShapeRepeatable, op: started(3),
			want: ActExhaust, path: []State{StateTerminalFailure}, answer: Nack},
			EffectResult{Outcome: OutcomeUnknown, Reason: "timeout"}},
	}
	for _, tc := range cases {
		tc.held = true
		t.Run(tc.name, func(t *testing.T) { tc.check(t, AfterAttempt(tc.evidence(now), tc.res)) })
	}
}

// TestAfterLookupTable walks the rows for a lookup: before any write (a
// redelivery after a lost response) and right after this delivery's attempt.
func TestAfterLookupTable(t *testing.T) {
	t.Parallel()
	lost := op(pending, 1, OutcomeUnknown, &first)
	found := LookupResult{Outcome: OutcomeConfirmed, ResultID: "r-9"}
	absent := LookupResult{Outcome: OutcomeAbsent}
	down := LookupResult{Outcome: OutcomeUnknown, Reason: "HTTP 503"}
	cases := []struct {
		row
		res LookupResult
	}{
		{row{name: "before: found is confirmed under a new reservation", shape: ShapeLookup, op: lost,
			want: ActConfirm, path: toAckPen, answer: Ack, sent: acked}, found},
		{row{name: "before: absent allows one new attempt", shape: ShapeLookup, op: lost,
			want: ActAttempt, path: toRetry, answer: Nack}, absent},
		{row{name: "before: lookup unavailable is indeterminate, never a blind retry", shape: ShapeLookup, op: lost,
			want: ActMarkIndeterminate, path: toIndet, answer: Nack}, down},
		{row{name: "after: found is confirmed", shape: ShapeLookup, op: lost, held: true,
			want: ActConfirm, path: []State{StateEffectConfirmed, StateAckPending}, answer: Ack, sent: acked}, found},
		{row{name: "after: absent waits for a redelivery", shape: ShapeLookup, op: lost, held: true,
			want: ActRetryLater, answer: Nack}, absent},
		{row{name: "after: lookup unavailable is indeterminate", shape: ShapeLookup, op: lost, held: true,
			want: ActMarkIndeterminate, path: []State{StateEffectIndeterminate}, answer: Nack}, down},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { tc.check(t, AfterLookup(tc.evidence(now), tc.res)) })
	}
}

func TestDedupeWindowLeavesRoomForTheCall(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	r := testRoute(ShapeIdempotent)
	// The window ends 3s from now but a call may take 5s: not covered.
	first := now.Add(-r.DedupeWindow + 3*time.Second)
	op := &Operation{State: StatePendingEffect, AttemptCount: 1, FirstAttemptAt: &first, LastAttempt: &Attempt{Outcome: OutcomeUnknown}}
	if got := Decide(Evidence{Route: r, Op: op, Now: now}); got.Action != ActMarkIndeterminate {
		t.Fatalf("Decide = %s, want %s", got.Action, ActMarkIndeterminate)
	}
}

// TestAfterResetTable walks the rows for a lease whose store had lost its
// counter: hold only while an open attempt's owner may still be at work.
func TestAfterResetTable(t *testing.T) {
	t.Parallel()
	route := testRoute(ShapeLookup)
	claimed := now.Add(-2 * time.Second)
	open := func(state State, outcome Outcome, at time.Time) *Operation {
		o := op(state, 1, outcome, &at)
		o.LeaseStart = &at
		return o
	}
	next := attempt(Evidence{Route: route, Op: op(pending, 1, OutcomeRetryable, &first)}, "retry")
	cases := []struct {
		name string
		op   *Operation
		hold bool
	}{
		{"open attempt, owner may be at work: hold", open(pending, "", claimed), true},
		{"open attempt, past the owner's bound: go on", open(pending, "", now.Add(-route.AckDeadline-time.Second)), false},
		{"attempt finished: its owner stopped", open(pending, OutcomeRetryable, claimed), false},
		{"settled work: nothing to protect", open(StateAckPending, OutcomeConfirmed, claimed), false},
		{"new operation: nobody before", nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := AfterReset(Evidence{Route: route, Op: tc.op, Now: now}, next)
			if (got.Action == ActHoldLease) != tc.hold {
				t.Fatalf("AfterReset = %s (%s)", got.Action, got.Reason)
			}
			if tc.hold && (got.Answer != Nack || !got.HoldUntil.Equal(OwnerBound(route, claimed)) || len(got.Path) != 0) {
				t.Fatalf("hold = %+v", got)
			}
			if !tc.hold && got.Action != next.Action {
				t.Fatalf("the plan was changed to %s", got.Action)
			}
		})
	}
}

func TestAnswerForSettledStates(t *testing.T) {
	t.Parallel()
	for _, s := range States {
		for _, p := range []DeadLetterPolicy{DeadLetterGateway, DeadLetterBroker} {
			want := Nack
			switch {
			case s.Confirmed():
				want = Ack
			case (s == StateTerminalFailure || s == StateConflicting) && p == DeadLetterGateway:
				want = Ack
			}
			if got := AnswerFor(s, p); got != want {
				t.Errorf("AnswerFor(%s, %s) = %s, want %s", s, p, got, want)
			}
		}
	}
}

func TestTransitionTable(t *testing.T) {
	t.Parallel()
	for _, from := range []State{StateConflicting, StateAcknowledged} {
		for _, to := range States {
			if CanTransition(from, to) {
				t.Errorf("%s is final but allows -> %s", from, to)
			}
		}
	}
	// Terminal and indeterminate work leaves only by an operator or a
	// reconciling lookup (recovery.go), never back to reserved: no delivery
	// may take it up as if nothing had happened.
	for from, want := range map[State][]State{
		StateTerminalFailure:     {StatePendingEffect, StateEffectConfirmed},
		StateEffectIndeterminate: {StatePendingEffect, StateEffectConfirmed, StateTerminalFailure},
	} {
		for _, to := range States {
			if CanTransition(from, to) != slices.Contains(want, to) {
				t.Errorf("%s -> %s: allowed %v, want %v", from, to, CanTransition(from, to), slices.Contains(want, to))
			}
		}
	}
	// No way back from confirmed evidence to an open state.
	for _, from := range []State{StateEffectConfirmed, StateAckPending, StateAcknowledged} {
		for _, to := range []State{StateReserved, StatePendingEffect, StateEffectIndeterminate, StateTerminalFailure} {
			if CanTransition(from, to) {
				t.Errorf("%s -> %s would unconfirm evidence", from, to)
			}
		}
	}
	if !CanTransition(StatePendingEffect, StateReserved) {
		t.Error("retry path pending_effect -> reserved missing")
	}
	for _, tr := range Transitions() {
		if !tr.From.Valid() || !tr.To.Valid() {
			t.Errorf("transition %v names an unknown state", tr)
		}
	}
	if _, err := Path(StatePendingEffect, StateAcknowledged); err == nil {
		t.Error("Path allowed pending_effect -> acknowledged")
	}
	p, err := Path("", StateReceived, StateReserved, StatePendingEffect)
	if err != nil || len(p) != 3 || p[2].To != StatePendingEffect {
		t.Fatalf("Path for a new operation = %v, %v", p, err)
	}
}

func TestIdentify(t *testing.T) {
	t.Parallel()
	r := testRoute(ShapeIdempotent)
	m := &Message{MessageID: "m1", Data: []byte(`{"order":{"id":"o-9","total":3}}`), Attributes: map[string]string{"a": "1"}}
	id1, err := Identify(r, m)
	if err != nil {
		t.Fatal(err)
	}
	if id1.Key != "m1" || !strings.HasPrefix(id1.OperationID, "op_") || !strings.HasPrefix(id1.IdempotencyKey, "ik_") {
		t.Fatalf("identity = %+v", id1)
	}
	other := *m
	other.Data = []byte(`{"order":{"id":"o-9","total":4}}`)
	id2, _ := Identify(r, &other)
	if id2.OperationID != id1.OperationID || id2.Fingerprint == id1.Fingerprint || id2.IdempotencyKey == id1.IdempotencyKey {
		t.Fatal("same key, different data: same operation id, different fingerprint and idempotency key expected")
	}

	// JSON pointer keys and fingerprints ignore formatting and key order.
	r.Key = KeySource{Kind: KeyJSONPointer, Name: "/order/id"}
	r.Fingerprint = FingerprintSpec{Version: 2, Pointers: []string{"/order"}}
	a, err := Identify(r, m)
	if err != nil {
		t.Fatal(err)
	}
	reordered := *m
	reordered.Data = []byte(`{ "order": { "total": 3, "id": "o-9" } }`)
	b, _ := Identify(r, &reordered)
	if a.Key != "o-9" || a.Fingerprint != b.Fingerprint {
		t.Fatalf("pointer identity not canonical: %+v vs %+v", a, b)
	}
	// The fingerprint version is part of the hash.
	r.Fingerprint.Version = 3
	c, _ := Identify(r, m)
	if c.Fingerprint == a.Fingerprint {
		t.Fatal("changing the fingerprint version did not change the fingerprint")
	}

	for name, msg := range map[string]*Message{
		"missing pointer": {MessageID: "m", Data: []byte(`{"x":1}`)},
		"not json":        {MessageID: "m", Data: []byte(`nope`)},
	} {
		if _, err := Identify(r, msg); err == nil {
			t.Errorf("%s: Identify accepted a message without a usable key", name)
		}
	}
	r.Key = KeySource{Kind: KeyAttribute, Name: "order"}
	if _, err := Identify(r, m); err == nil {
		t.Error("missing attribute key accepted")
	}
}

func TestStatementNeverClaimsMoreThanTheRecord(t *testing.T) {
	t.Parallel()
	now := time.Now()
	confirmed := Statement(&Operation{ID: "op_x", State: StateAckPending, ResultID: "r-1", EvidenceAt: &now})
	if !strings.Contains(confirmed, `"r-1"`) || !strings.Contains(confirmed, "not been confirmed as sent") {
		t.Fatalf("ack_pending statement: %s", confirmed)
	}
	ind := Statement(&Operation{ID: "op_x", State: StateEffectIndeterminate, Reason: "timeout"})
	if !strings.Contains(ind, "may or may not") || strings.Contains(ind, "result") && strings.Contains(ind, "committed") {
		t.Fatalf("indeterminate statement: %s", ind)
	}
	conf := Statement(&Operation{ID: "cf_x", State: StateConflicting, ConflictOf: "op_x"})
	if !strings.Contains(conf, "never executed") {
		t.Fatalf("conflict statement: %s", conf)
	}
	// A handoff says what its ack promised: the outbox entry, not the effect.
	pending := Statement(&Operation{ID: "op_h", State: StatePendingEffect, HandedOffAt: &now, AttemptCount: 1})
	if !strings.Contains(pending, "handed off at") || !strings.Contains(pending, "Effect evidence pending") || strings.Contains(pending, "result") {
		t.Fatalf("handed-off statement: %s", pending)
	}
	relayed := Statement(&Operation{ID: "op_h", State: StateAcknowledged, HandedOffAt: &now, ResultID: "r-9", EvidenceAt: &now, AckedAt: &now})
	if !strings.Contains(relayed, `"r-9"`) || !strings.Contains(relayed, "acknowledged when the operation was handed off") {
		t.Fatalf("relayed statement: %s", relayed)
	}
	local := Statement(&Operation{ID: "op_l", State: StateAckPending, Shape: ShapeLocal, ResultID: "42", EvidenceAt: &now, AttemptCount: 1})
	if !strings.Contains(local, "same transaction as this record") || strings.Contains(local, "downstream") {
		t.Fatalf("local statement: %s", local)
	}
}

func TestScopeKeyIsUnambiguous(t *testing.T) {
	t.Parallel()
	a := testRoute(ShapeIdempotent)
	a.Key = KeySource{Kind: KeyAttribute, Name: "a"}
	b := testRoute(ShapeIdempotent)
	b.Key = KeySource{Kind: KeyAttribute, Name: "a/b"}
	ia, err := Identify(a, &Message{Attributes: map[string]string{"a": "b/c"}})
	if err != nil {
		t.Fatal(err)
	}
	ib, err := Identify(b, &Message{Attributes: map[string]string{"a/b": "c"}})
	if err != nil {
		t.Fatal(err)
	}
	if ia.ScopeKey == ib.ScopeKey || ia.OperationID == ib.OperationID {
		t.Fatalf("different key sources collide: %q", ia.ScopeKey)
	}
}

func TestRouteJSONUsesDurationStrings(t *testing.T) {
	t.Parallel()
	r := testRoute(ShapeIdempotent)
	r.Renewal = Renewal{Interval: 3 * time.Second, MaxExtension: 10 * time.Second}
	r.Handoff = &HandoffSpec{RetryMin: time.Second, RetryMax: 5 * time.Minute}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"ack_deadline":"10s"`, `"dedupe_window":"1h0m0s"`, `"timeout":"5s"`, `"interval":"3s"`, `"retention":"192h0m0s"`, `"name":"orders"`,
		`"retry_min":"1s"`, `"retry_max":"5m0s"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("route JSON lacks %s: %s", want, b)
		}
	}
	var back Route
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.AckDeadline != r.AckDeadline || back.Effect.Timeout != r.Effect.Timeout || back.Renewal != r.Renewal || back.Name != r.Name || back.DedupeWindow != r.DedupeWindow ||
		back.Handoff == nil || *back.Handoff != *r.Handoff {
		t.Fatalf("round trip changed the route: %+v", back)
	}
}

func TestSNSIdentityIsTopicAndMessageID(t *testing.T) {
	t.Parallel()
	r := testRoute(ShapeIdempotent)
	r.Broker = BrokerSNS
	a, err := Identify(r, &Message{Broker: BrokerSNS, Source: "arn:aws:sns:eu-west-1:1:a", MessageID: "m", Data: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Identify(r, &Message{Broker: BrokerSNS, Source: "arn:aws:sns:eu-west-1:1:b", MessageID: "m", Data: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if a.OperationID == b.OperationID || a.Key != "arn:aws:sns:eu-west-1:1:a/m" {
		t.Fatalf("same message id on two topics: %+v / %+v", a, b)
	}
	if _, err := Identify(r, &Message{Broker: BrokerSNS, MessageID: "m", Data: []byte("x")}); err == nil {
		t.Fatal("an SNS message without a topic got an identity")
	}
}

// LeaseRecorded holds a delivery off an operation whose open attempt's
// owner still holds the lease the ledger records for it; anything else
// passes the plan through.
func TestLeaseRecorded(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	r := &Route{Shape: ShapeIdempotent, AckDeadline: 10 * time.Second}
	p := plan(ActAttempt, Nack, "retry")
	until := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
	open := &Attempt{N: 1, Kind: AttemptEffect}
	done := &Attempt{N: 1, Kind: AttemptEffect, Outcome: OutcomeRetryable}
	cases := []struct {
		name string
		op   *Operation
		held bool
	}{
		{"open attempt, lease running", &Operation{State: StatePendingEffect, Fence: 1, LeaseDeadline: until(time.Second), LastAttempt: open}, true},
		{"open attempt, reserved", &Operation{State: StateReserved, Fence: 1, LeaseDeadline: until(time.Second), LastAttempt: open}, true},
		{"open attempt, lease run out", &Operation{State: StatePendingEffect, Fence: 1, LeaseDeadline: until(0), LastAttempt: open}, false},
		{"finished attempt, lease running", &Operation{State: StatePendingEffect, Fence: 1, LeaseDeadline: until(time.Second), LastAttempt: done}, false},
		{"no attempt", &Operation{State: StatePendingEffect, Fence: 1, LeaseDeadline: until(time.Second)}, false},
		{"no lease recorded", &Operation{State: StatePendingEffect, Fence: 1, LastAttempt: open}, false},
		{"settled", &Operation{State: StateEffectIndeterminate, Fence: 1, LeaseDeadline: until(time.Second), LastAttempt: open}, false},
		{"new", nil, false},
	}
	for _, c := range cases {
		got := LeaseRecorded(Evidence{Route: r, Op: c.op, Now: now}, p)
		if held := got.Action == ActHoldLease; held != c.held || (held && got.Answer != Nack) || (!held && got.Action != p.Action) {
			t.Errorf("%s: %+v, held %v", c.name, got, c.held)
		}
	}
}

// A redelivery of acknowledged work is answered the same whether the
// ledger's claim records it (RedeliveredAfterAck) or the table decides.
func TestRedeliveredAfterAckIsTheTablesRow(t *testing.T) {
	t.Parallel()
	r := &Route{Shape: ShapeIdempotent}
	got := Decide(Evidence{Route: r, Op: &Operation{State: StateAcknowledged, Fingerprint: "f"}, Fingerprint: "f", Now: time.Now()})
	if want := RedeliveredAfterAck(); got.Action != want.Action || got.Answer != want.Answer || got.Reason != want.Reason ||
		got.Anomaly != want.Anomaly || len(got.AfterSent) != 0 || want.Answer != Ack {
		t.Fatalf("Decide %+v, RedeliveredAfterAck %+v", got, want)
	}
}
