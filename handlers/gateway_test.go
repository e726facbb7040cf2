package handlers_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/handlers"
	"github.com/ackgate/ackgate/internal/testenv"
)

// A 2xx from the downstream becomes 204 only once effect_confirmed is
// committed, and the evidence record shows how it got there.
func TestConfirmedEffectAcksAfterCommittedEvidence(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, routeYAML("orders", "idempotent", "broker", ""))
	m := msg{ID: "m-1", Data: `{"order":1}`}
	r := e.push("orders", m)
	wantStatus(t, r, http.StatusNoContent)

	// Read right after the 204: the evidence must already be there.
	id := e.opID("orders", m)
	rec := e.record(id)
	if !rec.Operation.State.Confirmed() || rec.Operation.ResultID != "res-1" || rec.Operation.EvidenceAt == nil {
		t.Fatalf("after 204 the ledger shows state %s result %q", rec.Operation.State, rec.Operation.ResultID)
	}
	rec = e.waitState(id, gate.StateAcknowledged)
	want := []gate.State{gate.StateReceived, gate.StateReserved, gate.StatePendingEffect,
		gate.StateEffectConfirmed, gate.StateAckPending, gate.StateAcknowledged}
	if got := states(rec); !slices.Equal(got, want) {
		t.Fatalf("transitions = %v, want %v", got, want)
	}
	for _, ev := range rec.Events {
		if ev.At.IsZero() || ev.Fence != rec.Operation.Fence {
			t.Fatalf("transition %+v lacks its time or fence (operation fence %d)", ev, rec.Operation.Fence)
		}
	}
	if d := rec.Deliveries; len(d) != 1 || d[0].Decision != gate.Ack || d[0].Fence != rec.Operation.Fence || d[0].N != 1 {
		t.Fatalf("the delivery's answer is not recorded: %+v", d)
	}
	if len(rec.Attempts) != 1 || rec.Attempts[0].IdempotencyKey == "" || rec.Attempts[0].IdempotencyKey != e.down.Keys()[0] {
		t.Fatalf("attempts = %+v, downstream saw keys %v", rec.Attempts, e.down.Keys())
	}

	// The admin API serves the same evidence with its completion statement.
	var ev adminapi.EvidenceRecord
	if code := e.adminGet("/v1/operations/"+id, &ev); code != http.StatusOK {
		t.Fatalf("admin status %d", code)
	}
	if ev.Evidence.ResultID != "res-1" || ev.Evidence.IdempotencyKey != rec.Operation.IdempotencyKey ||
		ev.Evidence.FencingVersion < 1 || len(ev.Evidence.TransitionTimes) != 6 ||
		!strings.Contains(ev.Statement, `"res-1"`) || ev.Contract == nil {
		t.Fatalf("evidence record incomplete: %+v", ev)
	}
}

// Redelivery of confirmed work: 204, no second effect; after the ack went
// out, the redelivery is recorded as an anomaly.
func TestRedeliverAfterSuccessfulAcknowledgment(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("orders", "unsafe", "broker", ""))
	m := msg{ID: "m-1", Data: "x"}
	wantStatus(t, e.push("orders", m), http.StatusNoContent)
	id := e.opID("orders", m)
	e.waitState(id, gate.StateAcknowledged)
	wantStatus(t, e.push("orders", m), http.StatusNoContent)
	if n := e.down.effectCalls.Load(); n != 1 {
		t.Fatalf("downstream called %d times, want 1", n)
	}
	var rec *adminapi.Record
	testenv.Eventually(t, 10*time.Second, func() bool { rec = e.record(id); return len(rec.Deliveries) == 2 },
		func() string { return fmt.Sprintf("redelivery never recorded: %+v", rec.Deliveries) })
	if d := rec.Deliveries[1]; d.Anomaly != "redelivered_after_ack" || d.Decision != gate.Ack {
		t.Fatalf("second delivery = %+v", d)
	}
}

