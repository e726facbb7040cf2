package gate

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func resolution(k ResolutionKind) Resolution {
	r := Resolution{Kind: k, Reason: "checked with the provider", Actor: "alice"}
	if k == ResolveHappened {
		r.ResultID = "res-42"
	}
	return r
}

// TestDecideResolutionTable walks every (state, kind) pair: each allowed pair
// has its one path, and every other pair is refused with nothing planned.
func TestDecideResolutionTable(t *testing.T) {
	t.Parallel()
	type want struct {
		action Action
		path   []State
		grant  bool
	}
	confirmed := want{ActConfirm, []State{StateEffectConfirmed}, false}
	reopen := want{ActGrant, []State{StatePendingEffect}, true}
	allowed := map[State]map[ResolutionKind]want{
		StateEffectIndeterminate: {
			ResolveHappened:    confirmed,
			ResolveNotHappened: reopen,
			ResolveAbandon:     {ActExhaust, []State{StateTerminalFailure}, false},
		},
		StateTerminalFailure: {
			ResolveHappened: confirmed,
			ResolveReplay:   reopen,
		},
	}
	for _, s := range States {
		for _, k := range []ResolutionKind{ResolveHappened, ResolveNotHappened, ResolveAbandon, ResolveReplay} {
			o := op(s, 1, OutcomeUnknown, &first)
			if s == StateConflicting {
				o.ConflictOf = "op_0"
			}
			p, err := DecideResolution(o, resolution(k))
			w, ok := allowed[s][k]
			if !ok {
				if !errors.Is(err, ErrRefused) || p.Action != "" || len(p.Path) != 0 {
					t.Errorf("%s on %s: plan %s %v, err %v; want refused", k, s, p.Action, p.Path, err)
				}
				continue
			}
			if err != nil || p.Action != w.action || !slices.Equal(p.Path, w.path) || p.Grant != w.grant {
				t.Errorf("%s on %s: plan %s %v grant %v, err %v; want %s %v grant %v", k, s, p.Action, p.Path, p.Grant, err, w.action, w.path, w.grant)
				continue
			}
			if _, err := Path(s, p.Path...); err != nil {
				t.Errorf("%s on %s: the ledger would refuse %v: %v", k, s, p.Path, err)
			}
			if !strings.Contains(p.Reason, "alice") || !strings.Contains(p.Reason, "checked with the provider") {
				t.Errorf("%s on %s: reason %q does not say who and why", k, s, p.Reason)
			}
		}
	}
	t.Run("happened carries the evidence and acks on the next delivery", func(t *testing.T) {
		p, _ := DecideResolution(op(StateEffectIndeterminate, 1, OutcomeUnknown, &first), resolution(ResolveHappened))
		if p.ResultID != "res-42" || p.Answer != Ack || !slices.Equal(p.AfterSent, []State{StateAckPending, StateAcknowledged}) {
			t.Fatalf("plan %+v", p)
		}
	})
	t.Run("abandon dead-letters under gateway policy only", func(t *testing.T) {
		for _, pol := range []DeadLetterPolicy{DeadLetterGateway, DeadLetterBroker} {
			o := op(StateEffectIndeterminate, 1, OutcomeUnknown, &first)
			o.DeadLetterPolicy = pol
			p, _ := DecideResolution(o, resolution(ResolveAbandon))
			if p.DeadLetter != (pol == DeadLetterGateway) || p.Answer != AnswerFor(StateTerminalFailure, pol) {
				t.Fatalf("%s: dead letter %v, answer %s", pol, p.DeadLetter, p.Answer)
			}
		}
	})
}

