package handlers_test

// The failure-shaped test matrix: one test per row of the design note, named
// after it, against real Postgres, a private Redis and a real downstream with
// injected faults. Rows covered elsewhere in this package:
//   - lose the provider response after the effect: TestLostResponseAfterEffect
//   - expire the lease while the first worker runs: TestStaleOwnerIsFencedAfterRedisFlush
//   - same key, changed payload: TestSameKeyChangedPayload
//   - malformed or unsupported messages: TestSendMalformedOrUnsupportedMessages
//   - replay a terminally failed item (a redelivery without an operator's
//     replay): TestDownstreamFailureRetriesThenTerminal
//   - redeliver after the ack: TestRedeliverAfterSuccessfulAcknowledgment
// The outbox row belongs to handoff routes, which this gateway does not have yet.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
)

// Kill the worker after the local commit but before the ack reaches the
// broker (also: the broker ack fails after effect confirmation). The
// redelivery finds the committed result and acks without another effect.
func TestKillWorkerAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("orders", "unsafe", "broker", ""))
	m := msg{ID: "m-crash", Data: "x"}
	// The gate commits the evidence; the process then dies: no response, no
	// post-ack bookkeeping, the lease never released.
	res, err := e.gate.Deliver(context.Background(), e.routes["orders"],
		&gate.Message{Broker: gate.BrokerPubSub, Source: "projects/p/subscriptions/s", MessageID: m.ID, Data: []byte(m.Data)})
	if err != nil || res.Decision != gate.Ack {
		t.Fatalf("deliver: %+v %v", res, err)
	}
	id := e.opID("orders", m)
	if st := e.record(id).Operation.State; st != gate.StateAckPending {
		t.Fatalf("state after the crash = %s, want ack_pending", st)
	}
	wantStatus(t, e.push("orders", m), http.StatusNoContent)
	if n := e.down.effectCalls.Load(); n != 1 {
		t.Fatalf("downstream called %d times, want 1", n)
	}
	e.waitState(id, gate.StateAcknowledged)
}

// Kill the worker after durable pending intent, before (or during) the
// effect attempt. A later owner resumes: an idempotent effect is retried with
// the same key; an unsafe one cannot be told apart from "sent and lost", so it
// goes to the indeterminate lane instead of being repeated.
func TestKillWorkerAfterPendingIntent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		shape   string
		status  int
		state   gate.State
		applied int
	}{
		{"idempotent", http.StatusNoContent, gate.StateAcknowledged, 1},
		{"unsafe", http.StatusServiceUnavailable, gate.StateEffectIndeterminate, 0},
	} {
		t.Run(tc.shape, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, true, routeYAML("orders", tc.shape, "broker", ""))
			m := msg{ID: "m-orphan", Data: "x"}
			route := e.routes["orders"]
			id, err := gate.Identify(route, &gate.Message{MessageID: m.ID, Data: []byte(m.Data)})
			if err != nil {
				t.Fatal(err)
			}
			leaveOrphanedIntent(t, e, route, id, m)

			wantStatus(t, e.push("orders", m), tc.status)
			rec := e.waitState(id.OperationID, tc.state)
			if e.down.Applied() != tc.applied {
				t.Fatalf("effects applied = %d, want %d", e.down.Applied(), tc.applied)
			}
			if tc.applied == 1 {
				if keys := e.down.Keys(); len(keys) != 1 || keys[0] != id.IdempotencyKey {
					t.Fatalf("resumed with keys %v, want the recorded key %s", keys, id.IdempotencyKey)
				}
				if rec.Operation.Fence <= 1 {
					t.Fatalf("resumed under fence %d, not above the dead owner's", rec.Operation.Fence)
				}
			}
		})
	}
}

