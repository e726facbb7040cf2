package handlers_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/handlers"
)

// The fuzz targets here drive a whole gateway (real Postgres, Redis and
// downstream) over HTTP with arbitrary input. Their one promise: input alone
// never earns a 5xx. Every route dead-letters in the gateway and the
// downstream always applies, so nothing but a broken dependency or a bug
// could make an answer a nack. Like the decoding targets, they run briefly
// in `make test` and over their seeds in every `go test`.

// fuzzPushRoutes key a message in each of the three ways a route can, and
// on a private attribute, whose key is kept only as a keyed hash.
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
  - name: byprivate
    broker: pubsub
    auth: none
    shape: repeatable
    dead_letter: gateway
    operation_key: {kind: attribute, name: order_id}
    private: [order_id]
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

var fuzzPushRouteNames = []string{"byid", "byattr", "bypointer", "byprivate"}

// newFuzzEnv is a gateway with fuzzPushRoutes, the private one's hash
// secret included.
func newFuzzEnv(f *testing.F) *env {
	return newEnvWith(f, false, fuzzPushRoutes, map[string]string{"GATEWAY_KEY_HASH_SECRET": keyHashSecret})
}

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
	e := newFuzzEnv(f)
	seeds := []string{
		string(envelope(msg{ID: "m-1", Data: `{"order":{"id":"9"},"amount":1}`, Attrs: map[string]string{"order_id": "9", "event_type": "created"}})),
		string(envelope(msg{ID: "m-1", Data: `{"order":{"id":"9"},"amount":2}`, Attrs: map[string]string{"order_id": "9", "event_type": "changed"}})),
		`{"message":{"data":"eA==","messageId":"m-old","publishTime":"2001-01-01T00:00:00Z","attributes":{"order_id":"1"}},"subscription":"projects/p/subscriptions/s"}`,
		`{"message":{"data":"eA==","messageId":"m-future","publishTime":"2999-01-01T00:00:00Z","attributes":{"order_id":"2"}},"subscription":"projects/p/subscriptions/s"}`,
		`{"message":{"data":"eA==","messageId":"m","attributes":{"order_id":"3"}},"subscription":"projects/p/subscriptions/s","deliveryAttempt":5}`,
		`{nope`, ``,
	}
	for i, s := range seeds {
		f.Add([]byte(s), uint8(i))
	}
	// Each poison body on every route, so that each identity position is
	// tried on the route that reads it as its key, private or not.
	for _, s := range poisonPushBodies {
		for i := range fuzzPushRouteNames {
			f.Add([]byte(s), uint8(i))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, pick uint8) {
		route := fuzzPushRouteNames[int(pick)%len(fuzzPushRouteNames)]
		before := replacedIdentities(t, e)
		status, raw := fuzzPost(t, e, "/v1/push/pubsub/"+route, body, http.Header{"Content-Type": {"application/json"}})
		wantNo5xx(t, route, status, raw)
		// What the gateway cannot take byte for byte it refuses (a poison
		// record on these routes): it never records an identity with a
		// U+FFFD the body did not spell.
		if after := replacedIdentities(t, e); after > before && !spellsReplacement(body) {
			t.Fatalf("%s: %d identities with U+FFFD recorded from a body that has none", route, after-before)
		}
	})
}

// replacedIdentities counts the ledger's identities (source, message id,
// key, in operations and deliveries) that hold U+FFFD.
func replacedIdentities(t *testing.T, e *env) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM operations WHERE strpos(source || message_id || key, chr(65533)) > 0) +
		(SELECT count(*) FROM deliveries WHERE strpos(source || message_id, chr(65533)) > 0)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// spellsReplacement says whether body holds U+FFFD itself, as UTF-8 or
