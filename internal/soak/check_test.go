package soak

import (
	"maps"
	"strings"
	"testing"
)

// healthy is a run in which every invariant holds: an acked idempotent
// effect, an unsafe one left indeterminate, a lookup effect acked with a
// changed payload under its key dead-lettered as a conflict, a poisoned
// message dead-lettered, and one still pending; a handoff the relay
// confirmed, one it parked and one it dead-lettered; a local payload with its
// row, and one whose statement the table refused, dead-lettered. In the
// lanes: the lookup effect was found by the reconciler, the unacked
// confirmed one resolved happened by the operator, the poisoned one
// replayed and terminal again, and a handoff's lost answer found by its
// lookup.
func healthy() Inputs {
	in := Inputs{
		Intents: []Intent{
			{Route: "idem", MessageID: "m1", TraceID: "t1", BodySHA256: "s1", Acked: true},
			{Route: "unsafe", MessageID: "m2", TraceID: "t2", BodySHA256: "s2", DeadLettered: true},
			{Route: "lookup", MessageID: "m3", TraceID: "t3", BodySHA256: "s3", Acked: true},
			{Route: "lookup", MessageID: "m3", Variant: 1, TraceID: "t4", BodySHA256: "s4", Acked: true},
			{Route: "idem", MessageID: "m5", TraceID: "t5", BodySHA256: "s5", Acked: true},
			{Route: "unsafe", MessageID: "m6", TraceID: "t6", BodySHA256: "s6"},
			{Route: "idem", MessageID: "m7", TraceID: "t7", BodySHA256: "s7", DeadLettered: true},
			{Route: "hand", MessageID: "h1", TraceID: "th1", BodySHA256: "sh1", Acked: true},
			{Route: "hand", MessageID: "h2", TraceID: "th2", BodySHA256: "sh2", Acked: true},
			{Route: "hand", MessageID: "h3", TraceID: "th3", BodySHA256: "sh3", Acked: true},
			{Route: "loc", MessageID: "l1", TraceID: "tl1", BodySHA256: "sl1", Acked: true},
			{Route: "loc", MessageID: "l2", TraceID: "tl2", BodySHA256: "sl2", Acked: true},
		},
		Effects: []Effect{
			{Route: "idem", Key: "ik1", ResultID: "r1", BodySHA256: "s1"},
			{Route: "unsafe", Key: "ik2", ResultID: "r2", BodySHA256: "s2"},
			{Route: "lookup", Key: "ik3", ResultID: "r3", BodySHA256: "s3"},
			{Route: "idem", Key: "ik7", ResultID: "r7", BodySHA256: "s7"},
			{Route: "hand", Key: "ikh1", ResultID: "rh1", BodySHA256: "sh1"},
			// Applied, its answer lost, and the lookup unavailable: parked.
			{Route: "hand", Key: "ikh2", ResultID: "rh2", BodySHA256: "sh2"},
		},
		LocalRows: []LocalRow{{Route: "loc", ID: "1", Key: "ikl1", OperationID: "ol1", BodySHA256: "sl1"}},
		Shapes:    map[string]string{"hand": shapeHandoff, "loc": shapeLocal},
		Ops: map[string]LedgerOp{
			"op1": {ID: "op1", Route: "idem", IdempotencyKey: "ik1", State: "acknowledged", ResultID: "r1", Attempts: 2, Reason: "confirmed"},
			"op2": {ID: "op2", Route: "unsafe", IdempotencyKey: "ik2", State: "effect_indeterminate", Attempts: 1, Reason: "response lost"},
			"op3": {ID: "op3", Route: "lookup", IdempotencyKey: "ik3", State: "ack_pending", ResultID: "r3", Attempts: 1},
			"cf3": {ID: "cf3", Route: "lookup", State: "conflicting", ConflictOf: "op3", Reason: "key reused", DeadLetter: "key reused"},
			"op5": {ID: "op5", Route: "idem", IdempotencyKey: "ik5", State: "terminal_failure", Attempts: 1, Reason: "422", DeadLetter: "422"},
			"op6": {ID: "op6", Route: "unsafe", IdempotencyKey: "ik6", State: "pending_effect"},
			// Confirmed, but the broker gave up before it heard the ack.
			"op7": {ID: "op7", Route: "idem", IdempotencyKey: "ik7", State: "effect_confirmed", ResultID: "r7", Attempts: 1},
			"oh1": {ID: "oh1", Route: "hand", IdempotencyKey: "ikh1", State: "acknowledged", ResultID: "rh1", Attempts: 1,
				HandedOff: true, Outbox: true, OutboxDelivered: true},
			"oh2": {ID: "oh2", Route: "hand", IdempotencyKey: "ikh2", State: "effect_indeterminate", Attempts: 1,
				Reason: "lookup unavailable", HandedOff: true, Outbox: true},
			"oh3": {ID: "oh3", Route: "hand", IdempotencyKey: "ikh3", State: "terminal_failure", Attempts: 4,
				Reason: "attempts exhausted", DeadLetter: "attempts exhausted", HandedOff: true, Outbox: true},
			"ol1": {ID: "ol1", Route: "loc", IdempotencyKey: "ikl1", State: "acknowledged", ResultID: "1", Attempts: 1},
			"ol2": {ID: "ol2", Route: "loc", IdempotencyKey: "ikl2", State: "terminal_failure", Attempts: 1,
				Reason: "SQLSTATE 23514", DeadLetter: "SQLSTATE 23514"},
		},
		TraceOps: map[string][]string{
			"t1": {"op1", "op1"}, "t2": {"op2"}, "t3": {"op3"}, "t4": {"cf3"}, "t5": {"op5"}, "t6": {"op6"}, "t7": {"op7"},
			"th1": {"oh1"}, "th2": {"oh2"}, "th3": {"oh3"}, "tl1": {"ol1"}, "tl2": {"ol2"},
		},
		LanesRead:       true,
		OperatorActions: []OperatorAction{{OperationID: "op7", Kind: "happened"}, {OperationID: "op5", Kind: "replay"}},
	}
	set := func(id string, l *OpLanes) {
		op := in.Ops[id]
		op.Lanes = l
		in.Ops[id] = op
	}
	set("op3", &OpLanes{IndeterminateExits: 1, LookupFound: true, EffectAttempts: 1})
	set("op7", &OpLanes{IndeterminateExits: 1, EffectAttempts: 1, Interventions: []LaneAction{
		{Kind: "happened", Actor: "api:admin", From: "effect_indeterminate", To: "effect_confirmed"}}})
	set("op5", &OpLanes{EffectAttempts: 2, Interventions: []LaneAction{
		{Kind: "replay", Actor: "api:admin", From: "terminal_failure", To: "pending_effect"}}})
	set("oh1", &OpLanes{LookupFound: true, EffectAttempts: 1})
	return in
}

