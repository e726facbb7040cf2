package handlers_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"
)

// The fuzz targets here drive a whole gateway (real Postgres, Redis and
// downstream) over HTTP with arbitrary input. Their one promise: input alone
// never earns a 5xx. Every route dead-letters in the gateway and the
// downstream always applies, so nothing but a broken dependency or a bug
// could make an answer a nack. Like the decoding targets, they run briefly
// in `make test` and over their seeds in every `go test`.

// fuzzPushRoutes key a message in each of the three ways a route can.
const fuzzPushRoutes = `
  - name: byid
    broker: pubsub
    auth: none
    shape: repeatable
    dead_letter: gateway
    fingerprint:
      attributes: [event_type]
    effect:
      url: {{DOWN}}/effects
      result_id_header: X-Result-Id
  - name: byattr
    broker: pubsub
    auth: none
    shape: repeatable
    dead_letter: gateway
    operation_key: {kind: attribute, name: order_id}
    effect:
      url: {{DOWN}}/effects
      result_id_header: X-Result-Id
  - name: bypointer
    broker: pubsub
    auth: none
    shape: repeatable
    dead_letter: gateway
    operation_key: {kind: json_pointer, name: /order/id}
    fingerprint:
      data: false
      pointers: [/amount]
    effect:
      url: {{DOWN}}/effects
      result_id_header: X-Result-Id
  - name: unwrapped
    broker: pubsub
    auth: none
    pubsub_mode: unwrapped
    shape: repeatable
    dead_letter: gateway
    operation_key: {kind: attribute, name: order_id}
    effect:
      url: {{DOWN}}/effects
      result_id_header: X-Result-Id
`

var fuzzPushRouteNames = []string{"byid", "byattr", "bypointer"}

// post sends one request to the ingest listener and fails t (not the env's
// test) on a transport error.
func fuzzPost(t *testing.T, e *env, path string, body []byte, header http.Header) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.ingest.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// wantNo5xx fails unless status is below 500 and a non-ack carries a reason.
func wantNo5xx(t *testing.T, what string, status int, raw []byte) {
	t.Helper()
	if status >= 500 {
		t.Fatalf("%s: input alone answered %d: %s", what, status, raw)
	}
	if status != http.StatusNoContent {
		var a struct {
			Reason string `json:"reason"`
		}
		if err := json.Unmarshal(raw, &a); err != nil || a.Reason == "" {
			t.Fatalf("%s: %d without a reason: %s", what, status, raw)
		}
	}
}

func FuzzPushPubSub(f *testing.F) {
	e := newEnv(f, false, fuzzPushRoutes)
	seeds := []string{
		string(envelope(msg{ID: "m-1", Data: `{"order":{"id":"9"},"amount":1}`, Attrs: map[string]string{"order_id": "9", "event_type": "created"}})),
		string(envelope(msg{ID: "m-1", Data: `{"order":{"id":"9"},"amount":2}`, Attrs: map[string]string{"order_id": "9", "event_type": "changed"}})),
		`{"message":{"data":"eA==","messageId":"m-old","publishTime":"2001-01-01T00:00:00Z","attributes":{"order_id":"1"}},"subscription":"projects/p/subscriptions/s"}`,
		`{"message":{"data":"eA==","messageId":"m-future","publishTime":"2999-01-01T00:00:00Z","attributes":{"order_id":"2"}},"subscription":"projects/p/subscriptions/s"}`,
		`{"message":{"data":"eA==","messageId":"m","attributes":{"order_id":"3"}},"subscription":"projects/p/subscriptions/s","deliveryAttempt":5}`,
		`{nope`, ``,
	}
	for i, s := range append(seeds, poisonPushBodies...) {
		f.Add([]byte(s), uint8(i))
	}
	f.Fuzz(func(t *testing.T, body []byte, pick uint8) {
		route := fuzzPushRouteNames[int(pick)%len(fuzzPushRouteNames)]
		status, raw := fuzzPost(t, e, "/v1/push/pubsub/"+route, body, http.Header{"Content-Type": {"application/json"}})
		wantNo5xx(t, route, status, raw)
	})
}

// poisonPushBodies are envelopes whose identity fields, or numbers, the
// ledger cannot hold.
var poisonPushBodies = []string{
	`{"message":{"data":"eA==","messageId":"m\u0000","attributes":{"order_id":"4"}},"subscription":"projects/p/subscriptions/s"}`,
	"{\"message\":{\"data\":\"eA==\",\"messageId\":\"m\xff\",\"attributes\":{\"order_id\":\"5\"}},\"subscription\":\"projects/p/subscriptions/s\"}",
	`{"message":{"data":"eA==","messageId":"m-6","attributes":{"order_id":"6"}},"subscription":"projects/p/subscriptions/s\u0000"}`,
	`{"message":{"data":"eA==","messageId":"m-7","attributes":{"order_id":"7\u0000"}},"subscription":"s"}`,
	"{\"message\":{\"data\":\"eA==\",\"messageId\":\"m-8\",\"attributes\":{\"order_id\":\"\xc3\x28\"}},\"subscription\":\"s\"}",
	`{"message":{"data":"eyJvcmRlciI6eyJpZCI6Ilx1MDAwMCJ9fQ==","messageId":"m-9"},"subscription":"s"}`,
	`{"message":{"data":"eA==","messageId":"m-10","attributes":{"order_id":"10"}},"subscription":"s","deliveryAttempt":2147483648}`,
	`{"message":{"data":"eA==","messageId":"m-11","publishTime":"0000-01-01T00:00:00Z","attributes":{"order_id":"11"}},"subscription":"s"}`,
	`{"message":{"data":"eA==","messageId":"m-12","publishTime":"0001-01-01T00:00:00+01:00","attributes":{"order_id":"12"}},"subscription":"s"}`,
	// What decoding would replace with U+FFFD in every identity position.
	"{\"message\":{\"data\":\"eA==\",\"messageId\":\"c1-ff-\xfe\",\"attributes\":{\"order_id\":\"13\"}},\"subscription\":\"s\"}",
	`{"message":{"data":"eA==","messageId":"c1-\udcff","attributes":{"order_id":"14"}},"subscription":"s"}`,
	`{"message":{"data":"eA==","messageId":"m-15","attributes":{"order_id":"15"}},"subscription":"s-\ud800"}`,
	`{"message":{"data":"eA==","messageId":"m-16","attributes":{"order_id":"16\udc00"}},"subscription":"s"}`,
	`{"message":{"data":"eyJvcmRlciI6eyJpZCI6Ilx1ZGNmZiJ9fQ==","messageId":"m-17"},"subscription":"s"}`,
	`{"message":{"data":"eyJvcmRlciI6eyJpZCI6Iv8ifX0=","messageId":"m-18"},"subscription":"s"}`,
}

