package storage_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/gate/gatetest"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// The commit shapes on the real ledger and reservation store: the gate as
// production runs it, with only the HTTP downstream faked.

type shapeRig struct {
	t      *testing.T
	gate   *gate.Gate
	ledger *storage.Ledger
	pool   *pgxpool.Pool
	fx     *gatetest.Effects
	route  *gate.Route
}

var tokens atomic.Int64

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

func TestLocalStatementCommitsWithItsEvidence(t *testing.T) {
	t.Parallel()
	r := localRig(t)
	res := r.push("m-1", `{"total": 12}`, nil)
	if res.Decision != gate.Ack {
		t.Fatalf("%s (%s)", res.Decision, res.Reason)
	}
	rec := mustGet(t, r.ledger, res.OperationID)
	var rowID string
	if err := r.pool.QueryRow(context.Background(), `SELECT id::text FROM local_orders WHERE op = $1`, res.OperationID).Scan(&rowID); err != nil {
		t.Fatal(err)
	}
	if rec.State != gate.StateAcknowledged || rec.ResultID != rowID || len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != gate.OutcomeConfirmed {
		t.Fatalf("record %+v, attempts %+v, row %s", rec.Operation, rec.Attempts, rowID)
	}
	// A redelivery answers from the ledger: the statement never runs again.
	if res := r.push("m-1", `{"total": 12}`, nil); res.Decision != gate.Ack {
		t.Fatalf("redelivery: %s", res.Decision)
	}
	if n := r.count(`SELECT count(*) FROM local_orders`); n != 1 {
		t.Fatalf("%d rows", n)
	}
}

func TestLocalStatementFailuresAreRecordedWithoutTheirEffect(t *testing.T) {
	t.Parallel()
	t.Run("refused by the schema: terminal", func(t *testing.T) {
		t.Parallel()
		r := localRig(t)
		res := r.push("m-1", `{"total": -5}`, nil)
		rec := mustGet(t, r.ledger, res.OperationID)
		if res.Decision != gate.Nack || rec.State != gate.StateTerminalFailure || rec.ResultID != "" ||
			rec.Attempts[0].Outcome != gate.OutcomeTerminal || !strings.Contains(rec.Attempts[0].Reason, "23514") ||
			strings.Contains(rec.Attempts[0].Reason, "-5") {
			t.Fatalf("%s: %+v / %+v", res.Decision, rec.Operation, rec.Attempts)
		}
		if n := r.count(`SELECT count(*) FROM local_orders`); n != 0 {
			t.Fatalf("%d rows", n)
		}
	})
	t.Run("past its timeout: a nack, retried later", func(t *testing.T) {
		t.Parallel()
		r := localRig(t)
		r.route.Local.SQL = `SELECT pg_sleep(5)::text || $1`
		r.route.Local.Params = r.route.Local.Params[:1]
		r.route.Local.Timeout = 50 * time.Millisecond
		res := r.push("m-1", `{"total": 1}`, nil)
		rec := mustGet(t, r.ledger, res.OperationID)
		if res.Decision != gate.Nack || rec.State != gate.StatePendingEffect || rec.Attempts[0].Outcome != gate.OutcomeRetryable ||
			!strings.Contains(rec.Attempts[0].Reason, "57014") {
			t.Fatalf("%s: %+v / %+v", res.Decision, rec.Operation, rec.Attempts)
		}
	})
	t.Run("under a role without the privilege", func(t *testing.T) {
		t.Parallel()
		r := localRig(t)
		// A built-in role the test user is a member of and that may not
		// write the table: the statement runs with its rights, not ours.
		// A missing privilege is the configuration's fault, not the
		// message's: a nack that records nothing (localcheck_test.go).
		r.route.Local.Role = "pg_signal_backend"
		res := r.push("m-1", `{"total": 3}`, nil)
		if res.Decision != gate.Nack {
			t.Fatalf("%s (%s)", res.Decision, res.Reason)
		}
		if n := r.count(`SELECT count(*) FROM local_orders`) + r.count(`SELECT count(*) FROM operations`); n != 0 {
			t.Fatalf("%d rows", n)
		}
	})
}