func TestCheckAccountsForAHealthyRun(t *testing.T) {
	t.Parallel()
	v := Check(healthy())
	if n := v.Violations(); n != 0 {
		t.Fatalf("violations %d in a healthy run: %+v", n, v.Invariants())
	}
	want := Accounting{AckedWithEvidence: 3, DeadLettered: 3, Indeterminate: 1, Pending: 1, ConfirmedUnacked: 1,
		HandedOffConfirmed: 1, HandedOffParked: 1, HandedOffTerminal: 1, OutboxParked: 1, OutboxTerminal: 1,
		LocalCommitted: 1, LocalRows: 1,
		SettledByReconciler: 1, ResolvedHappened: 1, Replayed: 1, ReplayedTerminal: 1, HandoffByLookup: 1}
	if v.Accounting != want {
		t.Fatalf("accounting %+v, want %+v", v.Accounting, want)
	}
	names := []string{}
	for _, inv := range v.Invariants() {
		names = append(names, inv.Name)
	}
	if got := strings.Join(names, ", "); got != "keys with two effects, acks without an effect, conflicts executed, messages not accounted for, "+
		"handoff acks without an outbox entry, handoffs left open, local rows without evidence, "+
		"messages never settled, operator actions not recorded" {
		t.Fatalf("invariants %s", got)
	}
}