// Identical deliveries that overlap: exactly one reaches the downstream; the
// others are nacked with 503 while the first owner holds the lease.
func TestConcurrentIdenticalDeliveries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("orders", "unsafe", "broker", ""))
	const n = 8
	entered := make(chan struct{}, n)
	release := testenv.NewRelease(t)
	e.down.set(func(w http.ResponseWriter, r *http.Request, apply func() string) {
		entered <- struct{}{}
		<-release.C
		answer(w, apply())
	})
	m := msg{ID: "m-burst", Data: "x"}
	start := make(chan struct{})
	results := make(chan int, n)
	for range n {
		go func() {
			<-start
			results <- e.push("orders", m).Status
		}()
	}
	close(start)
	// n-1 contenders must be turned away while the winner is inside the
	// downstream call; only then is the winner let go.
	testenv.Receive(t, entered, "no delivery reached the downstream")
	got := map[int]int{}
	for range n - 1 {
		got[testenv.Receive(t, results, fmt.Sprintf("%d of %d contenders answered while the winner held the lease", len(got), n-1))]++
	}
	release.Now()
	got[testenv.Receive(t, results, "the winner was not answered after its downstream call returned")]++
	if got[http.StatusServiceUnavailable] != n-1 || got[http.StatusNoContent] != 1 {
		t.Fatalf("statuses = %v, want %d x 503 and 1 x 204", got, n-1)
	}
	if calls := e.down.effectCalls.Load(); calls != 1 {
		t.Fatalf("downstream called %d times, want exactly 1", calls)
	}
}

// Deliver the same key with a changed payload: a conflicting record of its
// own, no downstream call, no success ack, the original untouched.
func TestSameKeyChangedPayload(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, routeYAML("orders", "idempotent", "broker", "")+routeYAML("ledgered", "idempotent", "gateway", ""))
	for _, route := range []string{"orders", "ledgered"} {
		t.Run(route, func(t *testing.T) {
			orig := msg{ID: "m-key", Data: `{"amount":10}`}
			wantStatus(t, e.push(route, orig), http.StatusNoContent)
			origID := e.opID(route, orig)
			before := e.waitState(origID, gate.StateAcknowledged)
			calls := e.down.effectCalls.Load()

			changed := msg{ID: "m-key", Data: `{"amount":99}`}
			r := e.push(route, changed)
			if route == "orders" {
				wantStatus(t, r, http.StatusServiceUnavailable) // broker's dead-letter policy takes it
			} else {
				wantStatus(t, r, http.StatusNoContent) // dead-lettered by the gateway, then acked
			}
			if e.down.effectCalls.Load() != calls {
				t.Fatal("a conflicting payload reached the downstream")
			}
			after := e.record(origID)
			if after.Operation.UpdatedAt != before.Operation.UpdatedAt || after.Operation.DeliveryCount != before.Operation.DeliveryCount ||
				after.Operation.Fingerprint != before.Operation.Fingerprint || after.Operation.State != gate.StateAcknowledged {
				t.Fatalf("original changed: before %+v after %+v", before.Operation, after.Operation)
			}
			var list adminapi.OperationList
			e.adminGet("/v1/operations?state=conflicting&route="+route, &list)
			if len(list.Operations) != 1 {
				t.Fatalf("conflicting records = %+v", list.Operations)
			}
			cf := e.record(list.Operations[0].ID)
			if cf.Operation.ConflictOf != origID || cf.Operation.ResultID != "" || cf.Operation.State != gate.StateConflicting || len(cf.Attempts) != 0 {
				t.Fatalf("conflict record = %+v", cf.Operation)
			}
			if route == "ledgered" && len(cf.DeadLetters) != 1 {
				t.Fatalf("gateway policy: dead letters = %+v", cf.DeadLetters)
			}
			// A second copy of the conflicting payload finds the same record.
			e.push(route, changed)
			e.adminGet("/v1/operations?state=conflicting&route="+route, &list)
			if len(list.Operations) != 1 {
				t.Fatalf("conflicting records after redelivery = %d", len(list.Operations))
			}
		})
	}
}