// as a JSON escape, possibly inside base64 data the fuzzer cannot see.
func spellsReplacement(body []byte) bool {
	if bytes.Contains(body, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`)) {
		return true
	}
	// The data is base64: a key drawn from it by a pointer may spell it
	// there.
	var env struct {
		Message struct {
			Data string `json:"data"`
		} `json:"message"`
	}
	if json.Unmarshal(body, &env) == nil {
		if d, err := base64.StdEncoding.DecodeString(env.Message.Data); err == nil {
			return bytes.Contains(d, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(d), []byte(`\ufffd`))
		}
	}
	return false
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
	"{\"message\":{\"data\":\"eA==\",\"messageId\":\"m-19\",\"attributes\":{\"order_id\":\"19\"}},\"subscription\":\"s-\xff\"}",
	`{"message":{"data":"eA==","messageId":"m-16","attributes":{"order_id":"16\udc00"}},"subscription":"s"}`,
	`{"message":{"data":"eyJvcmRlciI6eyJpZCI6Ilx1ZGNmZiJ9fQ==","messageId":"m-17"},"subscription":"s"}`,
	`{"message":{"data":"eyJvcmRlciI6eyJpZCI6Iv8ifX0=","messageId":"m-18"},"subscription":"s"}`,
}

func FuzzPushPubSubUnwrapped(f *testing.F) {
	e := newFuzzEnv(f)
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
	f.Add([]byte("{\"order\":{\"id\":\"\xff\"}}"), "s", "m", "", "order_id", "9")
	f.Add([]byte(`{"order":{"id":"\u0000"}}`), "s", "m", "", "order_id", "10")
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
	e := newFuzzEnv(f)
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

// FuzzAdminResolve sends resolutions and replays whose free text (reason,
// note, actor, result id) is arbitrary bytes, written into the body raw so
// that invalid UTF-8 reaches the gateway as sent. An operator's text is
// kept as written or refused: whatever a field holds that Postgres text
// cannot (a NUL) or that decoding would replace (invalid UTF-8) is a 400,
// never a 5xx and never recorded; a body over the limit is a 413 before
// any field is read. The operation resolved is one nothing can change here
// (it does not exist), so every input is judged alone.
func FuzzAdminResolve(f *testing.F) {
	e := newFuzzEnv(f)
	f.Add(false, "abandon", "refunded by hand", "", "", "")
	f.Add(true, "", "try again", "ticket 42", "admin", "")
	f.Add(false, "happened", "seen at the provider", "", "api:admin", "res-1")
	for _, bad := range []string{"r\x00", "r\xff", "r\xc3\x28", "c1-ff-\xfe"} {
		f.Add(false, "abandon", bad, "", "", "")
		f.Add(false, "abandon", "r", bad, "", "")
		f.Add(false, "abandon", "r", "", bad, "")
		f.Add(false, "happened", "r", "", "", bad)
		f.Add(true, "", bad, "", "", "")
		f.Add(true, "", "r", bad, "", "")
		f.Add(true, "", "r", "", bad, "")
	}
	f.Fuzz(func(t *testing.T, replay bool, kind, reason, note, actor, resultID string) {
		fields := map[string]string{"reason": reason, "note": note, "actor": actor}
		path := "/v1/operations/op_aaaaaaaaaaaaaaaaaaaaaaaaaa/resolve"
		if replay {
			path = "/v1/operations/op_aaaaaaaaaaaaaaaaaaaaaaaaaa/replay"
		} else {
			fields["kind"], fields["result_id"] = kind, resultID
		}
		var body bytes.Buffer
		body.WriteByte('{')
		unfit := ""
		for k, v := range fields {
			if v == "" {
				continue
			}
			if body.Len() > 1 {
				body.WriteByte(',')
			}
			body.WriteString(`"` + k + `":`)
			rawJSONString(&body, v)
			if unfit == "" && k != "kind" && gate.Unstorable(v) != "" {
				unfit = k
			}
		}
		body.WriteByte('}')
		status, raw := adminPostT(t, e, path, body.Bytes())
		if status >= 500 {
			t.Fatalf("%s: input alone answered %d: %s", path, status, raw)
		}
		if body.Len() > handlers.MaxResolutionBody {
			if status != http.StatusRequestEntityTooLarge {
				t.Fatalf("%s with a body of %d bytes: %d %s, want 413", path, body.Len(), status, raw)
			}
			return
		}
		if unfit != "" && status != http.StatusBadRequest {
			t.Fatalf("%s with a %s Postgres cannot hold or decoding would replace: %d %s, want 400", path, unfit, status, raw)
		}
	})
}

// rawJSONString writes v as a JSON string, escaping only what JSON
// requires and leaving every other byte, valid UTF-8 or not, as it is.
func rawJSONString(b *bytes.Buffer, v string) {
	b.WriteByte('"')
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20:
			fmt.Fprintf(b, `\u%04x`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

// adminPostT posts body with the admin token, reporting to t.
func adminPostT(t *testing.T, e *env, path string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.admin.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("admin %s: %v", path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}
