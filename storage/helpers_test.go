package storage_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
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
func migratedURL(t *testing.T) string {
	t.Helper()
	url := testenv.DatabaseURL(t)
	if err := storage.Migrate(context.Background(), url); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return url
}

func newLedger(t *testing.T) (*storage.Ledger, *pgxpool.Pool) {
	t.Helper()
	pool, err := storage.OpenPool(context.Background(), migratedURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return storage.NewLedger(pool), pool
}

// writeCounter counts the writes a pool makes to the network. pgx writes once
// per round trip (it sends a whole message sequence, then waits), so the count
// is the number of round trips.
type writeCounter struct{ n atomic.Int64 }

type countingConn struct {
	net.Conn
	w *writeCounter
}

func (c countingConn) Write(p []byte) (int, error) {
	c.w.n.Add(1)
	return c.Conn.Write(p)
}

// newCountingLedger is a ledger on a single connection whose round trips are
// counted, so a test can prove what a call costs.
func newCountingLedger(t *testing.T) (*storage.Ledger, *writeCounter) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(migratedURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = 1, 0
	// The pool pings a connection idle for over a second before handing it
	// out; on a slow machine that would add a round trip the ledger did not make.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	w := &writeCounter{}
	var d net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: conn, w: w}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return storage.NewLedger(pool), w
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

func steps(t *testing.T, from gate.State, to ...gate.State) []gate.Step {
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

func delivery(messageID string, at time.Time) *gate.Delivery {
	return &gate.Delivery{
		Broker:     gate.BrokerPubSub,
		Source:     "projects/p/subscriptions/orders",
		MessageID:  messageID,
		ReceivedAt: at,
		Decision:   gate.Nack,
	}
}

// createChange is the first commit of a new operation: admitted, reserved
// under fence 1 and with effect attempt 1 recorded before the call.
func createChange(t *testing.T, l *storage.Ledger, op *gate.Operation) error {
	t.Helper()
	w := gate.Claiming(nil, op, gate.Lease{Owner: "owner-a", Fence: 1, Expires: t0.Add(30 * time.Second)},
		delivery("m-1", t0), "trace-1")
	return l.Write(context.Background(), gate.StartChange(w,
		steps(t, "", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect),
		&gate.Attempt{N: 1, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, Fence: 1, StartedAt: t0},
		"new operation", t0))
}

// claiming is a delivery of owner taking operation id, now in from, under
// fence, as the gate's claims do.
func claiming(id string, from gate.State, fence int64, owner string, deadline time.Time, d *gate.Delivery) gate.Writer {
	return gate.Claiming(&gate.Operation{ID: id, State: from}, nil,
		gate.Lease{Owner: owner, Fence: fence, Expires: deadline}, d, "")
}

// settling is the holder of fence recording how attempt fin ended.
func settling(id string, from gate.State, fence int64, fin *gate.Attempt, extensions int) gate.Writer {
	return gate.Settling(&gate.Operation{ID: id, State: from}, fence, fin, nil, gate.LeaseFacts{Extensions: extensions, Deadline: t0.Add(time.Hour)})
}

func createPending(t *testing.T, l *storage.Ledger, op *gate.Operation) {
	t.Helper()
	if err := createChange(t, l, op); err != nil {
		t.Fatalf("create %s: %v", op.ID, err)
	}
}

func mustFind(t *testing.T, l *storage.Ledger, scopeKey string) *gate.Operation {
	t.Helper()
	op, err := l.Find(context.Background(), scopeKey)
	if err != nil {
		t.Fatalf("find %s: %v", scopeKey, err)
	}
	return op
}

func mustGet(t *testing.T, l *storage.Ledger, id string) *adminapi.Record {
	t.Helper()
	rec, err := l.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return rec
}

// sqlState returns the SQLSTATE in err's chain, "" when there is none.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
