package gate

import (
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// Each named change sets exactly the fields its step writes: the test spells
// out every field of every constructor's result, so a field that one of them
// starts (or stops) setting fails here.
func TestNamedChanges(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	lease := Lease{Key: "op_1", Owner: "gw-1/abc", Fence: 7, Expires: at.Add(20 * time.Second)}
	open := &Operation{ID: "op_1", State: StatePendingEffect}
	row := &Operation{ID: "op_new", ScopeKey: "s"}
	d := &Delivery{MessageID: "m-1"}
	fin := &Attempt{N: 2, Outcome: OutcomeUnknown}
	ans := &Answer{N: 2, Decision: Nack, Reason: "r"}
	steps := []Step{{Transition: Transition{From: StatePendingEffect, To: StateEffectIndeterminate}}}
	start := &Attempt{N: 3, Kind: AttemptEffect}
	dl := &DeadLetter{OperationID: "op_1", Reason: "r"}

	claimExisting := Claiming(open, nil, lease, d)
	claimNew := Claiming(nil, row, lease, d)
	lost := at.Add(-time.Second)
	facts := LeaseFacts{Extensions: 2, Deadline: at.Add(time.Minute), LostAt: &lost}
	settle := Settling(open, 7, fin, ans, facts)
	claimed := &Claim{Owner: "gw-1/abc", LeaseDeadline: lease.Expires, Delivery: d}
	created := &Claim{Row: row, Owner: "gw-1/abc", LeaseDeadline: lease.Expires, Delivery: d}
	settled := &Settle{Finish: fin, Answer: ans, Lease: facts}

	cases := []struct {
		name string
		got  *Change
		want Change
	}{
		{"start, claiming an existing operation", StartChange(claimExisting, steps, start, "why", at),
			Change{Kind: ChangeStart, OperationID: "op_1", Expect: StatePendingEffect, Fence: 7, Steps: steps, Reason: "why", At: at, Claim: claimed, Start: start}},
		{"start, creating the operation", StartChange(claimNew, steps, start, "why", at),
			Change{Kind: ChangeStart, OperationID: "op_new", Fence: 7, Steps: steps, Reason: "why", At: at, Claim: created, Start: start}},
		{"confirm, settling", ConfirmChange(settle, steps, "res-1", "why", at),
			Change{Kind: ChangeConfirm, OperationID: "op_1", Expect: StatePendingEffect, Fence: 7, Steps: steps, Reason: "why", At: at, Settle: settled, ResultID: "res-1"}},
		{"confirm, claiming after a lookup", ConfirmChange(claimExisting, steps, "res-1", "why", at),
			Change{Kind: ChangeConfirm, OperationID: "op_1", Expect: StatePendingEffect, Fence: 7, Steps: steps, Reason: "why", At: at, Claim: claimed, ResultID: "res-1"}},
		{"indeterminate", IndeterminateChange(settle, steps, LaneOperator, "why", at),
			Change{Kind: ChangeIndeterminate, OperationID: "op_1", Expect: StatePendingEffect, Fence: 7, Steps: steps, Reason: "why", At: at, Settle: settled, Lane: LaneOperator}},
		{"terminal with a dead letter", TerminalChange(claimNew, steps, dl, "why", at),
			Change{Kind: ChangeTerminal, OperationID: "op_new", Fence: 7, Steps: steps, Reason: "why", At: at, Claim: created, DeadLetter: dl}},
		{"terminal left to the broker", TerminalChange(settle, steps, nil, "why", at),
			Change{Kind: ChangeTerminal, OperationID: "op_1", Expect: StatePendingEffect, Fence: 7, Steps: steps, Reason: "why", At: at, Settle: settled}},
		{"retry later changes no state", RetryLaterChange(settle, "why", at),
			Change{Kind: ChangeRetryLater, OperationID: "op_1", Expect: StatePendingEffect, Fence: 7, Reason: "why", At: at, Settle: settled}},
		{"acked", AckedChange("op_1", StateAckPending, 7, steps, at),
			Change{Kind: ChangeAcked, OperationID: "op_1", Expect: StateAckPending, Fence: 7, Steps: steps, At: at}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !reflect.DeepEqual(*tc.got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", *tc.got, tc.want)
			}
		})
	}
}

func TestChangeReasonIsBounded(t *testing.T) {
	t.Parallel()
	c := RetryLaterChange(Settling(&Operation{ID: "op_1", State: StatePendingEffect}, 1, nil, nil, LeaseFacts{}), strings.Repeat("é", 400), time.Now())
	if len(c.Reason) > MaxReason || !utf8.ValidString(c.Reason) {
		t.Fatalf("reason of %d bytes, bound is %d, or cut a character", len(c.Reason), MaxReason)
	}
}