// Downstream 5xx: 503 and a recorded attempt; the next delivery tries again;
// past the limit, terminal_failure with its reason, per dead-letter policy.
// Replaying the terminal item afterwards causes no fresh effect.
func TestDownstreamFailureRetriesThenTerminal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true,
		routeYAML("nackdl", "idempotent", "broker", "    max_attempts: 2\n")+
			routeYAML("gwdl", "idempotent", "gateway", "    max_attempts: 2\n"))
	e.down.set(status(http.StatusServiceUnavailable))
	for _, tc := range []struct {
		route    string
		terminal int
	}{{"nackdl", http.StatusServiceUnavailable}, {"gwdl", http.StatusNoContent}} {
		m := msg{ID: "m-fail-" + tc.route, Data: "x"}
		id := e.opID(tc.route, m)
		before := e.down.effectCalls.Load()
		wantStatus(t, e.push(tc.route, m), http.StatusServiceUnavailable)
		rec := e.record(id)
		if rec.Operation.State != gate.StatePendingEffect || len(rec.Attempts) != 1 ||
			rec.Attempts[0].Outcome != gate.OutcomeRetryable || rec.Attempts[0].StatusCode != 503 {
			t.Fatalf("%s after first failure: %+v attempts %+v", tc.route, rec.Operation, rec.Attempts)
		}
		// Second failure reaches the limit of 2.
		wantStatus(t, e.push(tc.route, m), tc.terminal)
		rec = e.record(id)
		if rec.Operation.State != gate.StateTerminalFailure || !strings.Contains(rec.Operation.Reason, "503") {
			t.Fatalf("%s after limit: state %s reason %q", tc.route, rec.Operation.State, rec.Operation.Reason)
		}
		if got := e.down.effectCalls.Load() - before; got != 2 {
			t.Fatalf("%s: %d downstream calls, want 2", tc.route, got)
		}
		if tc.route == "gwdl" && len(rec.DeadLetters) != 1 {
			t.Fatalf("gateway policy without a dead letter: %+v", rec.DeadLetters)
		}
		if tc.route == "nackdl" && len(rec.DeadLetters) != 0 {
			t.Fatalf("broker policy wrote a dead letter: %+v", rec.DeadLetters)
		}
		// Replay a terminally failed item: same answer, no fresh effect.
		wantStatus(t, e.push(tc.route, m), tc.terminal)
		if got := e.down.effectCalls.Load() - before; got != 2 {
			t.Fatalf("%s: replay of a terminal item reached the downstream", tc.route)
		}
	}
}

