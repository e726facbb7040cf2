package storage_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/storage"
)

// The steps whose transaction holds more than one named change: a local
// route's statement with the changes that record it, and a handoff of an
// existing operation with its outbox entry.

// localLedger is a ledger whose database also holds a local route's table:
// its rows record the transaction that wrote them (txid_current), so a
// test can tell which transaction wrote what.
func localLedger(t *testing.T) (*storage.Ledger, *pgxpool.Pool) {
	t.Helper()
	l, pool := newLedger(t)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE local_orders (
		id bigserial PRIMARY KEY, idem text UNIQUE NOT NULL, op text NOT NULL, body jsonb NOT NULL,
		xact bigint NOT NULL DEFAULT txid_current(),
		CONSTRAINT positive_total CHECK ((body->>'total')::numeric > 0))`); err != nil {
		t.Fatal(err)
	}
	return l, pool
}

func localRoute() *gate.Route {
	return &gate.Route{Name: "orders", Shape: gate.ShapeLocal, Local: &gate.LocalSpec{
		SQL:     `INSERT INTO local_orders (idem, op, body) VALUES ($1, $2, $3::jsonb) RETURNING id`,
		Params:  []gate.LocalParam{{Kind: gate.ParamIdempotencyKey}, {Kind: gate.ParamOperationID}, {Kind: gate.ParamDataJSON}},
		Timeout: 2 * time.Second}}
}

func localOperation(name string) *gate.Operation {
	op := newOperation(name)
	op.Shape = gate.ShapeLocal
	return op
}

func localRequest(route *gate.Route, op *gate.Operation, fence int64, data string) *gate.EffectRequest {
	return &gate.EffectRequest{Route: route, OperationID: op.ID, IdempotencyKey: op.IdempotencyKey, Fence: fence,
		Message: &gate.Message{Broker: gate.BrokerPubSub, Source: "projects/p/subscriptions/s", MessageID: "m-1",
			Data: []byte(data)}}
}

// settleLocal is the change the gate makes of the statement's result for
// attempt n under fence, answering delivery answer: the evidence, a
// terminal end (dead-lettered), or an attempt that leaves it open.
func settleLocal(t *testing.T, op *gate.Operation, fence int64, n, answer int, er gate.EffectResult) *gate.Change {
	t.Helper()
	done := t0.Add(time.Second)
	fin := &gate.Attempt{N: n, Outcome: er.Outcome, StatusCode: er.StatusCode, ResultID: er.ResultID, Reason: er.Reason, FinishedAt: &done}
	w := gate.Settling(&gate.Operation{ID: op.ID, State: gate.StatePendingEffect}, fence, fin,
		&gate.Answer{N: answer, Decision: gate.Ack, Reason: string(er.Outcome)}, gate.LeaseFacts{Deadline: done})
	switch er.Outcome {
	case gate.OutcomeConfirmed:
		return gate.ConfirmChange(w, steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending),
			er.ResultID, "the statement committed", done)
	case gate.OutcomeTerminal:
		return gate.TerminalChange(w, steps(t, gate.StatePendingEffect, gate.StateTerminalFailure),
			&gate.DeadLetter{Reason: er.Reason}, er.Reason, done)
	}
	return gate.RetryLaterChange(w, er.Reason, done)
}

// apply runs req's statement for op's attempt n (recorded by start, or
// already by op's creation when start is nil) and returns what reached
// the settlement.
func apply(t *testing.T, l *storage.Ledger, start *gate.Change, req *gate.EffectRequest, op *gate.Operation, n, answer int) (gate.EffectResult, error) {
	t.Helper()
	var got gate.EffectResult
	err := l.Apply(context.Background(), start, req, func(er gate.EffectResult) (*gate.Change, error) {
		got = er
		return settleLocal(t, op, req.Fence, n, answer, er), nil
	})
	return got, err
}

// sameTransaction says whether the local row of op was written by the
// transaction that last wrote op's row, and by no other than the one that
// wrote the ledger rows the query names.
func sameTransaction(t *testing.T, pool *pgxpool.Pool, op string, ledgerRows string) bool {
	t.Helper()
	var same bool
	err := pool.QueryRow(context.Background(), `SELECT l.xact % 4294967296 = o.xmin::text::bigint
		AND NOT EXISTS (SELECT 1 FROM (`+ledgerRows+`) r(xmin) WHERE r.xmin::text::bigint <> o.xmin::text::bigint)
		FROM local_orders l, operations o WHERE l.op = $1 AND o.id = $1`, op).Scan(&same)
	if err != nil {
		t.Fatal(err)
	}
	return same
}

// A local route's statement commits in the transaction that records its
// evidence: the row it wrote is the evidence's result id, and both were
// written by one transaction.
func TestLocalStatementCommitsWithItsEvidence(t *testing.T) {
	t.Parallel()
	l, pool := localLedger(t)
	ctx := context.Background()
	op := localOperation("local-ok")
	createPending(t, l, op)
	er, err := apply(t, l, nil, localRequest(localRoute(), op, 1, `{"total": 12}`), op, 1, 1)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	var rowID string
	if err := pool.QueryRow(ctx, `SELECT id::text FROM local_orders WHERE op = $1 AND idem = $2`, op.ID, op.IdempotencyKey).Scan(&rowID); err != nil {
		t.Fatal(err)
	}
	rec := mustGet(t, l, op.ID)
	if er.Outcome != gate.OutcomeConfirmed || er.ResultID != rowID || rec.State != gate.StateAckPending || rec.ResultID != rowID ||
		len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != gate.OutcomeConfirmed || rec.Attempts[0].ResultID != rowID ||
		rec.Deliveries[0].Decision != gate.Ack {
		t.Fatalf("result %+v; record %+v, attempts %+v, row %s", er, rec.Operation, rec.Attempts, rowID)
	}
	if !sameTransaction(t, pool, op.ID, `SELECT xmin FROM operations WHERE id = '`+op.ID+`'`) {
		t.Fatal("the statement and its evidence were written by different transactions")
	}
	must(t, l.Write(ctx, acked(t, op, 1, t0.Add(2*time.Second))))
	if n := countRows(t, pool, `SELECT count(*) FROM local_orders`); n != 1 {
		t.Fatalf("%d rows", n)
	}
}

// A statement that fails is rolled back on its own; its failure is the
// attempt's outcome, recorded, and none of its effect is. What a retry may
// cure leaves the operation open; what it cannot ends it.
func TestLocalStatementFailuresAreRecordedWithoutTheirEffect(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		route   func(*gate.Route)
		data    string
		outcome gate.Outcome
		state   gate.State
		code    string
	}{
		{"refused by the schema: terminal", nil, `{"total": -5}`, gate.OutcomeTerminal, gate.StateTerminalFailure, "23514"},
		{"past its timeout: retried later", func(r *gate.Route) {
			r.Local.SQL, r.Local.Params, r.Local.Timeout = `SELECT pg_sleep(5)::text || $1`, r.Local.Params[:1], 50*time.Millisecond
		}, `{"total": 1}`, gate.OutcomeRetryable, gate.StatePendingEffect, "57014"},
		// A role without the privilege is the route's fault, not the
		// message's: TestLocalConfigFaultIsANackNeverTerminal.
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			l, pool := localLedger(t)
			op := localOperation("local-failed")
			createPending(t, l, op)
			route := localRoute()
			if c.route != nil {
				c.route(route)
			}
			er, err := apply(t, l, nil, localRequest(route, op, 1, c.data), op, 1, 1)
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			rec := mustGet(t, l, op.ID)
			a := rec.Attempts[0]
			if er.Outcome != c.outcome || rec.State != c.state || rec.ResultID != "" || a.Outcome != c.outcome ||
				!strings.Contains(a.Reason, c.code) || strings.Contains(a.Reason, "-5") || a.FinishedAt == nil {
				t.Fatalf("result %+v; record %+v, attempt %+v", er, rec.Operation, a)
			}
			if n := countRows(t, pool, `SELECT count(*) FROM local_orders`); n != 0 {
				t.Fatalf("%d rows of a failed statement", n)
			}
			if c.state == gate.StateTerminalFailure && (len(rec.DeadLetters) != 1 || !strings.Contains(rec.DeadLetters[0].Reason, c.code)) {
				t.Fatalf("dead letters %+v", rec.DeadLetters)
			}
		})
	}
}

// A transaction that fails at its commit takes the statement's row and the
// evidence with it, and a takeover's claim too: nothing of the attempt is
// left but what was committed before it. The next try runs it once.
func TestLocalCommitFailureLeavesNeitherEffectNorRecord(t *testing.T) {
	t.Parallel()
	l, pool := localLedger(t)
	ctx := context.Background()
	for _, sql := range []string{
		`CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN RAISE EXCEPTION 'refused at commit' USING ERRCODE = 'XX001'; END $$`,
		`CREATE CONSTRAINT TRIGGER local_orders_commit AFTER INSERT ON local_orders
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_at_commit()`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	op := localOperation("local-commit")
	createPending(t, l, op)
	route := localRoute()
	unchanged := func(step string, deliveries int) {
		t.Helper()
		rec := mustGet(t, l, op.ID)
		if rec.State != gate.StatePendingEffect || rec.Fence != 1 || rec.Owner != "owner-a" || rec.AttemptCount != 1 ||
			rec.Attempts[0].FinishedAt != nil || rec.Reason != gate.ReasonNewOperation || len(rec.Events) != 3 ||
			rec.Deliveries[0].Decision != "" || len(rec.Deliveries) != deliveries || rec.Deliveries[deliveries-1].Fence > 1 {
			t.Fatalf("%s: a failed commit left %+v, deliveries %+v, attempts %+v, events %d", step, rec.Operation, rec.Deliveries,
				rec.Attempts, len(rec.Events))
		}
		if n := countRows(t, pool, `SELECT (SELECT count(*) FROM local_orders) + (SELECT count(*) FROM transitions)
			+ (SELECT count(*) FROM attempts) + (SELECT count(*) FROM dead_letters)`); n != 0 {
			t.Fatalf("%s: a failed commit left %d rows", step, n)
		}
	}
	if _, err := apply(t, l, nil, localRequest(route, op, 1, `{"total": 7}`), op, 1, 1); err == nil {
		t.Fatal("Apply committed past a refusing commit")
	}
	unchanged("the creating delivery's Apply", 1)

	// A redelivery takes the operation over, with its own attempt: the
	// claim goes with the statement.
	takeover := func(fence int64) (*gate.Change, int) {
		d := redeliver(t, l, op, "m-2", t0.Add(time.Minute))
		return gate.StartChange(claiming(op.ID, gate.StatePendingEffect, fence, "owner-b", t0.Add(time.Minute), d),
			steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StatePendingEffect),
			&gate.Attempt{N: 2, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, Fence: fence, StartedAt: t0.Add(time.Minute)},
			"retry", t0.Add(time.Minute)), d.N
	}
	start, n := takeover(2)
	if _, err := apply(t, l, start, localRequest(route, op, 2, `{"total": 7}`), op, 2, n); err == nil {
		t.Fatal("a takeover's Apply committed past a refusing commit")
	}
	unchanged("a takeover's Apply", 2)

	if _, err := pool.Exec(ctx, `DROP TRIGGER local_orders_commit ON local_orders`); err != nil {
		t.Fatal(err)
	}
	start, n = takeover(2)
	if _, err := apply(t, l, start, localRequest(route, op, 2, `{"total": 7}`), op, 2, n); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if got := mustFind(t, l, op.ID); got.State != gate.StateAckPending || got.Fence != 2 || got.AttemptCount != 2 || got.LastAttempt.N != 2 {
		t.Fatalf("after the retry: %+v", got)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM local_orders`); n != 1 {
		t.Fatalf("%d rows", n)
	}
}

