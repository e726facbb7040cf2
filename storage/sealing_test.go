package storage_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/gate/gatetest"
	"github.com/ackgate/ackgate/internal/seal"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
)

func keyring(t *testing.T, current string, old ...string) *seal.Keyring {
	t.Helper()
	parse := func(id string) seal.Key {
		k, err := seal.ParseKey(id + ":" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=") // 32 bytes, standard base64
		if err != nil {
			t.Fatal(err)
		}
		if id != "k1" {
			k.Secret[0] ^= byte(len(id)) // another key under another id
		}
		return k
	}
	var olds []seal.Key
	for _, id := range old {
		olds = append(olds, parse(id))
	}
	ring, err := seal.NewKeyring(parse(current), olds...)
	if err != nil {
		t.Fatal(err)
	}
	return ring
}

// A handoff route's private JSON pointers are sealed in the outbox: the
// value is in no row of the ledger while the entry waits, and the relay
// hands the downstream the message's data byte for byte. Data that is not
// JSON is sealed whole. A gateway without the key does not call the
// downstream with what it cannot open, and calls it once the key is back.
func TestOutboxKeepsPrivateValuesSealed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := newLedger(t)
	rdb := redis.NewClient(&redis.Options{Addr: testenv.Redis(t)})
	t.Cleanup(func() { rdb.Close() })
	route := &gate.Route{Name: "payments", Tenant: "t1", Broker: gate.BrokerPubSub, Shape: gate.ShapeHandoff,
		Key: gate.KeySource{Kind: gate.KeyMessageID}, Fingerprint: gate.FingerprintSpec{Version: 1, Data: true},
		Effect: gate.EffectSpec{Timeout: 5 * time.Second}, MaxAttempts: 3, DeadLetter: gate.DeadLetterGateway,
		AckDeadline: 10 * time.Second, Retention: 8 * 24 * time.Hour, ContractVersion: "v1", DedupeWindow: time.Hour,
		Private: []string{"/card/number", "secret"}}
	var bodies [][]byte
	fx := &gatetest.Effects{Dedupe: true, OnCall: func(req *gate.EffectRequest) { bodies = append(bodies, req.Message.Data) }}
	gateWith := func(l *storage.Ledger) *gate.Gate {
		return &gate.Gate{Ledger: l, Reservations: storage.NewReservations(rdb), Effects: fx, Local: l,
			Owner: "gw-test", Now: time.Now, NewToken: func() string { return fmt.Sprint(tokens.Add(1)) }}
	}
	sealed := storage.NewLedger(pool, storage.SealOutbox(keyring(t, "k1")))
	bodiesIn := map[string][]byte{
		"m-json":  []byte(`{"amount": 12,  "card": {"number": "4111111111111111", "exp": "12/30"}}`),
		"m-plain": []byte(`card 4111111111111111 exp 12/30`),
	}
	for id, data := range bodiesIn {
		res, err := gateWith(sealed).Deliver(ctx, route, &gate.Message{Broker: gate.BrokerPubSub,
			Source: "projects/p/subscriptions/s", MessageID: id, Data: data, PublishTime: time.Now().Add(-time.Second)})
		if err != nil || res.Decision != gate.Ack {
			t.Fatalf("%s: %v %+v", id, err, res)
		}
		res.Finish(ctx, nil, true)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM outbox WHERE data::text LIKE '%4111111111111111%'
		OR convert_from(data, 'UTF8') LIKE '%4111111111111111%' OR sealed_with IS DISTINCT FROM 'k1'`); n != 0 {
		t.Fatalf("%d outbox entries keep the card number in clear or unsealed", n)
	}
	if n := countRows(t, pool, `SELECT (SELECT count(*) FROM operations o WHERE o::text LIKE '%4111111111111111%')
		+ (SELECT count(*) FROM outbox e WHERE convert_from(e.data, 'UTF8') LIKE '%"exp": "12/30"%')`); n != 1 {
		t.Fatalf("want only the JSON entry's other values in clear, got %d matches", n)
	}

	// A replica without the key claims the entries and makes no call.
	unkeyed := storage.NewLedger(pool)
	entries, err := unkeyed.ClaimOutbox(ctx, []string{"payments"}, 10, time.Millisecond)
	if err != nil || len(entries) != 2 {
		t.Fatalf("claim: %d, %v", len(entries), err)
	}
	for _, e := range entries {
		if e.Unopened == nil || e.Message.Data != nil {
			t.Fatalf("an entry the replica cannot open came with data %q, unopened %v", e.Message.Data, e.Unopened)
		}
	}
	time.Sleep(5 * time.Millisecond) // past the claim's horizon

	// A rotated keyring opens what the old key sealed.
	rotated := storage.NewLedger(pool, storage.SealOutbox(keyring(t, "k2", "k1")))
	entries, err = rotated.ClaimOutbox(ctx, []string{"payments"}, 10, time.Minute)
	if err != nil || len(entries) != 2 {
		t.Fatalf("claim: %d, %v", len(entries), err)
	}
	for _, e := range entries {
		if e.Unopened != nil || !bytes.Equal(e.Message.Data, bodiesIn[e.Message.MessageID]) {
			t.Fatalf("opened %q (%v), want the data as published", e.Message.Data, e.Unopened)
		}
		out, err := gateWith(rotated).Relay(ctx, route, e)
		if err != nil || out.Decision != gate.Ack {
			t.Fatalf("relay: %v %+v", err, out)
		}
		out.Finish(ctx, nil, true)
	}
	if len(bodies) != 2 {
		t.Fatalf("%d calls, want 2", len(bodies))
	}
	for _, b := range bodies {
		if !bytes.Equal(b, bodiesIn["m-json"]) && !bytes.Equal(b, bodiesIn["m-plain"]) {
			t.Fatalf("the downstream got %q", b)
		}
	}

	// Without a key, a route with private values cannot hand off at all.
	_, err = gateWith(unkeyed).Deliver(ctx, route, &gate.Message{Broker: gate.BrokerPubSub,
		Source: "projects/p/subscriptions/s", MessageID: "m-3", Data: bodiesIn["m-json"], PublishTime: time.Now()})
	var ie *gate.InfraError
	if !errors.As(err, &ie) {
		t.Fatalf("a handoff without the key: %v, want it refused", err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM outbox WHERE message_id = 'm-3'`); n != 0 {
		t.Fatalf("a handoff without the key left %d entries", n)
	}
}
