package gate

import (
	"encoding/json"
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

func TestDecideTable(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	first := now.Add(-10 * time.Minute)
	longAgo := now.Add(-2 * time.Hour)
	pending := func(count int, outcome Outcome, firstAt *time.Time) *Operation {
		return &Operation{State: StatePendingEffect, AttemptCount: count, FirstAttemptAt: firstAt,
			LastAttempt: &Attempt{N: count, Outcome: outcome, Reason: "HTTP 503"}}
	}
	cases := []struct {
		name  string
		shape Shape
		op    *Operation
		pub   time.Time
		want  Action
	}{
		{"new operation is attempted", ShapeUnsafe, nil, now.Add(-time.Minute), ActAttempt},
		{"new operation older than retention is a gap", ShapeIdempotent, nil, now.Add(-9 * 24 * time.Hour), ActRetentionGap},
		{"intent without attempt resumes", ShapeUnsafe, &Operation{State: StatePendingEffect}, time.Time{}, ActAttempt},
		{"documented failure retries", ShapeUnsafe, pending(1, OutcomeRetryable, &first), time.Time{}, ActAttempt},
		{"documented failure at the limit exhausts", ShapeUnsafe, pending(3, OutcomeRetryable, &first), time.Time{}, ActExhaust},
		{"lost response, idempotent inside window retries", ShapeIdempotent, pending(1, OutcomeUnknown, &first), time.Time{}, ActAttempt},
		{"lost response, idempotent outside window is indeterminate", ShapeIdempotent, pending(1, OutcomeUnknown, &longAgo), time.Time{}, ActMarkIndeterminate},
		{"lost response, idempotent at limit is indeterminate not terminal", ShapeIdempotent, pending(3, OutcomeUnknown, &first), time.Time{}, ActMarkIndeterminate},
		{"owner died mid-attempt, unsafe is indeterminate", ShapeUnsafe, pending(1, "", &first), time.Time{}, ActMarkIndeterminate},
		{"lost response, lookup asks first", ShapeLookup, pending(1, OutcomeUnknown, &first), time.Time{}, ActLookupFirst},
		{"lost response, unsafe is indeterminate", ShapeUnsafe, pending(1, OutcomeUnknown, &first), time.Time{}, ActMarkIndeterminate},
		{"lost response, repeatable repeats", ShapeRepeatable, pending(1, OutcomeUnknown, &first), time.Time{}, ActAttempt},
		{"lost response, repeatable at limit exhausts", ShapeRepeatable, pending(3, OutcomeUnknown, &first), time.Time{}, ActExhaust},
		{"confirmed acks without effect", ShapeUnsafe, &Operation{State: StateEffectConfirmed}, time.Time{}, ActAckExisting},
		{"ack pending acks without effect", ShapeUnsafe, &Operation{State: StateAckPending}, time.Time{}, ActAckExisting},
		{"acknowledged acks without effect", ShapeUnsafe, &Operation{State: StateAcknowledged}, time.Time{}, ActAckExisting},
		{"indeterminate holds", ShapeIdempotent, &Operation{State: StateEffectIndeterminate}, time.Time{}, ActHoldIndeterminate},
		{"terminal holds", ShapeRepeatable, &Operation{State: StateTerminalFailure, Reason: "x"}, time.Time{}, ActHoldTerminal},
		{"confirmed attempt in an open state is never retried", ShapeRepeatable, pending(1, OutcomeConfirmed, &first), time.Time{}, ActMarkIndeterminate},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(Evidence{Route: testRoute(tc.shape), Op: tc.op, PublishTime: tc.pub, Now: now})
			if got.Action != tc.want {
				t.Fatalf("Decide = %s (%s), want %s", got.Action, got.Reason, tc.want)
			}
			if got.Reason == "" {
				t.Fatalf("plan %s has no reason", got.Action)
			}
		})
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

func TestTerminalDecisionFollowsPolicy(t *testing.T) {
	t.Parallel()
	if Terminal(DeadLetterGateway) != Ack || Terminal(DeadLetterBroker) != Nack {
		t.Fatal("gateway dead-lettering must ack; broker dead-lettering must nack")
	}
}

func TestTransitionTable(t *testing.T) {
	t.Parallel()
	for _, from := range []State{StateConflicting, StateAcknowledged, StateTerminalFailure} {
		for _, to := range States {
			if CanTransition(from, to) {
				t.Errorf("%s is final but allows -> %s", from, to)
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
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"ack_deadline":"10s"`, `"dedupe_window":"1h0m0s"`, `"timeout":"5s"`, `"interval":"3s"`, `"retention":"192h0m0s"`, `"name":"orders"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("route JSON lacks %s: %s", want, b)
		}
	}
	var back Route
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.AckDeadline != r.AckDeadline || back.Effect.Timeout != r.Effect.Timeout || back.Renewal != r.Renewal || back.Name != r.Name || back.DedupeWindow != r.DedupeWindow {
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