// A later delivery's claim, the statement and the settlement are one
// transaction: every ledger row the claim and the settlement wrote (the
// row, the log, the attempt, the claiming delivery's mark) was written by
// the transaction that wrote the statement's row.
func TestLocalTakeoverCommitsClaimStatementAndSettlementTogether(t *testing.T) {
	t.Parallel()
	l, pool := localLedger(t)
	ctx := context.Background()
	op := localOperation("local-takeover")
	createPending(t, l, op)
	must(t, l.Write(ctx, gate.RetryLaterChange(settling(op.ID, gate.StatePendingEffect, 1,
		&gate.Attempt{N: 1, Outcome: gate.OutcomeRetryable, Reason: "busy"}, 1), "busy", t0)))
	at := t0.Add(time.Minute)
	d := redeliver(t, l, op, "m-2", at)
	start := gate.StartChange(claiming(op.ID, gate.StatePendingEffect, 2, "owner-b", at, d),
		steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StatePendingEffect),
		&gate.Attempt{N: 2, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, Fence: 2, StartedAt: at}, "retry", at)
	er, err := apply(t, l, start, localRequest(localRoute(), op, 2, `{"total": 9}`), op, 2, d.N)
	if err != nil || er.Outcome != gate.OutcomeConfirmed {
		t.Fatalf("Apply: %+v, %v", er, err)
	}
	rec := mustGet(t, l, op.ID)
	if rec.State != gate.StateAckPending || rec.Fence != 2 || rec.Owner != "owner-b" || rec.ResultID != er.ResultID ||
		len(rec.Attempts) != 2 || rec.Attempts[1].Fence != 2 || rec.Attempts[1].ResultID != er.ResultID ||
		rec.Deliveries[1].Fence != 2 || rec.Deliveries[1].Decision != gate.Ack || len(rec.Events) != 7 {
		t.Fatalf("record %+v, attempts %+v, deliveries %+v, %d events", rec.Operation, rec.Attempts, rec.Deliveries, len(rec.Events))
	}
	if !sameTransaction(t, pool, op.ID, `SELECT xmin FROM transitions WHERE operation_id = '`+op.ID+`'
		UNION ALL SELECT xmin FROM attempts WHERE operation_id = '`+op.ID+`'
		UNION ALL SELECT xmin FROM deliveries WHERE operation_id = '`+op.ID+`'`) {
		t.Fatal("the claim, the statement and the settlement were written by different transactions")
	}
}

