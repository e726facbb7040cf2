package handlers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/handlers"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
)

// adminAnswer is one answer of the admin listener to a POST.
type adminAnswer struct {
	Status  int
	Header  http.Header
	Raw     []byte
	Record  adminapi.EvidenceRecord
	Problem string
}

func (e *env) adminPost(path string, body any) adminAnswer {
	e.t.Helper()
	return e.adminPostAs("", path, body)
}

// adminPostAs posts with the token of the operator name ("" is admin).
func (e *env) adminPostAs(name, path string, body any) adminAnswer {
	e.t.Helper()
	token := adminToken
	if name != "" {
		token = operatorToken(name)
	}
	raw, ok := body.([]byte)
	if !ok {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			e.t.Fatal(err)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, e.admin.URL+path, bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("admin post %s: %v", path, err)
	}
	defer resp.Body.Close()
	a := adminAnswer{Status: resp.StatusCode, Header: resp.Header}
	a.Raw, _ = io.ReadAll(resp.Body)
	if a.Status == http.StatusOK {
		if err := json.Unmarshal(a.Raw, &a.Record); err != nil {
			e.t.Fatalf("admin post %s: decode the record: %v: %s", path, err, a.Raw)
		}
	} else {
		var p struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal(a.Raw, &p); err != nil || p.Error == "" {
			e.t.Fatalf("admin post %s: %d without a problem: %s", path, a.Status, a.Raw)
		}
		a.Problem = p.Error
	}
	return a
}

// resolveOp posts req as the operator req.Actor names (whose credential it
// is, so the gateway accepts the field).
func (e *env) resolveOp(id string, req adminapi.ResolveRequest) adminAnswer {
	e.t.Helper()
	return e.adminPostAs(req.Actor, "/v1/operations/"+id+"/resolve", req)
}

// replayOp replays id as the operator actor.
func (e *env) replayOp(id, reason, actor string) adminAnswer {
	e.t.Helper()
	return e.adminPostAs(actor, "/v1/operations/"+id+"/replay", adminapi.ReplayRequest{Reason: reason})
}

// snapshot is the whole ledger record of an operation, for "nothing
// changed" comparisons. It waits until every delivery's answer is
// recorded: that bookkeeping runs after the response, and would otherwise
// look like a change.
func (e *env) snapshot(id string) string {
	e.t.Helper()
	var rec *adminapi.Record
	undecided := func() int {
		n := 0
		for _, d := range rec.Deliveries {
			if d.Decision == "" {
				n++
			}
		}
		return n
	}
	testenv.Eventually(e.t, testenv.StepTimeout, func() bool { rec = e.record(id); return undecided() == 0 },
		func() string {
			return fmt.Sprintf("%s: %d deliveries never got their answer recorded", id, undecided())
		})
	b, err := json.Marshal(rec)
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b)
}

// waitDeliveries waits until n deliveries of operation id are recorded: a
// delivery turned away while another held the lease is recorded after its
// answer went out.
func (e *env) waitDeliveries(id string, n int) {
	e.t.Helper()
	var got int
	testenv.Eventually(e.t, testenv.StepTimeout, func() bool { got = len(e.record(id).Deliveries); return got >= n },
		func() string { return fmt.Sprintf("%s: %d deliveries recorded, want %d", id, got, n) })
}

func wantAnswer(t *testing.T, a adminAnswer, status int) {
	t.Helper()
	if a.Status != status {
		t.Fatalf("answer %d (%s), want %d", a.Status, a.Raw, status)
	}
}

// indeterminate pushes m on an unsafe route whose downstream applies the
// effect and loses the answer, leaving the operation in the indeterminate
// lane, and returns its id.
func (e *env) indeterminate(route string, m msg) string {
	e.t.Helper()
	e.down.set(dropAfterApply)
	defer e.down.set(nil)
	if r := e.push(route, m); r.Status != http.StatusServiceUnavailable {
		e.t.Fatalf("push of %s: %d %s", m.ID, r.Status, r.Raw)
	}
	id := e.opID(route, m)
	if st := e.record(id).Operation.State; st != gate.StateEffectIndeterminate {
		e.t.Fatalf("%s is %s, want effect_indeterminate", id, st)
	}
	return id
}