// Each breakage must raise exactly the invariant it violates.
func TestCheckCatchesEachViolation(t *testing.T) {
	t.Parallel()
	setOp := func(in *Inputs, id string, f func(*LedgerOp)) {
		op := in.Ops[id]
		f(&op)
		in.Ops[id] = op
	}
	for _, tc := range []struct {
		name   string
		damage func(in *Inputs)
		want   string // the invariant that must count 1
		also   string // another one the same damage must raise, if any
	}{
		{"an idempotent key applied twice", func(in *Inputs) {
			in.Effects = append(in.Effects, Effect{Route: "idem", Key: "ik1", ResultID: "r1b", BodySHA256: "s1"})
		}, "keys with two effects", ""},
		{"an unsafe key applied twice (no dedupe)", func(in *Inputs) {
			in.Effects = append(in.Effects, Effect{Route: "unsafe", Key: "ik2", ResultID: "r2b", BodySHA256: "s2"})
		}, "keys with two effects", ""},
		{"one payload applied under two keys", func(in *Inputs) {
			in.Effects = append(in.Effects, Effect{Route: "idem", Key: "ik-other", ResultID: "rx", BodySHA256: "s1"})
		}, "keys with two effects", ""},
		{"acked, downstream never applied it", func(in *Inputs) {
			in.Effects = in.Effects[1:]
		}, "acks without an effect", ""},
		{"acked with a result id the downstream never gave", func(in *Inputs) {
			setOp(in, "op1", func(op *LedgerOp) { op.ResultID = "r-made-up" })
		}, "acks without an effect", ""},
		{"confirmed in the ledger, never applied", func(in *Inputs) {
			in.Effects = append(in.Effects[:3:3], in.Effects[4:]...)
		}, "acks without an effect", ""},
		{"acked while the effect is pending", func(in *Inputs) {
			in.Intents[5].Acked = true
		}, "acks without an effect", ""},
		{"acked while indeterminate", func(in *Inputs) {
			in.Intents[1].Acked = true
		}, "acks without an effect", ""},
		{"acked as terminal without a dead letter", func(in *Inputs) {
			setOp(in, "op5", func(op *LedgerOp) { op.DeadLetter = "" })
		}, "acks without an effect", ""},
		{"acked with no ledger record", func(in *Inputs) {
			delete(in.TraceOps, "t1")
		}, "acks without an effect", ""},
		{"the changed payload reached the downstream", func(in *Inputs) {
			in.Effects = append(in.Effects, Effect{Route: "lookup", Key: "ik4", ResultID: "r4", BodySHA256: "s4"})
		}, "conflicts executed", ""},
		{"a conflict record was attempted", func(in *Inputs) {
			setOp(in, "cf3", func(op *LedgerOp) { op.Attempts = 1 })
		}, "conflicts executed", ""},
		{"the changed payload was sent under the original's key", func(in *Inputs) {
			in.KeyReuse = append(in.KeyReuse, KeyReuse{Route: "idem", Key: "ik1"})
		}, "conflicts executed", ""},
		{"the changed payload was answered from the original", func(in *Inputs) {
			in.TraceOps["t4"] = []string{"cf3", "op3"}
		}, "conflicts executed", ""},
		{"a nacked message the ledger never heard of", func(in *Inputs) {
			delete(in.TraceOps, "t2")
		}, "messages not accounted for", ""},
		{"a lane without a reason", func(in *Inputs) {
			setOp(in, "op2", func(op *LedgerOp) { op.Reason = "" })
		}, "messages not accounted for", ""},
		{"a handoff acked without its outbox entry", func(in *Inputs) {
			setOp(in, "oh1", func(op *LedgerOp) { op.Outbox, op.OutboxDelivered = false, false })
		}, "handoff acks without an outbox entry", ""},
		{"a handoff acked without being handed off", func(in *Inputs) {
			setOp(in, "oh3", func(op *LedgerOp) { op.HandedOff = false })
		}, "handoff acks without an outbox entry", ""},
		{"a handoff still open after the drain", func(in *Inputs) {
			setOp(in, "oh2", func(op *LedgerOp) { op.State = "pending_effect" })
		}, "handoffs left open", ""},
		{"a handoff confirmed, never applied", func(in *Inputs) {
			setOp(in, "oh1", func(op *LedgerOp) { op.ResultID = "rh-made-up" })
		}, "acks without an effect", ""},
		{"a handed-off key applied twice (a blind resend)", func(in *Inputs) {
			in.Effects = append(in.Effects, Effect{Route: "hand", Key: "ikh1", ResultID: "rh1b", BodySHA256: "sh1"})
		}, "keys with two effects", ""},
		{"a handoff parked without a reason", func(in *Inputs) {
			setOp(in, "oh2", func(op *LedgerOp) { op.Reason = "" })
		}, "messages not accounted for", ""},
		{"a handoff terminal without a dead letter", func(in *Inputs) {
			setOp(in, "oh3", func(op *LedgerOp) { op.DeadLetter = "" })
		}, "messages not accounted for", ""},
		{"a local payload acked without its row", func(in *Inputs) {
			in.LocalRows = nil
		}, "acks without an effect", ""},
		{"a local statement run twice", func(in *Inputs) {
			in.LocalRows = append(in.LocalRows, LocalRow{Route: "loc", ID: "2", Key: "ikl1", OperationID: "ol1", BodySHA256: "sl1"})
		}, "keys with two effects", "local rows without evidence"},
		{"a local row whose operation is terminal", func(in *Inputs) {
			in.LocalRows = append(in.LocalRows, LocalRow{Route: "loc", ID: "3", Key: "ikl2", OperationID: "ol2", BodySHA256: "sl2"})
		}, "local rows without evidence", ""},
		{"a duplicate acked with no record, and its twin's record not confirmed", func(in *Inputs) {
			in.Intents = append(append([]Intent(nil), in.Intents...),
				Intent{Route: "unsafe", MessageID: "m6", TraceID: "t6-dup", BodySHA256: "s6", Acked: true})
		}, "acks without an effect", ""},
		{"a local row of an operation the ledger lost", func(in *Inputs) {
			in.LocalRows = append(in.LocalRows, LocalRow{Route: "loc", ID: "4", Key: "ikl9", OperationID: "ol9", BodySHA256: "sl9"})
		}, "local rows without evidence", ""},
		{"a message the broker was still delivering at the end", func(in *Inputs) {
			in.Intents = append([]Intent(nil), in.Intents...)
			in.Intents[5].StillDelivered = true
		}, "messages never settled", ""},
		{"a message the broker still held after the run", func(in *Inputs) {
			in.Held = []Intent{in.Intents[0]}
		}, "messages never settled", ""},
		{"an operator's resolution the ledger does not show", func(in *Inputs) {
			setOp(in, "op7", func(op *LedgerOp) { op.Lanes = &OpLanes{IndeterminateExits: 1, EffectAttempts: 1} })
		}, "operator actions not recorded", ""},
		{"an operator's replay recorded as another kind", func(in *Inputs) {
			setOp(in, "op5", func(op *LedgerOp) {
				op.Lanes = &OpLanes{EffectAttempts: 2, Interventions: []LaneAction{{Kind: "abandon", From: "terminal_failure", To: "terminal_failure"}}}
			})
		}, "operator actions not recorded", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := healthy()
			in.Ops = maps.Clone(in.Ops)
			in.TraceOps = maps.Clone(in.TraceOps)
			tc.damage(&in)
			v := Check(in)
			for _, inv := range v.Invariants() {
				want := 0
				if inv.Name == tc.want || inv.Name == tc.also {
					want = 1
				}
				if inv.Count != want {
					t.Errorf("%s = %d, want %d (examples %q)", inv.Name, inv.Count, want, inv.Examples)
				}
				if inv.Count > 0 && len(inv.Examples) == 0 {
					t.Errorf("%s counted without an example", inv.Name)
				}
			}
		})
	}
}