// A handoff that takes an existing operation commits its outbox entry with
// the change, or neither: a refused change writes no entry, and an entry
// the outbox refuses takes the change back.
func TestHandoffOfAnExistingOperationCommitsItsOutboxEntry(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	// A handoff operation ended terminal at once (its message was past the
	// evidence horizon), and an operator replayed it.
	op := handoffOp("replayed")
	create(t, l, creatingTerminal(t, op, "m-1", t0, nil))
	at := t0.Add(time.Hour)
	iv := &gate.Intervention{Resolution: gate.Resolution{Kind: gate.ResolveReplay, Reason: "checked", Actor: "alice"},
		From: gate.StateTerminalFailure, To: gate.StatePendingEffect, Fence: 2, At: at}
	must(t, l.Write(ctx, gate.ResolveChange(gate.Intervening(&gate.Operation{ID: op.ID, State: gate.StateTerminalFailure},
		gate.Lease{Owner: "alice", Fence: 2}), steps(t, gate.StateTerminalFailure, gate.StatePendingEffect), iv, 1, "", nil,
		"operator replay", at)))

	// The redelivery hands it off.
	d := redeliver(t, l, op, "m-1", at)
	handoff := func(fence int64, m *gate.Message) *gate.Change {
		e := &gate.OutboxEntry{OperationID: op.ID, Route: op.Route, PublicationID: op.IdempotencyKey, Message: m,
			CreatedAt: at, NextAttemptAt: at}
		return gate.HandoffChange(claiming(op.ID, gate.StatePendingEffect, fence, "owner-b", at, d),
			steps(t, gate.StatePendingEffect, gate.StateReserved, gate.StatePendingEffect), e, "handed off", at)
	}
	untouched := func(step string) {
		t.Helper()
		got := mustFind(t, l, op.ID)
		if got.Fence != 2 || got.HandedOffAt != nil || got.Owner != "alice" {
			t.Fatalf("%s: the change committed without its entry: %+v", step, got)
		}
		if n := countRows(t, pool, `SELECT count(*) FROM outbox`); n != 0 {
			t.Fatalf("%s: %d outbox entries", step, n)
		}
	}
	if err := l.Write(ctx, handoff(2, handedOffMessage("m-1"))); !errors.Is(err, gate.ErrFenced) {
		t.Fatalf("a handoff under the recorded fence: %v, want ErrFenced", err)
	}
	untouched("a fenced handoff")
	// jsonb holds no NUL character: the outbox refuses the entry.
	bad := handedOffMessage("m-1")
	bad.Attributes = map[string]string{"region": "e\x00u"}
	if err := l.Write(ctx, handoff(3, bad)); err == nil {
		t.Fatal("a handoff whose entry the outbox refused committed")
	}
	untouched("a refused entry")

	must(t, l.Write(ctx, handoff(3, handedOffMessage("m-1"))))
	got := mustFind(t, l, op.ID)
	if got.Fence != 3 || got.Owner != "owner-b" || got.HandedOffAt == nil || !got.HandedOffAt.Equal(at) || got.State != gate.StatePendingEffect {
		t.Fatalf("after the handoff: %+v", got)
	}
	var same bool
	if err := pool.QueryRow(ctx, `SELECT e.xmin::text = o.xmin::text FROM outbox e JOIN operations o ON o.id = e.operation_id
		WHERE o.id = $1`, op.ID).Scan(&same); err != nil || !same {
		t.Fatalf("the entry and the change were written by different transactions (%v)", err)
	}
	entries, err := l.ClaimOutbox(ctx, []string{"orders"}, 10, time.Minute)
	if err != nil || len(entries) != 1 || entries[0].PublicationID != op.IdempotencyKey || string(entries[0].Message.Data) != `{"n":1}` {
		t.Fatalf("the relay's claim: %+v, %v", entries, err)
	}
}