// wantLogChained checks that every transition starts where the previous
// one ended: one history, whatever raced to write it.
func wantLogChained(t *testing.T, rec *adminapi.Record) {
	t.Helper()
	for i := 1; i < len(rec.Events); i++ {
		if rec.Events[i].From != rec.Events[i-1].To {
			t.Fatalf("transition %d goes from %s, but the log was at %s: %+v", i, rec.Events[i].From, rec.Events[i-1].To, rec.Events)
		}
	}
	if n := len(rec.Events); n == 0 || rec.Events[n-1].To != rec.Operation.State {
		t.Fatalf("the log ends at %v, the operation is %s", states(rec), rec.Operation.State)
	}
}

// Each kind of resolution, from the admin API: it changes exactly what it
// says, records who and why, and a second identical request writes nothing.
func TestResolveEachKind(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("mail", "unsafe", "broker", "")+routeYAML("ledgered", "unsafe", "gateway", ""))

	t.Run("happened", func(t *testing.T) {
		m := msg{ID: "m-happened", Data: "x"}
		id := e.indeterminate("mail", m)
		calls := e.down.effectCalls.Load()
		req := adminapi.ResolveRequest{Kind: gate.ResolveHappened, ResultID: "res-console-7", Reason: "found in the mail provider's log", Actor: "alice"}
		a := e.resolveOp(id, req)
		wantAnswer(t, a, http.StatusOK)
		if a.Header.Get(handlers.ResolutionHeader) != "applied" {
			t.Errorf("%s = %q, want applied", handlers.ResolutionHeader, a.Header.Get(handlers.ResolutionHeader))
		}
		rec := a.Record
		if rec.Operation.State != gate.StateEffectConfirmed || rec.Operation.ResultID != "res-console-7" ||
			rec.Evidence.ResultID != "res-console-7" || rec.Evidence.EvidenceTime == nil {
			t.Fatalf("after happened: %+v", rec.Operation)
		}
		if len(rec.ManualInterventions) != 1 {
			t.Fatalf("manual interventions %+v", rec.ManualInterventions)
		}
		iv := rec.ManualInterventions[0]
		if iv.Kind != gate.ResolveHappened || iv.Actor != "api:alice" || iv.Reason != req.Reason || iv.ResultID != "res-console-7" ||
			iv.From != gate.StateEffectIndeterminate || iv.To != gate.StateEffectConfirmed || iv.Fence != rec.Operation.Fence {
			t.Fatalf("intervention %+v", iv)
		}
		if mi := rec.Evidence.ManualIntervention; mi == nil || !strings.Contains(*mi, "happened by api:alice") ||
			!strings.Contains(*mi, req.Reason) || !strings.Contains(*mi, "res-console-7") {
			t.Fatalf("manual_intervention = %v", mi)
		}
		// The statement never passes an operator's word off as the
		// downstream's evidence.
		if !strings.Contains(rec.Statement, "confirmed by operator api:alice") || !strings.Contains(rec.Statement, "not by the downstream") ||
			strings.Contains(rec.Statement, "the downstream's effect evidence is") {
			t.Fatalf("statement: %s", rec.Statement)
		}
		if last := rec.Transitions[len(rec.Transitions)-1]; last.To != gate.StateEffectConfirmed || !strings.Contains(last.Reason, "alice") {
			t.Fatalf("last transition %+v", last)
		}

		// The same request again: the record, and nothing written.
		before := e.snapshot(id)
		again := e.resolveOp(id, req)
		wantAnswer(t, again, http.StatusOK)
		if again.Header.Get(handlers.ResolutionHeader) != "already_applied" || e.snapshot(id) != before {
			t.Fatalf("a repeated resolution changed the record (header %q)", again.Header.Get(handlers.ResolutionHeader))
		}

		// The next delivery acks without calling the downstream.
		wantStatus(t, e.push("mail", m), http.StatusNoContent)
		done := e.waitState(id, gate.StateAcknowledged)
		if n := e.down.effectCalls.Load(); n != calls {
			t.Fatalf("the downstream was called %d more times after happened", n-calls)
		}
		if len(done.Interventions) != 1 {
			t.Fatalf("interventions after the ack: %+v", done.Interventions)
		}
	})

	t.Run("not_happened", func(t *testing.T) {
		m := msg{ID: "m-not-happened", Data: "x"}
		id := e.indeterminate("mail", m)
		first := e.record(id)
		req := adminapi.ResolveRequest{Kind: gate.ResolveNotHappened, Reason: "no such mail in the provider's log", Actor: "bob"}
		a := e.resolveOp(id, req)
		wantAnswer(t, a, http.StatusOK)
		rec := a.Record
		if rec.Operation.State != gate.StatePendingEffect || rec.Operation.Grant != first.Operation.AttemptCount+1 ||
			rec.Operation.ResultID != "" || len(rec.Attempts) != len(first.Attempts) {
			t.Fatalf("after not_happened: %+v, %d attempts", rec.Operation, len(rec.Attempts))
		}
		if iv := rec.ManualInterventions; len(iv) != 1 || iv[0].Actor != "api:bob" || iv[0].To != gate.StatePendingEffect || iv[0].ResultID != "" {
			t.Fatalf("interventions %+v", iv)
		}
		if !strings.Contains(rec.Statement, "Operator api:bob said the effect did not happen") {
			t.Fatalf("statement: %s", rec.Statement)
		}
		again := e.resolveOp(id, req)
		wantAnswer(t, again, http.StatusOK)
		if again.Header.Get(handlers.ResolutionHeader) != "already_applied" || len(again.Record.ManualInterventions) != 1 {
			t.Fatalf("repeated not_happened: %s, %+v", again.Header.Get(handlers.ResolutionHeader), again.Record.ManualInterventions)
		}
	})

	for _, tc := range []struct {
		route  string
		answer int
		dead   int
	}{{"mail", http.StatusServiceUnavailable, 0}, {"ledgered", http.StatusNoContent, 1}} {
		t.Run("abandon on "+tc.route, func(t *testing.T) {
			m := msg{ID: "m-abandon-" + tc.route, Data: "x"}
			id := e.indeterminate(tc.route, m)
			calls := e.down.effectCalls.Load()
			a := e.resolveOp(id, adminapi.ResolveRequest{Kind: gate.ResolveAbandon, Reason: "the customer was refunded by hand", Actor: "carol"})
			wantAnswer(t, a, http.StatusOK)
			rec := a.Record
			if rec.Operation.State != gate.StateTerminalFailure || len(rec.DeadLetters) != tc.dead ||
				!strings.Contains(rec.Operation.Reason, "carol") || len(rec.ManualInterventions) != 1 {
				t.Fatalf("after abandon: %+v, dead letters %+v", rec.Operation, rec.DeadLetters)
			}
			// The next delivery gets the policy's answer and no call.
			wantStatus(t, e.push(tc.route, m), tc.answer)
			if n := e.down.effectCalls.Load(); n != calls {
				t.Fatalf("the downstream was called after abandon")
			}
			var list adminapi.DeadLetterList
			if code := e.adminGet("/v1/dead-letters?route="+tc.route, &list); code != http.StatusOK {
				t.Fatalf("dead letters: %d", code)
			}
			var found *adminapi.DeadLetterEntry
			for i := range list.DeadLetters {
				if list.DeadLetters[i].OperationID == id {
					found = &list.DeadLetters[i]
				}
			}
			want := map[int]string{0: adminapi.DeadLetteredByBroker, 1: adminapi.DeadLetteredByGateway}[tc.dead]
			if found == nil || found.DeadLetteredBy != want || !found.Replayable || found.MessageID != m.ID || found.Reason != rec.Operation.Reason {
				t.Fatalf("dead letter entry %+v in %+v", found, list)
			}
		})
	}
}