// A publisher's duplicate (the same route, key and payload, its own trace)
// acked while no delivery carries its trace is accounted for by its twin's
// confirmed record, not counted as an ack without an effect.
func TestCheckAccountsForAnUnrecordedDuplicate(t *testing.T) {
	t.Parallel()
	in := healthy()
	in.Intents = append(in.Intents, Intent{Route: "idem", MessageID: "m1", TraceID: "t1-dup", BodySHA256: "s1", Acked: true})
	v := Check(in)
	if n := v.Violations(); n != 0 || v.AckedUnrecorded != 1 {
		t.Fatalf("violations %d, acked unrecorded %d; want 0 and 1", n, v.AckedUnrecorded)
	}
}

func TestCheckBoundsExamples(t *testing.T) {
	t.Parallel()
	in := Inputs{Ops: map[string]LedgerOp{}, TraceOps: map[string][]string{}}
	for i := range 20 {
		in.Intents = append(in.Intents, Intent{Route: "r", MessageID: string(rune('a' + i)), TraceID: "none"})
	}
	v := Check(in)
	if v.Unaccounted.Count != 20 || len(v.Unaccounted.Examples) != maxExamples {
		t.Fatalf("unaccounted %d with %d examples", v.Unaccounted.Count, len(v.Unaccounted.Examples))
	}
}