// A transaction that fails at commit takes the statement's row and the
// evidence with it; the next delivery runs it again, once.
func TestLocalCommitFailureLeavesNeitherEffectNorRecord(t *testing.T) {
	t.Parallel()
	r := localRig(t)
	r.exec(`CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'refused at commit' USING ERRCODE = 'XX001'; END $$`)
	r.exec(`CREATE CONSTRAINT TRIGGER local_orders_commit AFTER INSERT ON local_orders
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_at_commit()`)
	res := r.push("m-1", `{"total": 7}`, nil)
	if res.Decision != gate.Nack {
		t.Fatalf("%s (%s)", res.Decision, res.Reason)
	}
	if n := r.count(`SELECT count(*) FROM operations`) + r.count(`SELECT count(*) FROM local_orders`); n != 0 {
		t.Fatalf("a failed commit left %d rows", n)
	}
	r.exec(`DROP TRIGGER local_orders_commit ON local_orders`)
	if res := r.push("m-1", `{"total": 7}`, nil); res.Decision != gate.Ack {
		t.Fatalf("%s (%s)", res.Decision, res.Reason)
	}
	if n := r.count(`SELECT count(*) FROM local_orders`); n != 1 {
		t.Fatalf("%d rows", n)
	}
}

func TestHandoffCommitsTheOutboxEntryWithTheOperation(t *testing.T) {
	t.Parallel()
	r := newShapeRig(t, gate.ShapeHandoff)
	r.route.DeadLetter, r.route.DedupeWindow, r.route.Private = gate.DeadLetterGateway, time.Hour, []string{"secret"}
	attrs := map[string]string{"secret": "s3cr3t", "region": "eu"}
	res := r.push("m-1", `{"n":1}`, attrs)
	if res.Decision != gate.Ack || r.fx.Calls() != 0 {
		t.Fatalf("%s (%s), %d calls", res.Decision, res.Reason, r.fx.Calls())
	}
	var (
		pub   string
		data  []byte
		names []string
	)
	if err := r.pool.QueryRow(context.Background(), `SELECT publication_id, data, ARRAY(SELECT jsonb_object_keys(attributes))
		FROM outbox WHERE operation_id = $1`, res.OperationID).Scan(&pub, &data, &names); err != nil {
		t.Fatal(err)
	}
	rec := mustGet(t, r.ledger, res.OperationID)
	if pub != rec.IdempotencyKey || string(data) != `{"n":1}` || len(names) != 1 || names[0] != "region" || rec.HandedOffAt == nil ||
		rec.State != gate.StatePendingEffect {
		t.Fatalf("entry %q %q %v, record %+v", pub, data, names, rec.Operation)
	}
	// A redelivery acks from the ledger, with no second entry.
	if res := r.push("m-1", `{"n":1}`, attrs); res.Decision != gate.Ack {
		t.Fatalf("redelivery: %s", res.Decision)
	}
	if n := r.count(`SELECT count(*) FROM outbox`); n != 1 {
		t.Fatalf("%d entries", n)
	}
	// The relay delivers it once, from what the outbox kept.
	e := &gate.OutboxEntry{OperationID: res.OperationID, Route: "orders", PublicationID: pub,
		Message: &gate.Message{Broker: gate.BrokerPubSub, MessageID: "m-1", Data: data, Attributes: map[string]string{"region": "eu"}}}
	out, err := r.gate.Relay(context.Background(), r.route, e)
	if err != nil {
		t.Fatal(err)
	}
	out.Finish(context.Background(), nil, true)
	rec = mustGet(t, r.ledger, res.OperationID)
	if out.Decision != gate.Ack || rec.State != gate.StateAcknowledged || r.fx.Calls() != 1 || rec.DeliveryCount != 2 {
		t.Fatalf("%s: %+v, %d calls", out.Decision, rec.Operation, r.fx.Calls())
	}
}