// Every combination that makes no sense is refused with 409 and leaves the
// record exactly as it was; malformed requests are 400 (413 when too big),
// unknown operations 404.
func TestResolutionRefusalsChangeNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, routeYAML("mail", "unsafe", "broker", "")+
		routeYAML("orders", "idempotent", "gateway", "    max_attempts: 5\n"))
	ctx := context.Background()

	acked := msg{ID: "m-acked", Data: "x"}
	wantStatus(t, e.push("orders", acked), http.StatusNoContent)
	ackedID := e.waitState(e.opID("orders", acked), gate.StateAcknowledged).Operation.ID

	// Confirmed, the ack never written: the worker died after the commit.
	confirmed := msg{ID: "m-confirmed", Data: "x"}
	if res, err := e.gate.Deliver(ctx, e.routes["orders"], &gate.Message{Broker: gate.BrokerPubSub,
		Source: "projects/p/subscriptions/s", MessageID: confirmed.ID, Data: []byte(confirmed.Data)}); err != nil || res.Decision != gate.Ack {
		t.Fatalf("deliver: %+v %v", res, err)
	}
	confirmedID := e.opID("orders", confirmed)

	e.down.set(status(http.StatusServiceUnavailable))
	pending := msg{ID: "m-pending", Data: "x"}
	wantStatus(t, e.push("orders", pending), http.StatusServiceUnavailable)
	pendingID := e.opID("orders", pending)
	e.down.set(status(http.StatusUnprocessableEntity))
	terminal := msg{ID: "m-terminal", Data: "x"}
	wantStatus(t, e.push("orders", terminal), http.StatusNoContent)
	terminalID := e.opID("orders", terminal)
	e.down.set(nil)

	indetID := e.indeterminate("mail", msg{ID: "m-indet", Data: "x"})

	wantStatus(t, e.push("orders", msg{ID: "m-acked", Data: "other"}), http.StatusNoContent)
	cfs, _, err := e.ledger.List(ctx, adminapi.ListFilter{State: string(gate.StateConflicting)})
	if err != nil || len(cfs) != 1 {
		t.Fatalf("conflict records: %+v %v", cfs, err)
	}
	conflictID := cfs[0].ID

	for id, want := range map[string]gate.State{ackedID: gate.StateAcknowledged, confirmedID: gate.StateAckPending,
		pendingID: gate.StatePendingEffect, terminalID: gate.StateTerminalFailure, indetID: gate.StateEffectIndeterminate} {
		if st := e.record(id).Operation.State; st != want {
			t.Fatalf("fixture %s is %s, want %s", id, st, want)
		}
	}

	happened := adminapi.ResolveRequest{Kind: gate.ResolveHappened, ResultID: "r-1", Reason: "seen", Actor: "dave"}
	notHappened := adminapi.ResolveRequest{Kind: gate.ResolveNotHappened, Reason: "not seen", Actor: "dave"}
	abandon := adminapi.ResolveRequest{Kind: gate.ResolveAbandon, Reason: "give up", Actor: "dave"}
	const replay = "replay"
	for _, tc := range []struct {
		name string
		id   string
		req  any // a ResolveRequest, or replay
	}{
		{"not_happened on acknowledged", ackedID, notHappened},
		{"happened on acknowledged", ackedID, happened},
		{"abandon of acknowledged", ackedID, abandon},
		{"replay of acknowledged", ackedID, replay},
		{"replay of confirmed", confirmedID, replay},
		{"not_happened on confirmed", confirmedID, notHappened},
		{"replay of indeterminate", indetID, replay},
		{"replay of a conflict record", conflictID, replay},
		{"happened on a conflict record", conflictID, happened},
		{"abandon of a conflict record", conflictID, abandon},
		{"abandon of terminal", terminalID, abandon},
		{"not_happened on terminal", terminalID, notHappened},
		{"not_happened on an open operation", pendingID, notHappened},
		{"happened on an open operation", pendingID, happened},
		{"abandon of an open operation", pendingID, abandon},
		{"replay of an open operation", pendingID, replay},
	} {
		before := e.snapshot(tc.id)
		var a adminAnswer
		if tc.req == replay {
			a = e.replayOp(tc.id, "try again", "dave")
		} else {
			a = e.resolveOp(tc.id, tc.req.(adminapi.ResolveRequest))
		}
		if a.Status != http.StatusConflict {
			t.Errorf("%s: %d (%s), want 409", tc.name, a.Status, a.Raw)
		}
		if after := e.snapshot(tc.id); after != before {
			t.Errorf("%s: the record changed:\nbefore %s\nafter  %s", tc.name, before, after)
		}
	}

	before := e.snapshot(indetID)
	for _, tc := range []struct {
		name   string
		path   string
		body   []byte
		status int
	}{
		{"no reason", "resolve", []byte(`{"kind":"not_happened","actor":"admin"}`), 400},
		{"blank reason", "resolve", []byte(`{"kind":"not_happened","reason":"  ","actor":"admin"}`), 400},
		{"an actor other than the credential", "resolve", []byte(`{"kind":"not_happened","reason":"r","actor":"dave"}`), 400},
		{"actor too long", "resolve", []byte(`{"kind":"not_happened","reason":"r","actor":"` + strings.Repeat("a", 257) + `"}`), 400},
		{"note too long", "resolve", []byte(`{"kind":"not_happened","reason":"r","note":"` + strings.Repeat("n", 201) + `"}`), 400},
		{"reason and note too long", "replay", []byte(`{"reason":"` + strings.Repeat("r", 250) + `","note":"` + strings.Repeat("n", 60) + `"}`), 400},
		{"NUL in the note", "resolve", []byte(`{"kind":"abandon","reason":"r","note":"n\u0000"}`), 400},
		{"reason too long", "replay", []byte(`{"reason":"` + strings.Repeat("r", 301) + `","actor":"admin"}`), 400},
		{"happened without a result id", "resolve", []byte(`{"kind":"happened","reason":"r","actor":"admin"}`), 400},
		{"a result id on not_happened", "resolve", []byte(`{"kind":"not_happened","result_id":"x","reason":"r","actor":"admin"}`), 400},
		{"unknown kind", "resolve", []byte(`{"kind":"maybe","reason":"r","actor":"admin"}`), 400},
		{"replay through resolve", "resolve", []byte(`{"kind":"replay","reason":"r","actor":"admin"}`), 400},
		{"unknown field", "resolve", []byte(`{"kind":"abandon","reason":"r","actor":"admin","force":true}`), 400},
		{"kind on replay", "replay", []byte(`{"kind":"replay","reason":"r","actor":"admin"}`), 400},
		{"not JSON", "resolve", []byte(`{"kind":`), 400},
		{"two objects", "resolve", []byte(`{"kind":"abandon","reason":"r","actor":"admin"} {}`), 400},
		{"an array", "replay", []byte(`[]`), 400},
		{"NUL in the actor", "resolve", []byte(`{"kind":"abandon","reason":"r","actor":"d\u0000ve"}`), 400},
		{"too large", "resolve", []byte(`{"kind":"abandon","reason":"` + strings.Repeat("r", 20<<10) + `","actor":"admin"}`), 413},
	} {
		a := e.adminPost("/v1/operations/"+indetID+"/"+tc.path, tc.body)
		if a.Status != tc.status {
			t.Errorf("%s: %d (%s), want %d", tc.name, a.Status, a.Raw, tc.status)
		}
	}
	if e.snapshot(indetID) != before {
		t.Error("a malformed request changed the record")
	}
	if a := e.resolveOp("op_aaaaaaaaaaaaaaaaaaaaaaaaaa", abandon); a.Status != http.StatusNotFound {
		t.Errorf("unknown operation: %d %s", a.Status, a.Raw)
	}
	if a := e.replayOp(strings.Repeat("x", 65), "r", "dave"); a.Status != http.StatusBadRequest {
		t.Errorf("overlong id: %d %s", a.Status, a.Raw)
	}

	// Someone holds the operation's lease: 503 with Retry-After, nothing written.
	lease, err := storage.NewReservations(e.rdb).Acquire(ctx, indetID, "someone-else", time.Minute, e.record(indetID).Operation.Fence)
	if err != nil {
		t.Fatal(err)
	}
	a := e.resolveOp(indetID, abandon)
	if a.Status != http.StatusServiceUnavailable || a.Header.Get("Retry-After") == "" {
		t.Fatalf("resolution under a held lease: %d %v %s", a.Status, a.Header, a.Raw)
	}
	if e.snapshot(indetID) != before {
		t.Fatal("a resolution under someone else's lease changed the record")
	}
	if err := storage.NewReservations(e.rdb).Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, e.resolveOp(indetID, abandon), http.StatusOK)
}

