package storage_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// t0 is the fixtures' clock. Microsecond-aligned, like everything Postgres
// gives back.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// migratedURL is a fresh, migrated database of this test's own.
func migratedURL(t testing.TB) string {
	t.Helper()
	url := testenv.DatabaseURL(t)
	if err := storage.Migrate(context.Background(), url); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return url
}

func newLedger(t testing.TB) (*storage.Ledger, *pgxpool.Pool) {
	t.Helper()
	pool, err := storage.OpenPool(context.Background(), migratedURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return storage.NewLedger(pool), pool
}

func newOperation(name string) *gate.Operation {
	return &gate.Operation{
		ID:                 "op_" + name,
		ScopeKey:           "acme/orders/message_id:/" + name,
		Tenant:             "acme",
		Route:              "orders",
		KeySource:          gate.KeyMessageID,
		Key:                name,
		Fingerprint:        "v1:fp-" + name,
		FingerprintVersion: 1,
		Shape:              gate.ShapeIdempotent,
		DeadLetterPolicy:   gate.DeadLetterGateway,
		ContractVersion:    "contract-1",
		IdempotencyKey:     "ik_" + name,
		CreatedAt:          t0,
		RetainUntil:        t0.AddDate(10, 0, 0),
	}
}

func steps(t testing.TB, from gate.State, to ...gate.State) []gate.Step {
	t.Helper()
	edges, err := gate.Path(from, to...)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]gate.Step, len(edges))
	for i, e := range edges {
		out[i] = gate.Step{Transition: e, Reason: "to " + string(e.To)}
	}
	return out
}

func delivery(messageID string, n int, at time.Time) *gate.Delivery {
	return &gate.Delivery{
		N:          n,
		Broker:     gate.BrokerPubSub,
		Source:     "projects/p/subscriptions/orders",
		MessageID:  messageID,
		ReceivedAt: at,
		TraceID:    "trace-" + messageID,
	}
}

// creating is the claim of a new operation's first delivery: admitted,
// reserved under fence 1 and with effect attempt 1 recorded before the call.
func creating(t testing.TB, op *gate.Operation, messageID string, at time.Time) *gate.Change {
	t.Helper()
	w := gate.Claiming(nil, op, gate.Lease{Owner: "owner-a", Fence: 1, Expires: at.Add(30 * time.Second)},
		delivery(messageID, 1, at))
	c := gate.StartChange(w, steps(t, "", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect),
		&gate.Attempt{N: 1, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, Fence: 1,
			ContractVersion: op.ContractVersion, StartedAt: at},
		gate.ReasonNewOperation, at)
	acked := gate.RedeliveredAfterAck()
	c.Claim.AckedAnswer = &gate.Answer{Decision: acked.Answer, Reason: acked.Reason, Anomaly: acked.Anomaly}
	return c
}

// createPending creates op in pending_effect with attempt 1 started.
func createPending(t testing.TB, l *storage.Ledger, op *gate.Operation) {
	t.Helper()
	create(t, l, creating(t, op, "m-1", t0))
}

// confirm settles op's attempt 1 as confirmed, under fence 1, answering
// the first delivery ack.
func confirm(t testing.TB, op *gate.Operation, result string, at time.Time) *gate.Change {
	t.Helper()
	fin := &gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: result}
	w := gate.Settling(&gate.Operation{ID: op.ID, State: gate.StatePendingEffect}, 1, fin,
		&gate.Answer{N: 1, Decision: gate.Ack, Reason: "downstream confirmed the effect"},
		gate.LeaseFacts{Deadline: t0.Add(30 * time.Second)})
	return gate.ConfirmChange(w, steps(t, gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending),
		result, "downstream confirmed the effect", at)
}

// acked marks op, confirmed under fence, acknowledged.
func acked(t testing.TB, op *gate.Operation, fence int64, at time.Time) *gate.Change {
	t.Helper()
	return gate.AckedChange(op.ID, gate.StateAckPending, fence, steps(t, gate.StateAckPending, gate.StateAcknowledged), at)
}

// settling is the holder of fence recording how attempt fin ended.
func settling(id string, from gate.State, fence int64, fin *gate.Attempt, n int) gate.Writer {
	var a *gate.Answer
	if n > 0 {
		a = &gate.Answer{N: n, Decision: gate.Nack, Reason: "settled"}
	}
	return gate.Settling(&gate.Operation{ID: id, State: from}, fence, fin, a, gate.LeaseFacts{Deadline: t0.Add(time.Hour)})
}

func mustGet(t testing.TB, l *storage.Ledger, id string) *adminapi.Record {
	t.Helper()
	rec, err := l.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return rec
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// sqlState returns the SQLSTATE in err's chain, "" when there is none.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// claiming is delivery d taking operation id, found in from, under fence:
// the first write of a later delivery.
func claiming(id string, from gate.State, fence int64, owner string, at time.Time, d *gate.Delivery) gate.Writer {
	return gate.Claiming(&gate.Operation{ID: id, State: from}, nil,
		gate.Lease{Owner: owner, Fence: fence, Expires: at.Add(30 * time.Second)}, d)
}

// creatingTerminal is the claim of a first delivery that ends its new
// operation at once, dead-lettered when dl is set.
func creatingTerminal(t testing.TB, op *gate.Operation, messageID string, at time.Time, dl *gate.DeadLetter) *gate.Change {
	t.Helper()
	w := gate.Claiming(nil, op, gate.Lease{Owner: "owner-a", Fence: 1, Expires: at.Add(30 * time.Second)},
		delivery(messageID, 1, at))
	return gate.TerminalChange(w, steps(t, "", gate.StateReceived, gate.StateTerminalFailure), dl, "refused: "+op.ID, at)
}

// create commits c, a creating claim, and fails unless it created its
// operation and, as gate.Ledger.Claim says, returned none.
func create(t testing.TB, l *storage.Ledger, c *gate.Change) {
	t.Helper()
	got, created, err := l.Claim(context.Background(), c)
	if err != nil || !created || got != nil {
		t.Fatalf("create %s: %+v, created %v, %v; want created with no operation returned", c.OperationID, got, created, err)
	}
}

// redeliver records a further delivery of op, as its claim finds it, and
// returns the delivery as the ledger numbered it.
func redeliver(t testing.TB, l *storage.Ledger, op *gate.Operation, messageID string, at time.Time) *gate.Delivery {
	t.Helper()
	got, created, err := l.Claim(context.Background(), creating(t, op, messageID, at))
	if err != nil || created {
		t.Fatalf("redeliver %s: created %v, %v", op.ID, created, err)
	}
	d := delivery(messageID, got.DeliveryCount, at)
	d.OperationID = op.ID
	return d
}

func mustFind(t testing.TB, l *storage.Ledger, id string) *gate.Operation {
	t.Helper()
	op, _, err := l.FindByID(context.Background(), id)
	if err != nil {
		t.Fatalf("find %s: %v", id, err)
	}
	return op
}

// countRows runs a query that counts something.
func countRows(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}