// Lose the provider response after the external effect commits.
func TestLostResponseAfterEffect(t *testing.T) {
	t.Parallel()
	t.Run("idempotent retries with the same key inside the window", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, true, routeYAML("orders", "idempotent", "broker", ""))
		e.down.set(dropAfterApply)
		m := msg{ID: "m-lost", Data: "x"}
		wantStatus(t, e.push("orders", m), http.StatusServiceUnavailable)
		id := e.opID("orders", m)
		if rec := e.record(id); rec.Operation.State != gate.StatePendingEffect || rec.Attempts[0].Outcome != gate.OutcomeUnknown {
			t.Fatalf("after lost response: %+v %+v", rec.Operation, rec.Attempts)
		}
		e.down.set(nil)
		wantStatus(t, e.push("orders", m), http.StatusNoContent)
		keys := e.down.Keys()
		if len(keys) != 2 || keys[0] != keys[1] {
			t.Fatalf("retry used keys %v, want the same key twice", keys)
		}
		if e.down.Applied() != 1 {
			t.Fatalf("effect applied %d times", e.down.Applied())
		}
	})
	t.Run("idempotent outside the window becomes indeterminate", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, true, routeYAML("orders", "idempotent", "broker", ""))
		e.down.set(dropAfterApply)
		m := msg{ID: "m-late", Data: "x"}
		wantStatus(t, e.push("orders", m), http.StatusServiceUnavailable)
		e.down.set(nil)
		e.clock.Advance(2 * time.Hour) // the provider has forgotten the key
		wantStatus(t, e.push("orders", m), http.StatusServiceUnavailable)
		rec := e.record(e.opID("orders", m))
		if rec.Operation.State != gate.StateEffectIndeterminate || !strings.Contains(rec.Operation.Reason, "dedupe window") {
			t.Fatalf("state %s reason %q", rec.Operation.State, rec.Operation.Reason)
		}
		if n := e.down.effectCalls.Load(); n != 1 {
			t.Fatalf("downstream called %d times after the window closed", n)
		}
	})
	t.Run("lookup settles by lookup", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, false, routeYAML("pay", "lookup", "broker", ""))
		e.down.set(dropAfterApply)
		m := msg{ID: "m-look", Data: "x"}
		wantStatus(t, e.push("pay", m), http.StatusNoContent)
		rec := e.record(e.opID("pay", m))
		if !rec.Operation.State.Confirmed() || rec.Operation.ResultID != "res-1" || e.down.lookupCalls.Load() != 1 {
			t.Fatalf("state %s result %q lookups %d", rec.Operation.State, rec.Operation.ResultID, e.down.lookupCalls.Load())
		}
		if n := e.down.effectCalls.Load(); n != 1 {
			t.Fatalf("downstream effect called %d times", n)
		}
	})
	t.Run("lookup unavailable becomes indeterminate", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, false, routeYAML("pay", "lookup", "broker", ""))
		e.down.set(dropAfterApply)
		e.down.lookupDown = true
		m := msg{ID: "m-look-down", Data: "x"}
		wantStatus(t, e.push("pay", m), http.StatusServiceUnavailable)
		if rec := e.record(e.opID("pay", m)); rec.Operation.State != gate.StateEffectIndeterminate {
			t.Fatalf("state %s", rec.Operation.State)
		}
	})
	t.Run("unsafe becomes indeterminate and never calls again", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, false, routeYAML("mail", "unsafe", "gateway", ""))
		e.down.set(dropAfterApply)
		m := msg{ID: "m-unsafe", Data: "x"}
		wantStatus(t, e.push("mail", m), http.StatusServiceUnavailable)
		e.down.set(nil)
		for range 3 {
			wantStatus(t, e.push("mail", m), http.StatusServiceUnavailable)
		}
		rec := e.record(e.opID("mail", m))
		if rec.Operation.State != gate.StateEffectIndeterminate || rec.Operation.Lane != "operator" {
			t.Fatalf("state %s lane %q", rec.Operation.State, rec.Operation.Lane)
		}
		if n := e.down.effectCalls.Load(); n != 1 {
			t.Fatalf("unsafe downstream called %d times", n)
		}
		var list adminapi.OperationList
		e.adminGet("/v1/operations?state=effect_indeterminate", &list)
		if len(list.Operations) != 1 || list.Operations[0].ID != rec.Operation.ID {
			t.Fatalf("indeterminate lane = %+v", list.Operations)
		}
	})
}