// Two operators resolve the same indeterminate operation at once, one
// saying it happened and one that it did not, over and over: each time
// exactly one resolution is recorded, the other is refused (409) or turned
// away while the lease is held (503), and the log is one history.
func TestConcurrentResolutionsLeaveOneOutcome(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("mail", "unsafe", "broker", ""))
	for i := range 6 {
		id := e.indeterminate("mail", msg{ID: fmt.Sprintf("m-race-%d", i), Data: "x"})
		reqs := []adminapi.ResolveRequest{
			{Kind: gate.ResolveHappened, ResultID: "r-seen", Reason: "seen it", Actor: "erin"},
			{Kind: gate.ResolveNotHappened, Reason: "never seen", Actor: "frank"},
		}
		answers := make([]adminAnswer, len(reqs))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for j, req := range reqs {
			wg.Go(func() {
				<-start
				answers[j] = e.resolveOp(id, req)
			})
		}
		close(start)
		wg.Wait()
		var won []int
		for j, a := range answers {
			switch a.Status {
			case http.StatusOK:
				won = append(won, j)
			case http.StatusConflict, http.StatusServiceUnavailable:
			default:
				t.Fatalf("round %d: answer %d %s", i, a.Status, a.Raw)
			}
		}
		if len(won) != 1 {
			t.Fatalf("round %d: %d resolutions answered 200, want exactly 1: %+v", i, len(won), answers)
		}
		rec := e.record(id)
		wantLogChained(t, rec)
		want := map[int]gate.State{0: gate.StateEffectConfirmed, 1: gate.StatePendingEffect}[won[0]]
		if len(rec.Interventions) != 1 || rec.Interventions[0].Kind != reqs[won[0]].Kind || rec.Operation.State != want {
			t.Fatalf("round %d: %s won, but the record is %s with %+v", i, reqs[won[0]].Kind, rec.Operation.State, rec.Interventions)
		}
	}
}