func TestResolutionCheck(t *testing.T) {
	t.Parallel()
	ok := []Resolution{resolution(ResolveHappened), resolution(ResolveNotHappened), resolution(ResolveAbandon), resolution(ResolveReplay)}
	for _, r := range ok {
		if err := r.Check(); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
	bad := map[string]func(r *Resolution){
		"unknown kind":              func(r *Resolution) { r.Kind = "undo" },
		"no reason":                 func(r *Resolution) { r.Reason = "  " },
		"no actor":                  func(r *Resolution) { r.Actor = "" },
		"happened without evidence": func(r *Resolution) { r.Kind, r.ResultID = ResolveHappened, "" },
		"evidence on a replay":      func(r *Resolution) { r.Kind, r.ResultID = ResolveReplay, "res-1" },
		"NUL in the reason":         func(r *Resolution) { r.Reason = "a\x00b" },
		"invalid UTF-8 actor":       func(r *Resolution) { r.Actor = "\xff" },
		"a reason too long":         func(r *Resolution) { r.Reason = strings.Repeat("x", MaxReason+1) },
		"an actor too long":         func(r *Resolution) { r.Actor = strings.Repeat("x", MaxActor+1) },
	}
	for name, f := range bad {
		r := resolution(ResolveNotHappened)
		f(&r)
		if err := r.Check(); !errors.Is(err, ErrInvalidResolution) {
			t.Errorf("%s: %v, want ErrInvalidResolution", name, err)
		}
	}
}

// TestGrantRow: a granted attempt is made whatever the shape's rules for a
// lost response say, exactly once.
func TestGrantRow(t *testing.T) {
	t.Parallel()
	for _, shape := range []Shape{ShapeUnsafe, ShapeIdempotent, ShapeLookup, ShapeRepeatable} {
		o := op(StatePendingEffect, 3, OutcomeUnknown, &longAgo)
		o.Grant = 4
		row{shape: shape, op: o, want: ActAttempt, path: toRetry, answer: Nack}.check(t, Decide(row{shape: shape, op: o}.evidence(now)))
		// Once the granted attempt was made, the shape decides again.
		used := op(StatePendingEffect, 4, OutcomeUnknown, &longAgo)
		used.Grant = 4
		if p := Decide(row{shape: shape, op: used}.evidence(now)); p.Action == ActAttempt {
			t.Errorf("%s: the grant was used and the table still attempts: %s", shape, p.Reason)
		}
	}
}

func TestAfterCheckTable(t *testing.T) {
	t.Parallel()
	ev := Evidence{Route: testRoute(ShapeLookup), Op: op(StateEffectIndeterminate, 1, OutcomeUnknown, &first), Held: true, Now: now}
	cases := []struct {
		res    LookupResult
		action Action
		path   []State
	}{
		{LookupResult{Outcome: OutcomeConfirmed, ResultID: "res-1"}, ActConfirm, []State{StateEffectConfirmed}},
		{LookupResult{Outcome: OutcomeAbsent}, ActGrant, []State{StatePendingEffect}},
		{LookupResult{Outcome: OutcomeUnknown, Reason: "503"}, ActCheckLater, nil},
	}
	for _, c := range cases {
		p := AfterCheck(ev, c.res)
		if p.Action != c.action || !slices.Equal(p.Path, c.path) || p.Reason == "" {
			t.Errorf("%s: plan %s %v (%s)", c.res.Outcome, p.Action, p.Path, p.Reason)
		}
		if _, err := Path(StateEffectIndeterminate, p.Path...); err != nil {
			t.Errorf("%s: %v", c.res.Outcome, err)
		}
	}
	if p := AfterCheck(ev, LookupResult{Outcome: OutcomeConfirmed, ResultID: "res-1"}); p.ResultID != "res-1" {
		t.Errorf("found without its result id: %+v", p)
	}
}

func TestReconcilable(t *testing.T) {
	t.Parallel()
	lookup := testRoute(ShapeLookup)
	lookup.Effect.LookupURL = "http://provider/effects/{key}"
	indet := func(shape Shape) *Operation {
		o := op(StateEffectIndeterminate, 1, OutcomeUnknown, &first)
		o.Shape = shape
		return o
	}
	if why := Reconcilable(lookup, indet(ShapeLookup)); why != "" {
		t.Fatalf("a lookup route's indeterminate operation: %s", why)
	}
	handoff := testRoute(ShapeHandoff)
	handoff.Effect.LookupURL = lookup.Effect.LookupURL
	if why := Reconcilable(handoff, indet(ShapeHandoff)); why != "" {
		t.Fatalf("a handoff route's parked operation, with a lookup: %s", why)
	}
	blind := testRoute(ShapeHandoff)
	if Reconcilable(blind, indet(ShapeHandoff)) == "" {
		t.Fatal("a handoff route without a lookup may be reconciled")
	}
	unsafe := testRoute(ShapeUnsafe)
	noURL := testRoute(ShapeLookup)
	pending := indet(ShapeLookup)
	pending.State = StatePendingEffect
	for name, c := range map[string]struct {
		r *Route
		o *Operation
	}{
		"unsafe route":                      {unsafe, indet(ShapeUnsafe)},
		"recorded unsafe, route now lookup": {lookup, indet(ShapeUnsafe)},
		"no lookup url":                     {noURL, indet(ShapeLookup)},
		"not indeterminate":                 {lookup, pending},
		"route gone":                        {nil, indet(ShapeLookup)},
	} {
		if Reconcilable(c.r, c.o) == "" {
			t.Errorf("%s: the reconciler may touch it", name)
		}
	}
}

func TestNextCheckBacksOffToItsLimit(t *testing.T) {
	t.Parallel()
	r := testRoute(ShapeLookup)
	r.Reconcile = ReconcilePolicy{Interval: 30 * time.Second, MaxInterval: 5 * time.Minute}
	var got []time.Duration
	for checks := 1; checks <= 6; checks++ {
		got = append(got, NextCheck(r, checks, now).Sub(now))
	}
	want := []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute}
	if !slices.Equal(got, want) {
		t.Fatalf("waits %v, want %v", got, want)
	}
}