// Expire the lease while the first worker is still running, and flush Redis:
// the new owner is admitted, the stale owner cannot commit.
func TestStaleOwnerIsFencedAfterRedisFlush(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, routeYAML("orders", "idempotent", "broker", ""))
	entered := make(chan struct{}, 2)
	releaseFirst := testenv.NewRelease(t)
	var first sync.Once
	e.down.set(func(w http.ResponseWriter, r *http.Request, apply func() string) {
		isFirst := false
		first.Do(func() { isFirst = true })
		select {
		case entered <- struct{}{}:
		default: // a call beyond the two expected; the fence checks below catch it
		}
		if isFirst {
			<-releaseFirst.C
		}
		answer(w, apply())
	})
	m := msg{ID: "m-stale", Data: "x"}
	staleDone := make(chan reply, 1)
	go func() { staleDone <- e.push("orders", m) }()
	// The first owner is inside the downstream call, holding fence 1.
	testenv.Receive(t, entered, "the first delivery never reached the downstream")

	// Redis loses everything: the lease and the fencing counter.
	if err := e.rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	// While the first owner may still be inside its bound, a redelivery is
	// held off: Redis lost the lease, but the ledger recorded it.
	held := e.push("orders", m)
	wantStatus(t, held, http.StatusServiceUnavailable)
	if !strings.Contains(held.Body.Reason, "holds the lease") {
		t.Fatalf("redelivery inside the owner's bound: %+v", held.Body)
	}
	// Here the first call outlives that bound (the downstream ignores the
	// deadline), so the redelivery takes over. Its token must beat the
	// ledger's, even though Redis restarted its counter from zero.
	// The gate's clock jumps past the bound; the hold it put on the lease in
	// Redis runs on Redis's own clock, so it is let go by hand.
	e.clock.Advance(gate.OwnerBound(e.routes["orders"], time.Time{}).Sub(time.Time{}) + time.Second)
	if err := e.rdb.Del(context.Background(), "ackgate:{"+e.opID("orders", m)+"}:lease").Err(); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, e.push("orders", m), http.StatusNoContent)
	testenv.Receive(t, entered, "the redelivery was acked without a downstream call")
	id := e.opID("orders", m)
	winner := e.record(id)

	releaseFirst.Now()
	stale := testenv.Receive(t, staleDone, "the stale owner was never answered")
	wantStatus(t, stale, http.StatusServiceUnavailable)
	if !strings.Contains(stale.Body.Reason, "fenced") {
		t.Fatalf("stale owner's answer: %+v", stale.Body)
	}
	after := e.record(id)
	if after.Operation.Fence != winner.Operation.Fence || after.Operation.Fence < 2 || len(after.Events) < len(winner.Events) {
		t.Fatalf("stale owner changed the ledger: fence %d -> %d", winner.Operation.Fence, after.Operation.Fence)
	}
	for _, ev := range after.Events[len(winner.Events):] {
		if ev.Fence < winner.Operation.Fence {
			t.Fatalf("a write with stale fence %d landed after fence %d: %+v", ev.Fence, winner.Operation.Fence, ev)
		}
	}
	// The stale owner's lease loss is kept apart from the effect: its delivery
	// is answered nack, fenced, while the operation is the winner's.
	var d []gate.Delivery
	testenv.Eventually(t, 10*time.Second, func() bool {
		d = e.record(id).Deliveries
		return len(d) == 3 && d[0].Decision == gate.Nack && strings.Contains(d[0].Reason, "fenced") &&
			d[1].Decision == gate.Nack && strings.Contains(d[1].Reason, "holds the lease") && d[2].Decision == gate.Ack && d[2].Fence == after.Operation.Fence
	}, func() string {
		return fmt.Sprintf("deliveries = %+v, want the stale one answered nack (fenced), the held one nack and the winner's ack", d)
	})
	if fences := e.down.Fences(); len(fences) != 2 || fences[0] == fences[1] {
		t.Fatalf("downstream saw fences %v, want two different", fences)
	}
}

// Malformed envelopes, unknown routes and oversized bodies get a bounded 4xx
// and leave nothing in the ledger.
func TestSendMalformedOrUnsupportedMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, routeYAML("orders", "idempotent", "broker", ""))
	big := strings.Repeat("a", 70<<10)
	cases := []struct {
		name   string
		route  string
		body   string
		status int
	}{
		{"not json", "orders", "{nope", 400},
		{"empty", "orders", "", 400},
		{"no message", "orders", `{"subscription":"projects/p/subscriptions/s"}`, 400},
		{"no message id", "orders", `{"message":{"data":"eA=="},"subscription":"projects/p/subscriptions/s"}`, 400},
		{"bad base64", "orders", `{"message":{"data":"***","messageId":"1"},"subscription":"projects/p/subscriptions/s"}`, 400},
		{"no data or attributes", "orders", `{"message":{"messageId":"1"},"subscription":"projects/p/subscriptions/s"}`, 400},
		{"no subscription", "orders", `{"message":{"data":"eA==","messageId":"1"}}`, 400},
		{"wrong types", "orders", `{"message":{"data":5,"messageId":"1"},"subscription":"s"}`, 400},
		{"trailing data", "orders", `{"message":{"data":"eA==","messageId":"1"},"subscription":"s"} {}`, 400},
		{"NUL in the message id", "orders", `{"message":{"data":"eA==","messageId":"1\u0000"},"subscription":"projects/p/subscriptions/s"}`, 400},
		{"NUL in the subscription", "orders", `{"message":{"data":"eA==","messageId":"1"},"subscription":"projects/p/subscriptions/s\u0000"}`, 400},
		{"oversized", "orders", `{"message":{"data":"` + big + `","messageId":"1"},"subscription":"s"}`, 413},
		{"unknown route", "nope", string(envelope(msg{ID: "1", Data: "x"})), 404},
	}
	for _, tc := range cases {
		r := e.pushRaw(tc.route, []byte(tc.body))
		if r.Status != tc.status {
			t.Errorf("%s: status %d (%s), want %d", tc.name, r.Status, r.Raw, tc.status)
			continue
		}
		if r.Body.Reason == "" || len(r.Body.Reason) > 300 || r.Body.Decision == gate.Ack {
			t.Errorf("%s: answer %+v", tc.name, r.Body)
		}
	}
	ops, _, err := e.ledger.List(context.Background(), adminapi.ListFilter{})
	if err != nil || len(ops) != 0 {
		t.Fatalf("bad input reached the ledger: %v %+v", err, ops)
	}
	if e.down.effectCalls.Load() != 0 {
		t.Fatal("bad input reached the downstream")
	}
}