// leaveOrphanedIntent writes what a worker that died right after its first
// commit leaves behind: pending_effect with a started attempt and no result.
func leaveOrphanedIntent(t *testing.T, e *env, route *gate.Route, id gate.Identity, m msg) {
	t.Helper()
	now := time.Now()
	path, err := gate.Path("", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect)
	if err != nil {
		t.Fatal(err)
	}
	steps := make([]gate.Step, len(path))
	for i, p := range path {
		steps[i] = gate.Step{Transition: p, Reason: "dead worker"}
	}
	op := &gate.Operation{
		ID: id.OperationID, ScopeKey: id.ScopeKey, Tenant: route.Tenant, Route: route.Name,
		KeySource: route.Key.Kind, Key: id.Key, Fingerprint: id.Fingerprint,
		FingerprintVersion: route.Fingerprint.Version, State: gate.StatePendingEffect, Shape: route.Shape,
		DeadLetterPolicy: route.DeadLetter, ContractVersion: route.ContractVersion,
		IdempotencyKey: id.IdempotencyKey, Fence: 1, Owner: "dead-worker",
		CreatedAt: now, UpdatedAt: now, RetainUntil: now.Add(route.Retention),
	}
	// The dead worker held a real lease, recorded by its claim and taken in
	// Redis, which lapses on its own.
	lease := gate.Lease{Key: id.OperationID, Owner: "dead-worker", Fence: 1, Expires: now.Add(50 * time.Millisecond)}
	w := gate.Claiming(nil, op, lease,
		&gate.Delivery{OperationID: op.ID, N: 1, Broker: gate.BrokerPubSub, Source: "s", MessageID: m.ID, ReceivedAt: now})
	_, created, err := e.ledger.Claim(context.Background(), gate.StartChange(w, steps,
		&gate.Attempt{N: 1, Kind: gate.AttemptEffect, IdempotencyKey: id.IdempotencyKey, Fence: 1, StartedAt: now},
		"dead worker", now))
	if err != nil || !created {
		t.Fatalf("create orphaned intent: created %v, %v", created, err)
	}
	if _, err := storage.NewReservations(e.rdb).Take(context.Background(), lease, 50*time.Millisecond); err != nil {
		t.Fatalf("the dead worker's lease: %v", err)
	}
	// The worker is dead once its lease has lapsed.
	deadline := time.Now().Add(10 * time.Second)
	for e.rdb.Exists(context.Background(), "ackgate:{"+id.OperationID+"}:lease").Val() != 0 || time.Now().Before(lease.Expires) {
		if time.Now().After(deadline) {
			t.Fatal("the dead worker's lease never lapsed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Let the deduplication record expire before a delayed redelivery: a message
// older than the evidence we keep is not treated as new.
func TestDedupeRecordExpiresBeforeDelayedRedelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("orders", "unsafe", "broker", ""))
	old := time.Now().Add(-9 * 24 * time.Hour) // retention defaults to 8 days
	body, _ := json.Marshal(map[string]any{
		"message": map[string]any{"data": base64.StdEncoding.EncodeToString([]byte("x")), "messageId": "m-old",
			"publishTime": old.UTC().Format(time.RFC3339Nano)},
		"subscription": "projects/p/subscriptions/s",
	})
	wantStatus(t, e.pushRaw("orders", body), http.StatusServiceUnavailable)
	rec := e.record(e.opID("orders", msg{ID: "m-old", Data: "x"}))
	if rec.Operation.State != gate.StateTerminalFailure || !strings.Contains(rec.Operation.Reason, "evidence horizon") {
		t.Fatalf("state %s reason %q", rec.Operation.State, rec.Operation.Reason)
	}
	if e.down.effectCalls.Load() != 0 {
		t.Fatal("a message older than the evidence horizon reached the downstream")
	}
}

// Exhaust lease extensions during a slow effect: renewal holds the lease
// while the call runs (a redelivery is turned away), the call is cut before
// the broker deadline, and the unknown result goes to the indeterminate lane.
func TestExhaustLeaseExtensionsDuringSlowEffect(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("slow", "unsafe", "broker", ""))
	r := e.routes["slow"]
	r.AckDeadline = 4 * time.Second
	r.Renewal = gate.Renewal{Interval: 400 * time.Millisecond, MaxExtension: 2 * time.Second}
	r.Effect.Timeout = time.Minute
	entered := make(chan struct{}, 1)
	e.down.set(func(w http.ResponseWriter, req *http.Request, apply func() string) {
		entered <- struct{}{}
		<-req.Context().Done() // never answers: the gateway has to give up
	})
	m := msg{ID: "m-slow", Data: "x"}
	first := make(chan reply, 1)
	go func() { first <- e.push("slow", m) }()
	testenv.Receive(t, entered, "the delivery never reached the downstream")
	// The lease was taken for two renewal intervals (800ms). Wait until it
	// has outlived that, without a clock: renewals come one interval apart, so
	// the third one is at least 1.2s after the lease was taken. Each shows as
	// the key's remaining time going up.
	renewals := leaseRenewals(t, e, 3)
	second := e.push("slow", m)
	wantStatus(t, second, http.StatusServiceUnavailable)
	if second.Body.Reason != "another owner holds the lease" {
		t.Fatalf("redelivery after %d renewals: %+v (the lease was not kept)", renewals, second.Body)
	}
	wantStatus(t, testenv.Receive(t, first, "the slow delivery was never answered"), http.StatusServiceUnavailable)
	rec := e.record(e.opID("slow", m))
	if rec.Operation.State != gate.StateEffectIndeterminate || rec.Operation.LeaseExtensions < 2 {
		t.Fatalf("state %s after %d lease extensions", rec.Operation.State, rec.Operation.LeaseExtensions)
	}
	if rec.Attempts[0].Outcome != gate.OutcomeUnknown {
		t.Fatalf("slow attempt outcome %s, want unknown", rec.Attempts[0].Outcome)
	}
	// The call is cut 3.2s in (the broker's deadline less its margin), but
	// renewals stop earlier, at the cap: max_extension past the first
	// lease's end (taken for two intervals). A renewer that ignored the cap
	// would have kept the lease to the end of the call and past it. The
	// start is read a moment before the lease is taken, hence the slack.
	op := rec.Operation
	if op.LeaseStart == nil || op.LeaseDeadline == nil {
		t.Fatalf("lease start %v, deadline %v: not recorded", op.LeaseStart, op.LeaseDeadline)
	}
	if limit := op.LeaseStart.Add(2*r.Renewal.Interval + r.Renewal.MaxExtension + 100*time.Millisecond); op.LeaseDeadline.After(limit) {
		t.Fatalf("the lease was renewed to %s, past the cap at %s", op.LeaseDeadline.Format(time.RFC3339Nano), limit.Format(time.RFC3339Nano))
	}
}

// Return a successful handler result without durable evidence: a 2xx that
// lacks the result id the contract names is not evidence, and is not acked.
func TestSuccessWithoutDurableEvidenceIsNotAcked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, routeYAML("orders", "idempotent", "broker", ""))
	e.down.set(func(w http.ResponseWriter, _ *http.Request, apply func() string) {
		apply()
		w.WriteHeader(http.StatusCreated) // no X-Result-Id
	})
	m := msg{ID: "m-noevidence", Data: "x"}
	wantStatus(t, e.push("orders", m), http.StatusServiceUnavailable)
	rec := e.record(e.opID("orders", m))
	if rec.Operation.State.Confirmed() || rec.Operation.ResultID != "" || rec.Attempts[0].Outcome != gate.OutcomeUnknown {
		t.Fatalf("a 2xx without evidence was taken as confirmed: %+v %+v", rec.Operation, rec.Attempts)
	}
}

