package handlers_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ackgate/ackgate/internal/authtest"
)

// poisonRecord is GET /v1/poison's record as a client reads it.
type poisonRecord struct {
	Route       string    `json:"route"`
	Broker      string    `json:"broker"`
	Fingerprint string    `json:"fingerprint"`
	MessageID   string    `json:"message_id"`
	Reason      string    `json:"reason"`
	Count       int64     `json:"count"`
	FirstSeen   time.Time `json:"first_seen"`
	LastSeen    time.Time `json:"last_seen"`
	Acked       bool      `json:"acked"`
}

type poisonList struct {
	Poison     []poisonRecord `json:"poison"`
	NextCursor string         `json:"next_cursor"`
}

func (e *env) poison(query string) poisonList {
	e.t.Helper()
	var l poisonList
	if code := e.adminGet("/v1/poison"+query, &l); code != http.StatusOK {
		e.t.Fatalf("GET /v1/poison%s: %d", query, code)
	}
	return l
}

const poisonRoutes = `
  - name: ledgered
    broker: pubsub
    auth: none
    shape: unsafe
    dead_letter: gateway
    operation_key: {kind: attribute, name: order_id}
    effect:
      url: {{DOWN}}/effects
      result_id_header: X-Result-Id
  - name: brokered
    broker: pubsub
    auth: none
    shape: unsafe
    dead_letter: broker
    operation_key: {kind: attribute, name: order_id}
    effect:
      url: {{DOWN}}/effects
      result_id_header: X-Result-Id
`

// A message without a usable identity can never be processed. It is kept as
// one bounded, minimized poison record per route and message (its reason,
// its message id when the ledger can hold it, a fingerprint, how often and
// when it came), never as an operation. Under dead_letter: gateway it is
// acked once recorded, so the broker stops sending it; under broker it is
// still refused, for the subscription's own dead-letter policy.
func TestPoisonWithoutIdentityIsRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, poisonRoutes)
	noKey := msg{ID: "m-nokey", Data: `{"secret":"BODY-MARKER"}`, Attrs: map[string]string{"other": "1"}}

	for range 3 {
		wantStatus(t, e.push("ledgered", noKey), http.StatusNoContent)
	}
	for range 2 {
		r := e.push("brokered", noKey)
		wantStatus(t, r, http.StatusBadRequest)
		if !strings.Contains(r.Body.Reason, "order_id") {
			t.Errorf("broker route's answer: %+v", r.Body)
		}
	}
	// Not an envelope at all, and an identity the ledger cannot hold: poison
	// too, without a message id.
	wantStatus(t, e.pushRaw("ledgered", []byte(`{"message":`)), http.StatusNoContent)
	wantStatus(t, e.pushRaw("ledgered", []byte(`{"message":{"data":"eA==","messageId":"m\u0000","attributes":{"order_id":"1"}},"subscription":"projects/p/subscriptions/s"}`)), http.StatusNoContent)
	e.nothingRecorded("poison messages")

	all := e.poison("")
	if len(all.Poison) != 4 {
		t.Fatalf("poison records: %+v, want 4", all.Poison)
	}
	byRoute := e.poison("?route=ledgered")
	if len(byRoute.Poison) != 3 {
		t.Fatalf("ledgered's poison records: %+v, want 3", byRoute.Poison)
	}
	var counted poisonRecord
	for _, p := range byRoute.Poison {
		if p.MessageID == noKey.ID {
			counted = p
		}
		if p.Route != "ledgered" || p.Broker != "pubsub" || !p.Acked || p.Reason == "" || len(p.Reason) > 300 ||
			!strings.HasPrefix(p.Fingerprint, "px_") || p.FirstSeen.IsZero() || p.LastSeen.Before(p.FirstSeen) {
			t.Errorf("poison record %+v", p)
		}
		if strings.ContainsRune(p.MessageID, 0) || strings.Contains(p.Reason, "BODY-MARKER") {
			t.Errorf("poison record keeps what it should not: %+v", p)
		}
	}
	if counted.Count != 3 || !strings.Contains(counted.Reason, "order_id") || !counted.LastSeen.After(counted.FirstSeen) {
		t.Errorf("the redelivered message's record: %+v, want count 3 over a time span", counted)
	}
	brokered := e.poison("?route=brokered")
	if len(brokered.Poison) != 1 || brokered.Poison[0].Count != 2 || brokered.Poison[0].Acked {
		t.Errorf("brokered's poison: %+v, want one record, seen twice, not acked", brokered.Poison)
	}

	// Pages: newest first, with a cursor that leads to the rest.
	first := e.poison("?limit=3")
	if len(first.Poison) != 3 || first.NextCursor == "" {
		t.Fatalf("first page: %+v", first)
	}
	rest := e.poison("?limit=3&cursor=" + first.NextCursor)
	if len(rest.Poison) != 1 || rest.NextCursor != "" {
		t.Fatalf("second page: %+v", rest)
	}
	seen := map[string]bool{}
	for _, p := range append(first.Poison, rest.Poison...) {
		seen[p.Route+"/"+p.Fingerprint] = true
	}
	if len(seen) != 4 {
		t.Errorf("the pages list %d distinct records, want 4", len(seen))
	}
	// Filters that can match nothing are refused, not sent to the ledger.
	for _, q := range []string{"?route=%00", "?cursor=%ff", "?cursor=bm9wZQ", "?limit=0"} {
		if code, reason := e.adminRaw("/v1/poison" + q); code != http.StatusBadRequest || reason == "" {
			t.Errorf("/v1/poison%s: %d %q, want 400", q, code, reason)
		}
	}
	raw, _ := json.Marshal(all)
	if strings.Contains(string(raw), "BODY-MARKER") {
		t.Errorf("the poison list carries a message body: %s", raw)
	}
}

// On SNS, a verified notification without a usable identity is poison too:
// recorded, and acked under dead_letter: gateway. An unverified body is never
// recorded: anyone can send one.
func TestSNSPoisonIsRecordedOnlyOnceVerified(t *testing.T) {
	t.Parallel()
	sns := authtest.NewSNS(t)
	e := newEnvWith(t, false, snsRouteYAML("orders", "sns_signature", "    dead_letter: gateway\n    operation_key: {kind: json_pointer, name: /order_id}\n"),
		map[string]string{"GATEWAY_SNS_TRUSTED_URL_PREFIXES": sns.Prefix()})
	m := sns.Sign(sns.Notification(ordersTopic, "n-nokey", `{"other":1}`), "2")
	for range 2 {
		r, _ := e.postSNS("orders", m, authtest.Body(m), nil)
		wantStatus(t, r, http.StatusNoContent)
	}
	forged := *m
	forged.MessageID = "n-forged"
	r, _ := e.postSNS("orders", &forged, authtest.Body(&forged), nil)
	wantStatus(t, r, http.StatusUnauthorized)
	r, _ = e.postSNS("orders", m, []byte(`{"Type":`), nil)
	wantStatus(t, r, http.StatusBadRequest)
	e.nothingRecorded("SNS poison")

	l := e.poison("?route=orders")
	if len(l.Poison) != 1 || l.Poison[0].MessageID != "n-nokey" || l.Poison[0].Count != 2 || !l.Poison[0].Acked ||
		l.Poison[0].Broker != "sns" || !strings.Contains(l.Poison[0].Reason, "/order_id") {
		t.Fatalf("SNS poison: %+v, want the verified notification only, seen twice", l.Poison)
	}
}