// An operator says an unsafe effect did not happen: the next delivery makes
// exactly one new attempt under the same key, however many copies arrive at
// once and whoever else tries to resolve it meanwhile; if that attempt's
// answer is lost too, the operation goes back to the lane instead of being
// tried again.
func TestNotHappenedAllowsExactlyOneAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("mail", "unsafe", "broker", ""))
	for _, lose := range []bool{false, true} {
		m := msg{ID: fmt.Sprintf("m-grant-%v", lose), Data: "x"}
		id := e.indeterminate("mail", m)
		key := e.record(id).Operation.IdempotencyKey
		wantAnswer(t, e.resolveOp(id, adminapi.ResolveRequest{Kind: gate.ResolveNotHappened, Reason: "not in the provider's log", Actor: "gina"}), http.StatusOK)

		var (
			mu  sync.Mutex
			ops []string
		)
		release := make(chan struct{})
		e.down.set(func(w http.ResponseWriter, r *http.Request, apply func() string) {
			mu.Lock()
			ops = append(ops, r.Header.Get("X-Ackgate-Operation"))
			mu.Unlock()
			<-release
			if lose {
				dropAfterApply(w, r, apply)
				return
			}
			answer(w, apply())
		})
		calls, applied := e.down.effectCalls.Load(), e.down.Applied()
		var wg sync.WaitGroup
		codes := make(chan int, 8)
		for range 6 {
			wg.Go(func() { codes <- e.push("mail", m).Status })
		}
		// A resolution while the granted attempt runs is refused: the
		// operation is open, and its owner is at work. It is sent while the
		// downstream holds the attempt's call: sent any later, it could find
		// the operation back in the lane (lost answer) and rightly apply.
		waitCalls(t, e, calls+1)
		codes <- e.resolveOp(id, adminapi.ResolveRequest{Kind: gate.ResolveHappened, ResultID: "r-x", Reason: "guess", Actor: "hank"}).Status
		close(release)
		wg.Wait()
		close(codes)
		for c := range codes {
			if c != http.StatusNoContent && c != http.StatusServiceUnavailable && c != http.StatusConflict {
				t.Fatalf("answer %d", c)
			}
		}
		if n := e.down.effectCalls.Load() - calls; n != 1 {
			t.Fatalf("lost=%v: %d new calls after not_happened, want exactly 1", lose, n)
		}
		keys := e.down.Keys()
		if keys[len(keys)-1] != key || len(ops) != 1 || ops[0] != id {
			t.Fatalf("the new attempt went out with key %s for operation %v, want %s for %s", keys[len(keys)-1], ops, key, id)
		}
		e.down.set(nil)
		want := gate.StateAcknowledged
		if lose {
			want = gate.StateEffectIndeterminate
		}
		rec := e.waitState(id, want)
		wantLogChained(t, rec)
		if len(rec.Interventions) != 1 || e.down.Applied() != applied+1 {
			t.Fatalf("interventions %+v, applied %d", rec.Interventions, e.down.Applied()-applied)
		}
		// Nothing more: the grant is spent.
		wantStatus(t, e.push("mail", m), map[bool]int{false: http.StatusNoContent, true: http.StatusServiceUnavailable}[lose])
		if n := e.down.effectCalls.Load() - calls; n != 1 {
			t.Fatalf("lost=%v: a later delivery made another attempt (%d in all)", lose, n)
		}
	}
}

