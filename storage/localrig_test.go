package storage_test

import (
	"context"
	"fmt"

	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/gate/gatetest"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// The local routes' start-up check and run-time faults exercised through
// the gate as production runs it, on the real ledger and reservation store,
// with only the HTTP downstream faked.

type shapeRig struct {
	t      *testing.T
	gate   *gate.Gate
	ledger *storage.Ledger
	pool   *pgxpool.Pool
	fx     *gatetest.Effects
	route  *gate.Route
}

func newShapeRig(t *testing.T, shape gate.Shape) *shapeRig {
	t.Helper()
	l, pool := newLedger(t)
	rdb := redis.NewClient(&redis.Options{Addr: testenv.Redis(t)})
	t.Cleanup(func() { rdb.Close() })
	fx := &gatetest.Effects{Dedupe: true}
	r := &shapeRig{t: t, ledger: l, pool: pool, fx: fx}
	r.route = &gate.Route{
		Name: "orders", Tenant: "t1", Broker: gate.BrokerPubSub, Shape: shape,
		Key: gate.KeySource{Kind: gate.KeyMessageID}, Fingerprint: gate.FingerprintSpec{Version: 1, Data: true},
		Effect: gate.EffectSpec{Timeout: 5 * time.Second}, MaxAttempts: 3, DeadLetter: gate.DeadLetterBroker,
		AckDeadline: 10 * time.Second, Retention: 8 * 24 * time.Hour, ContractVersion: "v1",
	}
	r.gate = &gate.Gate{Ledger: l, Reservations: storage.NewReservations(rdb), Effects: fx, Local: l,
		Owner: "gw-test", Now: time.Now, NewToken: func() string { return fmt.Sprint(tokens.Add(1)) }}
	return r
}

func (r *shapeRig) push(id, data string, attrs map[string]string) *gate.Result {
	r.t.Helper()
	m := &gate.Message{Broker: gate.BrokerPubSub, Source: "projects/p/subscriptions/s", MessageID: id,
		Data: []byte(data), Attributes: attrs, PublishTime: time.Now().Add(-time.Second)}
	res, err := r.gate.Deliver(context.Background(), r.route, m)
	if err != nil {
		r.t.Logf("deliver %s: %v", id, err)
	}
	res.Finish(context.Background(), nil, true)
	return res
}

func (r *shapeRig) exec(sql string, args ...any) {
	r.t.Helper()
	if _, err := r.pool.Exec(context.Background(), sql, args...); err != nil {
		r.t.Fatalf("%s: %v", sql, err)
	}
}

func (r *shapeRig) count(sql string, args ...any) int {
	r.t.Helper()
	var n int
	if err := r.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		r.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func localRig(t *testing.T) *shapeRig {
	r := newShapeRig(t, gate.ShapeLocal)
	r.exec(`CREATE TABLE local_orders (id bigserial PRIMARY KEY, idem text UNIQUE NOT NULL, op text NOT NULL,
		body jsonb NOT NULL, CHECK ((body->>'total')::numeric > 0))`)
	r.route.Local = &gate.LocalSpec{
		SQL:     `INSERT INTO local_orders (idem, op, body) VALUES ($1, $2, $3::jsonb) RETURNING id`,
		Params:  []gate.LocalParam{{Kind: gate.ParamIdempotencyKey}, {Kind: gate.ParamOperationID}, {Kind: gate.ParamDataJSON}},
		Timeout: 2 * time.Second,
	}
	return r
}