func FuzzPushPubSubUnwrapped(f *testing.F) {
	e := newEnv(f, false, fuzzPushRoutes)
	f.Add([]byte(`{"order":1}`), "projects/p/subscriptions/s", "m-1", "", "order_id", "1")
	f.Add([]byte("x"), "s", "m\x00", "", "order_id", "2")
	f.Add([]byte("x"), "s\xff", "m", "", "order_id", "3")
	f.Add([]byte("x"), "s", "m", "", "order_id", "\xc3\x28")
	f.Add([]byte("x"), "s", "m", "0000-01-01T00:00:00Z", "order_id", "4")
	f.Add([]byte("x"), "s", "m", "2999-01-01T00:00:00Z", "order_id", "5")
	f.Add([]byte(""), "s", "m", "", "", "")
	f.Add([]byte("x"), "s", "c1-ff-\xfe", "", "order_id", "6")
	f.Add([]byte("x"), "s", "m", "", "order_id", "7\xff")
	f.Add([]byte(`{"order":{"id":"\udcff"}}`), "s", "m", "", "order_id", "8")
	f.Fuzz(func(t *testing.T, body []byte, sub, id, published, attr, value string) {
		h := http.Header{}
		for k, v := range map[string]string{
			"X-Goog-Pubsub-Subscription-Name": sub, "X-Goog-Pubsub-Message-Id": id,
			"X-Goog-Pubsub-Publish-Time": published, attr: value,
		} {
			// Go's client refuses what HTTP cannot carry; only what it sends
			// is the gateway's to answer.
			if k != "" && v != "" && validHeader(k, v) {
				h.Set(k, v)
			}
		}
		status, raw := fuzzPost(t, e, "/v1/push/pubsub/unwrapped", body, h)
		wantNo5xx(t, "unwrapped", status, raw)
	})
}

// validHeader reports whether Go's HTTP client will send the header at all:
// a token for a name, and a value without control bytes other than tab.
func validHeader(name, value string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c >= 0x7f || bytes.IndexByte([]byte(`"(),/:;<=>?@[\]{}`), c) >= 0 {
			return false
		}
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// FuzzAdminQuery sends arbitrary filters, cursors and ids to the admin API
// (operations and poison records): each is answered, never with a 5xx, on a
// ledger that holds records of both.
func FuzzAdminQuery(f *testing.F) {
	e := newEnv(f, false, fuzzPushRoutes)
	for _, m := range []msg{{ID: "m-1", Data: "x"}, {ID: "m-2", Data: "y"}} {
		if r := e.push("byid", m); r.Status != http.StatusNoContent {
			f.Fatalf("seeding the ledger: %d %s", r.Status, r.Raw)
		}
	}
	for _, body := range []string{`{"message":`, `{nope`} {
		if r := e.pushRaw("byattr", []byte(body)); r.Status != http.StatusNoContent {
			f.Fatalf("seeding the poison records: %d %s", r.Status, r.Raw)
		}
	}
	f.Add("byid", "acknowledged", "m-1", "m-1", "10", "", "op_x")
	f.Add("\x00", "\x00", "\xff", "a\x00b", "0", "MTcwMDAwMDAwMDAwMDAwMDpvcF8A", "op_\x00")
	f.Add("\xc3\x28", "\xff", "m\x00", "\xff", "-1", "LTkyMjMzNzIwMzY4NTQ3NzU4MDg6b3BfeA", "\xff")
	f.Add("", "", "", "", "501", "OTIyMzM3MjAzNjg1NDc3NTgwNzpvcF94", "")
	f.Fuzz(func(t *testing.T, route, state, messageID, key, limit, cursor, id string) {
		q := url.Values{}
		for k, v := range map[string]string{"route": route, "state": state, "message_id": messageID, "key": key, "limit": limit, "cursor": cursor} {
			if v != "" {
				q.Set(k, v)
			}
		}
		pq := url.Values{}
		for k, v := range map[string]string{"route": route, "limit": limit, "cursor": cursor} {
			if v != "" {
				pq.Set(k, v)
			}
		}
		for _, path := range []string{"/v1/operations?" + q.Encode(), "/v1/operations/" + url.PathEscape(id), "/v1/poison?" + pq.Encode()} {
			status, reason := adminGetT(t, e, path)
			if status >= 500 {
				t.Fatalf("%s: input alone answered %d: %s", path, status, reason)
			}
		}
	})
}

// adminGetT is env.adminRaw reporting to t rather than to the env's test.
func adminGetT(t *testing.T, e *env, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.admin.URL+path, nil)
	if err != nil {
		// Not a request a client can send; nothing for the gateway to answer.
		return http.StatusBadRequest, err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("admin %s: %v", path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}