// TestCommitShapeRows: the rows of the two shapes whose evidence is a commit.
func TestCommitShapeRows(t *testing.T) {
	t.Parallel()
	handed := func(state State, count int, outcome Outcome) *Operation {
		o := op(state, count, outcome, &first)
		at := first
		o.HandedOffAt = &at
		return o
	}
	rows := []row{
		{name: "handoff: new is handed off and acked", shape: ShapeHandoff, pub: now.Add(-time.Minute),
			want: ActHandOff, path: []State{StateReceived, StateReserved, pending}, answer: Ack},
		{name: "handoff: redelivered while the relay works acks", shape: ShapeHandoff, op: handed(pending, 1, OutcomeRetryable),
			want: ActAckExisting, answer: Ack},
		{name: "handoff: redelivered while parked acks", shape: ShapeHandoff, op: handed(StateEffectIndeterminate, 1, OutcomeUnknown),
			want: ActAckExisting, answer: Ack},
		{name: "handoff: intent without its entry is handed off", shape: ShapeHandoff, op: op(pending, 0, "", nil),
			want: ActHandOff, path: toRetry, answer: Ack},
		{name: "handoff: confirmed acks and records the ack", shape: ShapeHandoff, op: handed(StateEffectConfirmed, 1, OutcomeConfirmed),
			want: ActAckExisting, answer: Ack, sent: []State{StateAckPending, StateAcknowledged}},
		{name: "local: new runs the statement in the ledger's transaction", shape: ShapeLocal, pub: now.Add(-time.Minute),
			want: ActApplyLocal, path: []State{StateReceived, StateReserved, pending}, answer: Nack},
		{name: "local: a failed statement is run again", shape: ShapeLocal, op: op(pending, 1, OutcomeRetryable, &first),
			want: ActApplyLocal, path: toRetry, answer: Nack},
		{name: "local: an unfinished attempt applied nothing", shape: ShapeLocal, op: op(pending, 1, "", &first),
			want: ActApplyLocal, path: toRetry, answer: Nack},
		{name: "local: at the limit it ends", shape: ShapeLocal, op: op(pending, 3, OutcomeRetryable, &first),
			want: ActExhaust, path: toTerm, answer: Nack},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) { r.check(t, Decide(r.evidence(now))) })
	}
	t.Run("the relay decides by its downstream's shape", func(t *testing.T) {
		r := testRoute(ShapeHandoff)
		for _, c := range []struct {
			lookup string
			dedupe time.Duration
			want   Shape
		}{{"http://p/{key}", 0, ShapeLookup}, {"", time.Hour, ShapeIdempotent}, {"", 0, ShapeUnsafe}} {
			r.Effect.LookupURL, r.DedupeWindow = c.lookup, c.dedupe
			if rr := RelayRoute(r); rr.Shape != c.want || rr.AckDeadline <= r.Effect.Timeout {
				t.Errorf("lookup %q dedupe %s: relay shape %s, deadline %s", c.lookup, c.dedupe, rr.Shape, rr.AckDeadline)
			}
		}
	})
}

// TestDecideCancel: an outbox entry is cancelled only while its operation
// is open, handed off, and no attempt of it is in doubt; the operation then
// ends terminally with a dead letter, never as done.
func TestDecideCancel(t *testing.T) {
	t.Parallel()
	handed := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, s := range States {
		for _, c := range []struct {
			name    string
			attempt Outcome
			count   int
			handoff bool
			ok      bool
		}{
			{"no attempt yet", "", 0, true, true},
			{"a documented failure", OutcomeRetryable, 1, true, true},
			{"an attempt with no result", "", 1, true, false},
			{"an unknown outcome", OutcomeUnknown, 1, true, false},
			{"never handed off", "", 0, false, false},
		} {
			o := op(s, c.count, c.attempt, &first)
			if c.handoff {
				o.HandedOffAt = &handed
			}
			if s == StateConflicting {
				o.ConflictOf = "op_0"
			}
			p, err := DecideResolution(o, resolution(ResolveCancel))
			open := s == StateReceived || s == StateReserved || s == StatePendingEffect
			if !c.ok || !open {
				if !errors.Is(err, ErrRefused) || p.Action != "" {
					t.Errorf("cancel on %s, %s: plan %s, err %v; want refused", s, c.name, p.Action, err)
				}
				continue
			}
			if err != nil || p.Action != ActExhaust || !slices.Equal(p.Path, []State{StateTerminalFailure}) || !p.DeadLetter || p.Grant {
				t.Errorf("cancel on %s, %s: plan %+v, err %v", s, c.name, p, err)
				continue
			}
			if _, err := Path(s, p.Path...); err != nil {
				t.Errorf("cancel on %s: the ledger would refuse %v: %v", s, p.Path, err)
			}
		}
	}
	if _, err := DecideResolution(op(StatePendingEffect, 0, "", nil), resolution(OutboxRetryNow)); !errors.Is(err, ErrInvalidResolution) {
		t.Errorf("retry_now through Resolve: %v", err)
	}
}