// Make the evidence store unavailable after an effect attempt: no success
// ack, and the unsafe effect is not retried automatically afterwards.
func TestEvidenceStoreUnavailableAfterEffectAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, false, routeYAML("mail", "unsafe", "broker", ""))
	dbName := databaseName(t, e.dbURL)
	admin, err := pgx.Connect(ctx, testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(ctx) })
	ident := pgx.Identifier{dbName}.Sanitize()
	e.down.set(func(w http.ResponseWriter, _ *http.Request, apply func() string) {
		// The ledger goes away while the effect is being applied.
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+ident+" ALLOW_CONNECTIONS false"); err != nil {
			t.Error(err)
		}
		if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", dbName); err != nil {
			t.Error(err)
		}
		answer(w, apply())
	})
	m := msg{ID: "m-dark", Data: "x"}
	r := e.push("mail", m)
	wantStatus(t, r, http.StatusServiceUnavailable)
	if r.Body.Reason != "evidence store unavailable" {
		t.Fatalf("answer while the ledger is down: %+v", r.Body)
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+ident+" ALLOW_CONNECTIONS true"); err != nil {
		t.Fatal(err)
	}
	e.down.set(nil)
	// The owner that could not record its outcome is gone once the lease
	// the ledger records for it has run out.
	e.clock.Advance(e.routes["mail"].AckDeadline + time.Second)
	wantStatus(t, e.push("mail", m), http.StatusServiceUnavailable)
	rec := e.record(e.opID("mail", m))
	if rec.Operation.State != gate.StateEffectIndeterminate {
		t.Fatalf("state %s, want effect_indeterminate", rec.Operation.State)
	}
	if n := e.down.effectCalls.Load(); n != 1 {
		t.Fatalf("downstream called %d times; the unsafe effect was repeated", n)
	}
}

