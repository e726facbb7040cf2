package handlers_test

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
)

// exactRoutes key on the message id, an attribute, a JSON pointer and a
// private attribute, each dead-lettered by the broker (a refusal is a 400)
// and in the gateway (a refusal is a poison record, then an ack).
const exactRoutes = `
  - name: byid
    broker: pubsub
    auth: none
    shape: unsafe
    dead_letter: broker
    effect: {url: "{{DOWN}}/effects", result_id_header: X-Result-Id}
  - name: byattr
    broker: pubsub
    auth: none
    shape: unsafe
    dead_letter: broker
    operation_key: {kind: attribute, name: order_id}
    effect: {url: "{{DOWN}}/effects", result_id_header: X-Result-Id}
  - name: bypointer
    broker: pubsub
    auth: none
    shape: unsafe
    dead_letter: broker
    operation_key: {kind: json_pointer, name: /order/id}
    effect: {url: "{{DOWN}}/effects", result_id_header: X-Result-Id}
  - name: byprivate
    broker: pubsub
    auth: none
    shape: unsafe
    dead_letter: broker
    operation_key: {kind: attribute, name: card}
    private: [card]
    effect: {url: "{{DOWN}}/effects", result_id_header: X-Result-Id}
  - name: poisoned
    broker: pubsub
    auth: none
    shape: unsafe
    dead_letter: gateway
    effect: {url: "{{DOWN}}/effects", result_id_header: X-Result-Id}
`

// rawEnvelope writes a push envelope by hand, so that its strings carry
// exactly the bytes given (json.Marshal would replace invalid UTF-8).
func rawEnvelope(id, attrs, data string) []byte {
	if attrs == "" {
		attrs = "{}"
	}
	return []byte(`{"message":{"data":"` + base64.StdEncoding.EncodeToString([]byte(data)) + `","messageId":"` + id +
		`","attributes":` + attrs + `},"subscription":"projects/p/subscriptions/s"}`)
}

