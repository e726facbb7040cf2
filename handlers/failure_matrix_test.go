package handlers_test

// The failure-shaped test matrix: one test per row of the design note, named
// after it, against real Postgres, a private Redis and a real downstream with
// injected faults. Rows covered elsewhere in this package:
//   - lose the provider response after the effect: TestLostResponseAfterEffect
//   - expire the lease while the first worker runs: TestStaleOwnerIsFencedAfterRedisFlush
//   - same key, changed payload: TestSameKeyChangedPayload
//   - malformed or unsupported messages: TestSendMalformedOrUnsupportedMessages
//   - replay a terminally failed item: TestDownstreamFailureRetriesThenTerminal
//   - redeliver after the ack: TestRedeliverAfterSuccessfulAcknowledgment
// The outbox row belongs to handoff routes, which this gateway does not have yet.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
	// The dead worker held a real lease, which lapses on its own.
	lease, err := storage.NewReservations(e.rdb).Acquire(context.Background(), id.OperationID, "dead-worker", 50*time.Millisecond, 0)
	if err != nil || lease.Fence != 1 {
		t.Fatalf("the dead worker's lease: %+v, %v", lease, err)
	}
	w := gate.Claiming(nil, op, lease,
		&gate.Delivery{OperationID: op.ID, Broker: gate.BrokerPubSub, Source: "s", MessageID: m.ID, ReceivedAt: now}, "")
	err = e.ledger.Write(context.Background(), gate.StartChange(w, steps,
		&gate.Attempt{N: 1, Kind: gate.AttemptEffect, IdempotencyKey: id.IdempotencyKey, Fence: 1, StartedAt: now},
		"dead worker", now))
	if err != nil {
		t.Fatalf("create orphaned intent: %v", err)
	}
	// The worker is dead once its lease has lapsed.
	deadline := time.Now().Add(10 * time.Second)
	for e.rdb.Exists(context.Background(), "ackgate:{"+id.OperationID+"}:lease").Val() != 0 {
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