func TestAdminAPIRequiresTokenAndValidatesQueries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, routeYAML("orders", "idempotent", "broker", ""))
	resp, err := http.Get(e.admin.URL + "/v1/routes/orders")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %d", resp.StatusCode)
	}
	var rt gate.Route
	if code := e.adminGet("/v1/routes/orders", &rt); code != 200 || rt.Shape != gate.ShapeIdempotent || rt.ContractVersion == "" || rt.DedupeWindow != time.Hour {
		t.Fatalf("route contract: %d %+v", code, rt)
	}
	for path, want := range map[string]int{
		"/v1/operations?state=done":          400,
		"/v1/operations?limit=0":             400,
		"/v1/operations?limit=x":             400,
		"/v1/operations/op_missing":          404,
		"/v1/routes/missing":                 404,
		"/v1/operations?cursor=not-a-cursor": 400,
	} {
		if code := e.adminGet(path, nil); code != want {
			t.Errorf("%s: %d, want %d", path, code, want)
		}
	}
	// The admin API is not reachable on the ingest listener.
	resp, err = http.Get(e.ingest.URL + "/v1/routes/orders")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("admin path on ingest listener: %d", resp.StatusCode)
	}
}

// A message whose route-defined key is missing has no usable identity: it is
// rejected with a bounded reason, and nothing is recorded or executed.
func TestMessageWithoutUsableIdentityIsRejected(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, routeYAML("orders", "idempotent", "broker", "    operation_key:\n      kind: attribute\n      name: order_id\n"))
	r := e.push("orders", msg{ID: "m-nokey", Data: "x", Attrs: map[string]string{"other": "1"}})
	wantStatus(t, r, http.StatusBadRequest)
	if r.Body.Decision != gate.Reject || !strings.Contains(r.Body.Reason, "order_id") {
		t.Fatalf("answer = %+v", r.Body)
	}
	ops, _, err := e.ledger.List(context.Background(), adminapi.ListFilter{})
	if err != nil || len(ops) != 0 || e.down.effectCalls.Load() != 0 {
		t.Fatalf("a message without identity left %d operations, %d downstream calls (%v)", len(ops), e.down.effectCalls.Load(), err)
	}
}

// The metrics token opens GET /metrics and nothing else; the admin token
// opens everything.
func TestMetricsTokenOpensOnlyMetrics(t *testing.T) {
	t.Parallel()
	const metricsToken = "metrics-only-token-0123456789"
	srv := httptest.NewServer(handlers.NewAdmin(handlers.AdminOptions{
		Token: adminToken, MetricsToken: metricsToken,
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ackgate_up 1\n") }),
	}))
	t.Cleanup(srv.Close)
	get := func(path, token string) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		path, token string
		want        int
	}{
		{"/metrics", metricsToken, 200},
		{"/metrics", adminToken, 200},
		{"/metrics", "", 401},
		{"/metrics", metricsToken + "x", 401},
		{"/v1/routes", metricsToken, 401},
		{"/v1/operations", metricsToken, 401},
		{"/v1/routes", adminToken, 200},
	} {
		if got := get(c.path, c.token); got != c.want {
			t.Errorf("GET %s with %q: %d, want %d", c.path, c.token, got, c.want)
		}
	}
}