// leaseRenewals waits until the one lease in the test's private Redis has
// been renewed at least want times, watching its remaining time (PTTL) go
// up, and returns how many renewals it saw. Renewals between two looks count
// once, which only makes the wait longer. It fails the test if the lease
// disappears first: a lease that is not renewed expires.
func leaseRenewals(t *testing.T, e *env, want int) int {
	t.Helper()
	ctx := context.Background()
	renewals, last, seen := 0, time.Duration(-1), false
	var problem string
	testenv.Eventually(t, testenv.StepTimeout, func() bool {
		keys, err := e.rdb.Keys(ctx, "ackgate:*:lease").Result()
		if err != nil || len(keys) > 1 {
			problem = fmt.Sprintf("lease keys %v (%v)", keys, err)
			return false
		}
		if len(keys) == 0 {
			if seen {
				t.Fatalf("the lease expired after %d renewals while the downstream call was still running", renewals)
			}
			problem = "no lease in Redis yet"
			return false
		}
		left, err := e.rdb.PTTL(ctx, keys[0]).Result()
		if err != nil || left < 0 {
			problem = fmt.Sprintf("lease %s: PTTL %s (%v)", keys[0], left, err)
			return false
		}
		seen = true
		if last >= 0 && left > last {
			renewals++
		}
		last = left
		return renewals >= want
	}, func() string { return fmt.Sprintf("saw %d lease renewals, want %d; last: %s", renewals, want, problem) })
	return renewals
}