// Identities are compared byte for byte or refused. JSON decoding turns
// every byte that is not UTF-8, and every unpaired surrogate escape, into
// U+FFFD: without a check of the raw bytes, the messageIds c1-ff-\xff and
// c1-ff-\xfe were one operation, and the second was acked as its duplicate
// without ever reaching the downstream. Each pair below differs only where
// decoding would replace: each message is refused with a reason (or kept as
// its own poison record), no operation is created, nothing is called.
func TestIdentitiesThatDecodingWouldReplaceAreRefused(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, false, exactRoutes, map[string]string{"GATEWAY_KEY_HASH_SECRET": keyHashSecret})
	pairs := []struct {
		name, route string
		a, b        []byte
	}{
		{"message id with invalid UTF-8", "byid", rawEnvelope("c1-ff-\xff", "", "x"), rawEnvelope("c1-ff-\xfe", "", "x")},
		{"message id with a lone surrogate", "byid", rawEnvelope(`c1-\udcff`, "", "x"), rawEnvelope(`c1-\udcfe`, "", "x")},
		{"attribute key with invalid UTF-8", "byattr", rawEnvelope("m-1", `{"order_id":"o-\xff"}`, "x"), rawEnvelope("m-2", `{"order_id":"o-\xfe"}`, "x")},
		{"attribute key with a lone surrogate", "byattr", rawEnvelope("m-3", `{"order_id":"o-\ud800"}`, "x"), rawEnvelope("m-4", `{"order_id":"o-\ud801"}`, "x")},
		{"pointer key with invalid UTF-8", "bypointer", rawEnvelope("m-5", "", `{"order":{"id":"o-`+"\xff"+`"}}`), rawEnvelope("m-6", "", `{"order":{"id":"o-`+"\xfe"+`"}}`)},
		{"pointer key with a lone surrogate", "bypointer", rawEnvelope("m-7", "", `{"order":{"id":"o-\udcff"}}`), rawEnvelope("m-8", "", `{"order":{"id":"o-\udcfe"}}`)},
		{"private key with invalid UTF-8", "byprivate", rawEnvelope("m-9", `{"card":"4242\xff"}`, "x"), rawEnvelope("m-10", `{"card":"4242\xfe"}`, "x")},
		{"private key with a NUL", "byprivate", rawEnvelope("m-11", `{"card":"4242\u0000"}`, "x"), rawEnvelope("m-12", `{"card":"4242\u0000\u0000"}`, "x")},
		{"subscription with invalid UTF-8", "byid",
			[]byte(`{"message":{"data":"eA==","messageId":"m-13"},"subscription":"projects/p/subscriptions/s-` + "\xff" + `"}`),
			[]byte(`{"message":{"data":"eA==","messageId":"m-13"},"subscription":"projects/p/subscriptions/s-` + "\xfe" + `"}`)},
	}
	for _, p := range pairs {
		for _, body := range [][]byte{p.a, p.b} {
			r := e.pushRaw(p.route, body)
			if r.Status != http.StatusBadRequest || r.Body.Reason == "" {
				t.Errorf("%s: %d %s, want 400 with a reason", p.name, r.Status, r.Raw)
			}
			if strings.Contains(r.Body.Reason, "4242") {
				t.Errorf("%s: the reason quotes the private key: %q", p.name, r.Body.Reason)
			}
		}
	}
	e.nothingRecorded("identities decoding would replace")

	// Under dead_letter: gateway each is its own poison record, acked once
	// kept: two messages, two records, neither taken for the other.
	wantStatus(t, e.pushRaw("poisoned", rawEnvelope("c1-ff-\xff", "", "x")), http.StatusNoContent)
	wantStatus(t, e.pushRaw("poisoned", rawEnvelope("c1-ff-\xfe", "", "x")), http.StatusNoContent)
	wantStatus(t, e.pushRaw("poisoned", rawEnvelope("c1-ff-\xfe", "", "x")), http.StatusNoContent)
	e.nothingRecorded("poisoned ids")
	l := e.poison("?route=poisoned")
	if len(l.Poison) != 2 || l.Poison[0].Fingerprint == l.Poison[1].Fingerprint || l.Poison[0].Count+l.Poison[1].Count != 3 {
		t.Fatalf("poison records: %+v, want two, one seen twice", l.Poison)
	}
	for _, p := range l.Poison {
		if !strings.Contains(p.Reason, "UTF-8") || p.MessageID != "" {
			t.Errorf("poison record %+v: want a reason naming UTF-8 and no message id", p)
		}
	}

	// What is valid stays byte-exact: a literal U+FFFD and an escaped
	// surrogate pair are characters like any other, and distinct ids.
	wantStatus(t, e.pushRaw("byid", rawEnvelope("c1-\uFFFD", "", "x")), http.StatusNoContent)
	wantStatus(t, e.pushRaw("byid", rawEnvelope(`c1-\ud83d\ude00`, "", "x")), http.StatusNoContent)
	wantStatus(t, e.pushRaw("bypointer", rawEnvelope("m-20", "", `{"order":{"id":"o-\ufffd"}}`)), http.StatusNoContent)
	if got := e.down.Applied(); got != 3 {
		t.Errorf("downstream applied %d effects, want 3", got)
	}
}

// An operator's free text is kept as written or refused: a reason with a
// byte that is not UTF-8 was accepted, and would have been stored with
// U+FFFD in its place.
func TestResolutionTextDecodingWouldReplaceIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("orders", "unsafe", "broker", ""))
	id := e.opID("orders", msg{ID: "m-1", Data: "x"})
	for _, body := range []string{
		`{"kind":"abandon","reason":"checked ` + "\xff" + `"}`,
		`{"kind":"abandon","reason":"checked \udcff"}`,
		`{"kind":"abandon","reason":"checked","note":"n` + "\xfe" + `"}`,
	} {
		a := e.adminPost("/v1/operations/"+id+"/resolve", []byte(body))
		if a.Status != http.StatusBadRequest || !strings.Contains(a.Problem, "UTF-8") && !strings.Contains(a.Problem, "surrogate") {
			t.Errorf("%q: %d %q, want 400 naming the encoding", body, a.Status, a.Problem)
		}
	}
}