// waitCalls waits until the downstream has seen n effect calls.
func waitCalls(t *testing.T, e *env, n int64) {
	t.Helper()
	testenv.Eventually(t, testenv.StepTimeout, func() bool { return e.down.effectCalls.Load() >= n },
		func() string {
			return fmt.Sprintf("the downstream saw %d calls, want %d", e.down.effectCalls.Load(), n)
		})
}

// A replay racing redeliveries of the same terminal message: copies that
// come before it get the terminal answer, copies after it share one
// attempt. However they interleave, the downstream sees exactly one new
// call, with the operation's key.
func TestReplayRacingRedeliveries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("orders", "unsafe", "broker", ""))
	for i := range 4 {
		m := msg{ID: fmt.Sprintf("m-replay-race-%d", i), Data: "x"}
		e.down.set(status(http.StatusUnprocessableEntity))
		wantStatus(t, e.push("orders", m), http.StatusServiceUnavailable)
		id := e.opID("orders", m)
		key := e.record(id).Operation.IdempotencyKey
		e.down.set(nil)
		calls := e.down.effectCalls.Load()

		var wg sync.WaitGroup
		start := make(chan struct{})
		var replay adminAnswer
		wg.Go(func() { <-start; replay = e.replayOp(id, "fixed", "jane") })
		for range 4 {
			wg.Go(func() { <-start; e.push("orders", m) })
		}
		close(start)
		wg.Wait()
		wantAnswer(t, replay, http.StatusOK)
		// Whatever came first, one more copy finds the grant spent or
		// takes it.
		wantStatus(t, e.push("orders", m), http.StatusNoContent)
		rec := e.waitState(id, gate.StateAcknowledged)
		if n := e.down.effectCalls.Load() - calls; n != 1 {
			t.Fatalf("round %d: %d calls after the replay, want exactly 1", i, n)
		}
		if keys := e.down.Keys(); keys[len(keys)-1] != key {
			t.Fatalf("round %d: the replayed attempt used key %s, want %s", i, keys[len(keys)-1], key)
		}
		if len(rec.Interventions) != 1 || len(rec.Attempts) != 2 {
			t.Fatalf("round %d: interventions %+v, attempts %+v", i, rec.Interventions, rec.Attempts)
		}
		wantLogChained(t, rec)
	}
}