// Replay a terminally failed item: an operator's replay arms the same
// operation, under the same idempotency key, for exactly one new attempt,
// which the next delivery makes however many copies arrive at once; it is
// never a fresh operation. Under dead_letter: gateway the broker was told
// the message is done, so the operator re-publishes it (a new message id,
// the same key attribute); under broker the broker redelivers it. A
// replayed attempt that fails again ends terminally again, and confirmed
// work cannot be replayed.
func TestReplayTerminallyFailedItem(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"gateway", "broker"} {
		t.Run("dead_letter "+policy, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, false, routeYAML("orders", "unsafe", policy,
				"    max_attempts: 2\n    operation_key:\n      kind: attribute\n      name: order_id\n"))
			terminalAnswer := map[string]int{"gateway": http.StatusNoContent, "broker": http.StatusServiceUnavailable}[policy]
			var (
				mu  sync.Mutex
				ops []string // X-Ackgate-Operation of each call after the replay
			)

			// A terminal 4xx, through the push path.
			e.down.set(status(http.StatusUnprocessableEntity))
			m := msg{ID: "m-refused", Data: "x", Attrs: map[string]string{"order_id": "o-1"}}
			// copy is the message as it comes back: re-published with a
			// new id, or redelivered as it was.
			copies := 0
			copyOf := func() msg {
				mu.Lock()
				defer mu.Unlock()
				copies++
				if policy == "gateway" {
					return msg{ID: fmt.Sprintf("m-republished-%d", copies), Data: m.Data, Attrs: m.Attrs}
				}
				return m
			}
			wantStatus(t, e.push("orders", m), terminalAnswer)
			id := e.opID("orders", m)
			first := e.record(id)
			if first.Operation.State != gate.StateTerminalFailure || len(first.Attempts) != 1 {
				t.Fatalf("after a 422: %s with %d attempts", first.Operation.State, len(first.Attempts))
			}
			key := first.Operation.IdempotencyKey
			var list adminapi.DeadLetterList
			e.adminGet("/v1/dead-letters?route=orders", &list)
			if len(list.DeadLetters) != 1 || list.DeadLetters[0].OperationID != id || !list.DeadLetters[0].Replayable ||
				list.DeadLetters[0].DeadLetteredBy != policy {
				t.Fatalf("dead letters: %+v", list)
			}

			a := e.replayOp(id, "the downstream accepts the schema since release 42", "ivy")
			wantAnswer(t, a, http.StatusOK)
			if a.Record.Operation.State != gate.StatePendingEffect || a.Record.Operation.Grant != 2 ||
				len(a.Record.ManualInterventions) != 1 || a.Record.ManualInterventions[0].Kind != gate.ResolveReplay ||
				a.Record.ManualInterventions[0].From != gate.StateTerminalFailure || a.Record.ManualInterventions[0].Actor != "api:ivy" {
				t.Fatalf("after replay: %+v %+v", a.Record.Operation, a.Record.ManualInterventions)
			}
			if !strings.Contains(a.Record.Statement, "Operator api:ivy replayed it") {
				t.Fatalf("statement: %s", a.Record.Statement)
			}
			e.adminGet("/v1/dead-letters?route=orders", &list)
			if len(list.DeadLetters) != 0 {
				t.Fatalf("a replayed operation is still listed as a dead letter: %+v", list)
			}

			// Copies of the message, at once: one new call, same operation
			// and key; every other copy is turned away or acked.
			release := make(chan struct{})
			e.down.set(func(w http.ResponseWriter, r *http.Request, apply func() string) {
				mu.Lock()
				ops = append(ops, r.Header.Get("X-Ackgate-Operation"))
				mu.Unlock()
				<-release
				answer(w, apply())
			})
			calls := e.down.effectCalls.Load()
			var wg sync.WaitGroup
			codes := make(chan int, 6)
			for range 6 {
				wg.Go(func() { codes <- e.push("orders", copyOf()).Status })
			}
			waitCalls(t, e, calls+1)
			close(release)
			wg.Wait()
			close(codes)
			for c := range codes {
				if c != http.StatusNoContent && c != http.StatusServiceUnavailable {
					t.Fatalf("a copy was answered %d", c)
				}
			}
			wantStatus(t, e.push("orders", copyOf()), http.StatusNoContent)
			rec := e.waitState(id, gate.StateAcknowledged)
			if n := e.down.effectCalls.Load() - calls; n != 1 || e.down.Applied() != 1 {
				t.Fatalf("%d new calls, %d effects applied after the replay, want 1 and 1", n, e.down.Applied())
			}
			keys := e.down.Keys()
			if len(keys) != 2 || keys[0] != key || keys[1] != key || len(ops) != 1 || ops[0] != id {
				t.Fatalf("calls went out with keys %v for operations %v, want %s for %s", keys, ops, key, id)
			}
			if len(rec.Attempts) != 2 || rec.Attempts[1].IdempotencyKey != key {
				t.Fatalf("attempts %+v", rec.Attempts)
			}
			if all, _, err := e.ledger.List(context.Background(), adminapi.ListFilter{}); err != nil || len(all) != 1 {
				t.Fatalf("%d operations, %v; a replay must not make a fresh one", len(all), err)
			}
			wantLogChained(t, rec)

			// Confirmed work is never replayed.
			e.waitDeliveries(id, 8)
			before := e.snapshot(id)
			wantAnswer(t, e.replayOp(id, "again", "ivy"), http.StatusConflict)
			if e.snapshot(id) != before {
				t.Fatal("a refused replay changed the record")
			}

			// Past the attempt limit: the replayed attempt fails again, and
			// the operation ends terminally again instead of looping.
			e.down.set(status(http.StatusServiceUnavailable))
			m2 := msg{ID: "m-limit", Data: "x", Attrs: map[string]string{"order_id": "o-2"}}
			wantStatus(t, e.push("orders", m2), http.StatusServiceUnavailable)
			wantStatus(t, e.push("orders", m2), terminalAnswer)
			id2 := e.opID("orders", m2)
			if st := e.record(id2).Operation.State; st != gate.StateTerminalFailure {
				t.Fatalf("after the limit: %s", st)
			}
			wantAnswer(t, e.replayOp(id2, "one more try", "ivy"), http.StatusOK)
			calls = e.down.effectCalls.Load()
			wantStatus(t, e.push("orders", m2), terminalAnswer)
			wantStatus(t, e.push("orders", m2), terminalAnswer)
			if n := e.down.effectCalls.Load() - calls; n != 1 {
				t.Fatalf("%d calls after replaying past the limit, want exactly 1", n)
			}
			rec2 := e.record(id2)
			if rec2.Operation.State != gate.StateTerminalFailure || len(rec2.Attempts) != 3 {
				t.Fatalf("after the replayed attempt failed: %s with %d attempts", rec2.Operation.State, len(rec2.Attempts))
			}
			wantLogChained(t, rec2)
		})
	}
}
