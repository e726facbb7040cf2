package handlers

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/gate"
)

// The fuzz targets below run briefly in `make test` (see the Makefile) and
// as ordinary tests over their seeds in every `go test`.

var fuzzRoutes = []*gate.Route{
	{Name: "byid", Tenant: "t", Key: gate.KeySource{Kind: gate.KeyMessageID},
		Fingerprint: gate.FingerprintSpec{Version: 1, Data: true, Attributes: []string{"event_type"}}},
	{Name: "byattr", Tenant: "t", Key: gate.KeySource{Kind: gate.KeyAttribute, Name: "order_id"},
		Fingerprint: gate.FingerprintSpec{Version: 1, Data: true, Attributes: []string{"Region", "event_type"}}},
	{Name: "bypointer", Tenant: "t", Key: gate.KeySource{Kind: gate.KeyJSONPointer, Name: "/order/id"},
		Fingerprint: gate.FingerprintSpec{Version: 1, Pointers: []string{"/amount"}}},
	{Name: "byprivate", Tenant: "t", Key: gate.KeySource{Kind: gate.KeyAttribute, Name: "order_id", Hashed: true},
		Fingerprint: gate.FingerprintSpec{Version: 1, Data: true}, Private: []string{"order_id"},
		HashKey: gate.NewKeyHash([]byte("fuzz-key-hash-secret-0123456789abcdef"))},
	{Name: "byprivatepointer", Tenant: "t", Key: gate.KeySource{Kind: gate.KeyJSONPointer, Name: "/order/id", Hashed: true},
		Fingerprint: gate.FingerprintSpec{Version: 1, Data: true}, Private: []string{"/order/id"},
		HashKey: gate.NewKeyHash([]byte("fuzz-key-hash-secret-0123456789abcdef"))},
}

func FuzzDecodePubSubWrapped(f *testing.F) {
	for _, s := range []string{
		`{"message":{"data":"eyJvcmRlciI6IDQyfQ==","messageId":"m-1","attributes":{"event_type":"created"}},"subscription":"projects/p/subscriptions/s"}`,
		`{"message":{"data":"","message_id":"m-2","publish_time":"2026-01-01T00:00:00.123Z","attributes":{"order_id":"7"}},"subscription":"projects/p/subscriptions/s","deliveryAttempt":3}`,
		`{"message":{"data":"eyJvcmRlciI6eyJpZCI6IjkifSwiYW1vdW50IjoxfQ==","messageId":"m-3","message_id":"m-3","orderingKey":"k"},"subscription":"s"}`,
		`{"message":{"messageId":"m-4"},"subscription":"s"}`,
		`{"message":null}`, `{}`, `[]`, ``, `{"message":{"data":"!!","messageId":"x"},"subscription":"s"}`,
	} {
		f.Add([]byte(s))
	}
	for _, s := range poisonEnvelopes {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		msg, err := decodePubSub(body)
		if err != nil {
			if _, ok := err.(*Rejection); !ok {
				t.Fatalf("error is not a Rejection: %v", err)
			}
			return
		}
		if msg.MessageID == "" || msg.Source == "" || msg.Broker != gate.BrokerPubSub {
			t.Fatalf("decoded without identity: %+v", msg)
		}
		notReplaced(t, body, "message id", msg.MessageID)
		notReplaced(t, body, "subscription", msg.Source)
		for k, v := range msg.Attributes {
			notReplaced(t, body, "attribute", k+"="+v)
		}
		for _, r := range fuzzRoutes {
			identifiedIsStorable(t, r, msg)
		}
	})
}

// poisonEnvelopes carry what Postgres text cannot hold (NUL, invalid UTF-8)
// in every identity field, and numbers the ledger's columns cannot hold.
var poisonEnvelopes = []string{
	`{"message":{"data":"eA==","messageId":"m\u0000"},"subscription":"projects/p/subscriptions/s"}`,
	`{"message":{"data":"eA==","message_id":"\u0000"},"subscription":"projects/p/subscriptions/s"}`,
	"{\"message\":{\"data\":\"eA==\",\"messageId\":\"m\xff\"},\"subscription\":\"projects/p/subscriptions/s\"}",
	`{"message":{"data":"eA==","messageId":"m"},"subscription":"projects/p/subscriptions/s\u0000"}`,
	"{\"message\":{\"data\":\"eA==\",\"messageId\":\"m\"},\"subscription\":\"\xc3\x28\"}",
	`{"message":{"data":"eA==","messageId":"m","attributes":{"order_id":"7\u0000"}},"subscription":"s"}`,
	"{\"message\":{\"data\":\"eA==\",\"messageId\":\"m\",\"attributes\":{\"order_id\":\"\xff\"}},\"subscription\":\"s\"}",
	`{"message":{"data":"eyJvcmRlciI6eyJpZCI6Ilx1MDAwMCJ9fQ==","messageId":"m"},"subscription":"s"}`,
	`{"message":{"data":"eA==","messageId":"m"},"subscription":"s","deliveryAttempt":2147483648}`,
	`{"message":{"data":"eA==","messageId":"m"},"subscription":"s","deliveryAttempt":9223372036854775807}`,
	`{"message":{"data":"eA==","messageId":"m","publishTime":"0000-01-01T00:00:00Z"},"subscription":"s"}`,
	`{"message":{"data":"eA==","messageId":"m","publishTime":"9999-12-31T23:59:59+00:00"},"subscription":"s"}`,
	// What decoding would replace with U+FFFD, in every identity position:
	// the id (both spellings), the subscription, the key attribute, the
	// private key attribute and the JSON pointer key.
	"{\"message\":{\"data\":\"eA==\",\"messageId\":\"c1-ff-\xfe\"},\"subscription\":\"s\"}",
	`{"message":{"data":"eA==","messageId":"c1-\udcff"},"subscription":"s"}`,
	`{"message":{"data":"eA==","message_id":"c1-\ud800"},"subscription":"s"}`,
	`{"message":{"data":"eA==","messageId":"m"},"subscription":"projects/p/subscriptions/\udfff"}`,
	`{"message":{"data":"eA==","messageId":"m","attributes":{"order_id":"7\ud800x"}},"subscription":"s"}`,
	"{\"message\":{\"data\":\"eA==\",\"messageId\":\"m\",\"attributes\":{\"order_id\":\"7\xfe\"}},\"subscription\":\"s\"}",
	`{"message":{"data":"eyJvcmRlciI6eyJpZCI6Ilx1ZGNmZiJ9fQ==","messageId":"m"},"subscription":"s"}`,
	`{"message":{"data":"eyJvcmRlciI6eyJpZCI6Iv8ifX0=","messageId":"m"},"subscription":"s"}`,
	`{"message":{"data":"eyJhbW91bnQiOiJcdWQ4MDAifQ==","messageId":"m","attributes":{"order_id":"8"}},"subscription":"s"}`,
	`{"message":{"data":"eA==","messageId":"m","attributes":{"order_id":"\ud83d\ude00 \ufffd"}},"subscription":"s"}`,
}

// notReplaced fails t when a decoded value holds U+FFFD that body did not:
// a byte the decoder could not read, replaced, so that two messages that
// differ there would decode alike.
func notReplaced(t *testing.T, body []byte, what, v string) {
	t.Helper()
	if !strings.ContainsRune(v, utf8.RuneError) {
		return
	}
	if bytes.Contains(body, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`)) {
		return
	}
	t.Fatalf("%s %q holds U+FFFD the body does not: a replaced byte", what, v)
}

// identifiedIsStorable holds a message the decoders accepted to what the
// ledger can store: either the route finds no usable identity in it (a
// rejection), or every value that becomes text is valid UTF-8 without a NUL
// byte, and the broker's attempt and publish time fit the ledger's columns.
func identifiedIsStorable(t *testing.T, r *gate.Route, msg *gate.Message) {
	t.Helper()
	if msg.BrokerAttempt < 0 || msg.BrokerAttempt > math.MaxInt32 {
		t.Fatalf("decoded a broker attempt the ledger cannot hold: %d", msg.BrokerAttempt)
	}
	if pt := msg.PublishTime; !pt.IsZero() && (pt.Before(earliestPublishTime) || pt.UTC().Year() > 9999) {
		t.Fatalf("decoded a publish time the ledger cannot hold: %v", pt)
	}
	id, err := gate.Identify(r, msg)
	if err != nil {
		if _, ok := err.(*gate.IdentityError); !ok {
			t.Fatalf("route %s: identify failed with %T: %v", r.Name, err, err)
		}
		return
	}
	for name, v := range map[string]string{"key": id.Key, "scope key": id.ScopeKey, "message id": msg.MessageID, "source": msg.Source} {
		if why := gate.Unstorable(v); why != "" {
			t.Fatalf("route %s: identified, but the %s %s: %q", r.Name, name, why, v)
		}
	}
	if r.Key.Kind == gate.KeyJSONPointer && !r.Key.Hashed {
		notReplaced(t, msg.Data, "route "+r.Name+": key", id.Key)
	}
	// A hashed key hides what it was drawn from: the value itself, before
	// hashing, must have been as storable and as exact as any other key, or
	// two private keys that differ only in a replaced byte hash alike.
	if r.Key.Hashed {
		raw, ok := "", false
		switch r.Key.Kind {
		case gate.KeyAttribute:
			raw, ok = msg.Attributes[r.Key.Name]
		case gate.KeyJSONPointer:
			var doc any
			dec := json.NewDecoder(bytes.NewReader(msg.Data))
			dec.UseNumber()
			if dec.Decode(&doc) == nil {
				if v, err := gate.ResolvePointer(doc, r.Key.Name); err == nil {
					raw, ok = v.(string)
				}
			}
		}
		if !ok {
			return
		}
		if why := gate.Unstorable(raw); why != "" {
			t.Fatalf("route %s: identified, but the private key before hashing %s: %q", r.Name, why, raw)
		}
		body := msg.Data
		if r.Key.Kind == gate.KeyAttribute {
			body = msg.Envelope
		}
		if len(body) > 0 {
			notReplaced(t, body, "route "+r.Name+": private key", raw)
		}
	}
}

// FuzzDecodePubSubUnwrapped decodes unwrapped pushes and checks the promise
// of the unwrapped form: the wrapped envelope it is re-expressed as decodes to
// the same identity and fingerprint under every route.
func FuzzDecodePubSubUnwrapped(f *testing.F) {
	f.Add([]byte(`{"order":{"id":"9"},"amount":1}`), "projects/p/subscriptions/s", "m-1", "2026-01-01T00:00:00Z", "event_type", "created", "ORDER_ID", "42")
	f.Add([]byte(""), "s", "m-2", "", "region", "eu", "note", "x")
	f.Add([]byte("raw bytes \x00\xff"), "s", "m-3", "yesterday", "Content-Type", "text/plain", "X-Forwarded-For", "1.2.3.4")
	f.Add([]byte("x"), "", "m-4", "", "a", "b", "c", "d")
	f.Add([]byte("x"), "s", "m\x00", "", "order_id", "1", "c", "d")
	f.Add([]byte("x"), "s\xff", "m", "", "order_id", "\x00", "event_type", "\xc3\x28")
	f.Add([]byte(`{"order":{"id":"\u0000"}}`), "s", "m", "0000-01-01T00:00:00Z", "order_id", "\xff", "c", "d")
	// Invalid UTF-8 and NUL in each identity position the headers and body
	// carry: the id, the subscription, the key attribute (private on one
	// route) and the key pointer (private on another).
	f.Add([]byte("x"), "s", "c1-ff-\xfe", "", "order_id", "1", "c", "d")
	f.Add([]byte("x"), "s\x00", "m", "", "order_id", "1", "c", "d")
	f.Add([]byte("x"), "s", "m", "", "order_id", "7\x00", "c", "d")
	f.Add([]byte("{\"order\":{\"id\":\"o-\xff\"}}"), "s", "m", "", "order_id", "1", "c", "d")
	f.Add([]byte(`{"order":{"id":"o-\udcff"}}`), "s", "m", "", "order_id", "1", "c", "d")
	f.Fuzz(func(t *testing.T, body []byte, sub, id, published, k1, v1, k2, v2 string) {
		h := http.Header{}
		set := func(k, v string) {
			if k != "" {
				h.Add(k, v)
			}
		}
		set(hdrPubSubSubscription, sub)
		set(hdrPubSubMessageID, id)
		set(hdrPubSubPublishTime, published)
		set(k1, v1)
		set(k2, v2)
		for _, route := range fuzzRoutes {
			msg, err := decodePubSubUnwrapped(h, route, body)
			if err != nil {
				if _, ok := err.(*Rejection); !ok {
					t.Fatalf("error is not a Rejection: %v", err)
				}
				continue
			}
			wrapped, err := decodePubSub(msg.Envelope)
			if err != nil {
				t.Fatalf("the re-enveloped message does not decode: %v\n%s", err, msg.Envelope)
			}
			a, errA := gate.Identify(route, msg)
			b, errB := gate.Identify(route, wrapped)
			if (errA == nil) != (errB == nil) || a != b {
				t.Fatalf("route %s: unwrapped %+v (%v), wrapped %+v (%v)", route.Name, a, errA, b, errB)
			}
			identifiedIsStorable(t, route, msg)
		}
	})
}

// FuzzDecodeSNS runs an SNS body through everything before the gate:
// parsing, the header checks and the conversion to a message, and the raw
// delivery form.
func FuzzDecodeSNS(f *testing.F) {
	names, _ := filepath.Glob("../testdata/sns/*.json")
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			f.Fatal(err)
		}
		typ := brokerauth.SNSNotification
		if strings.Contains(n, "confirmation") {
			typ = brokerauth.SNSSubscriptionConfirmation
		}
		f.Add(b, typ, "", "")
	}
	f.Add([]byte(`{"Type":"Notification","MessageId":"1","TopicArn":"a","Timestamp":"2026-01-01T00:00:00Z","Message":"m","MessageAttributes":{"traceparent":{"Type":"String","Value":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}}`), "Notification", "1", "a")
	f.Add([]byte(`raw body`), "Notification", "id-1", "arn:aws:sns:us-east-1:123456789012:t")
	f.Add([]byte(`{"Type":"Notification","MessageId":"1\u0000","TopicArn":"a","Timestamp":"2026-01-01T00:00:00Z","Message":"m"}`), "Notification", "", "")
	f.Add([]byte("{\"Type\":\"Notification\",\"MessageId\":\"1\",\"TopicArn\":\"a\xff\",\"Timestamp\":\"2026-01-01T00:00:00Z\",\"Message\":\"m\"}"), "Notification", "", "")
	f.Add([]byte(`{"Type":"Notification","MessageId":"1","TopicArn":"a","Timestamp":"0000-01-01T00:00:00Z","Message":"m"}`), "Notification", "", "")
	f.Add([]byte(`raw body`), "Notification", "id\x00", "arn:aws:sns:us-east-1:123456789012:t\xff")
	// What decoding would replace with U+FFFD, in every identity position:
	// MessageId, TopicArn, the Message a pointer keys into, an attribute.
	f.Add([]byte(`{"Type":"Notification","MessageId":"c1-\udcff","TopicArn":"a","Timestamp":"2026-01-01T00:00:00Z","Message":"m"}`), "Notification", "", "")
	f.Add([]byte("{\"Type\":\"Notification\",\"MessageId\":\"c1-ff-\xfe\",\"TopicArn\":\"a\",\"Timestamp\":\"2026-01-01T00:00:00Z\",\"Message\":\"m\"}"), "Notification", "", "")
	f.Add([]byte(`{"Type":"Notification","MessageId":"1","TopicArn":"arn:aws:sns:us-east-1:1:\ud800","Timestamp":"2026-01-01T00:00:00Z","Message":"m"}`), "Notification", "", "")
	f.Add([]byte(`{"Type":"Notification","MessageId":"1","TopicArn":"a","Timestamp":"2026-01-01T00:00:00Z","Message":"{\"order\":{\"id\":\"\udcfe\"}}"}`), "Notification", "", "")
	f.Add([]byte(`{"Type":"Notification","MessageId":"1","TopicArn":"a","Timestamp":"2026-01-01T00:00:00Z","Message":"m","MessageAttributes":{"order_id":{"Type":"String","Value":"7\udbff"}}}`), "Notification", "", "")
	f.Add([]byte("{\"Type\":\"Notification\",\"MessageId\":\"1\",\"TopicArn\":\"a\",\"Timestamp\":\"2026-01-01T00:00:00Z\",\"Message\":\"m\",\"MessageAttributes\":{\"order_id\":{\"Type\":\"String\",\"Value\":\"7\x00\xff\"}}}"), "Notification", "", "")
	f.Add([]byte(`raw body \udcff`), "Notification", "c1-ff-\xff", "arn:aws:sns:us-east-1:123456789012:t")
	// NUL where the seeds above put invalid UTF-8: the TopicArn, the key
	// pointer's value in Message, the raw delivery's topic header.
	f.Add([]byte(`{"Type":"Notification","MessageId":"1","TopicArn":"arn:aws:sns:us-east-1:1:t\u0000","Timestamp":"2026-01-01T00:00:00Z","Message":"m"}`), "Notification", "", "")
	f.Add([]byte(`{"Type":"Notification","MessageId":"1","TopicArn":"a","Timestamp":"2026-01-01T00:00:00Z","Message":"{\"order\":{\"id\":\"\\u0000\"}}"}`), "Notification", "", "")
	f.Add([]byte("{\"Type\":\"Notification\",\"MessageId\":\"1\",\"TopicArn\":\"a\",\"Timestamp\":\"2026-01-01T00:00:00Z\",\"Message\":\"{\\\"order\\\":{\\\"id\\\":\\\"\xff\\\"}}\"}"), "Notification", "", "")
	f.Add([]byte(`raw body`), "Notification", "id-2", "arn:aws:sns:us-east-1:123456789012:t\x00")
	f.Add([]byte("{\"order\":{\"id\":\"\x00\xff\"}}"), "Notification", "id-3", "arn:aws:sns:us-east-1:123456789012:t")
	f.Fuzz(func(t *testing.T, body []byte, typ, id, topic string) {
		h := http.Header{}
		h.Set(hdrSNSType, typ)
		h.Set(hdrSNSMessageID, id)
		h.Set(hdrSNSTopic, topic)
		if raw, err := decodeSNSRaw(h, body); err == nil {
			if raw.MessageID != id || raw.Source != topic || string(raw.Data) != string(body) {
				t.Fatalf("raw delivery decoded as %+v", raw)
			}
			for _, r := range fuzzRoutes {
				identifiedIsStorable(t, r, raw)
			}
		}
		m, err := brokerauth.ParseSNSMessage(body)
		if err != nil {
			if brokerauth.KindOf(err) != brokerauth.Malformed {
				t.Fatalf("parse error of kind %v", brokerauth.KindOf(err))
			}
			return
		}
		_ = m.StringToSign()
		if err := checkSNSHeaders(h, m); err != nil {
			if fromAuth(err).status != http.StatusBadRequest {
				t.Fatalf("header mismatch answered %+v", fromAuth(err))
			}
			return
		}
		if m.Type != brokerauth.SNSNotification {
			return
		}
		msg, err := snsToMessage(m, body)
		if err != nil {
			return
		}
		if msg.Source != m.TopicArn || msg.MessageID != m.MessageID || string(msg.Data) != m.Message || msg.PublishTime.IsZero() {
			t.Fatalf("notification decoded as %+v", msg)
		}
		notReplaced(t, body, "MessageId", msg.MessageID)
		notReplaced(t, body, "TopicArn", msg.Source)
		notReplaced(t, body, "Message", string(msg.Data))
		for k, v := range msg.Attributes {
			notReplaced(t, body, "attribute", k+"="+v)
		}
		if a, ok := m.MessageAttributes["traceparent"]; ok && msg.TraceParent != a.Value {
			t.Fatalf("traceparent attribute %q became %q", a.Value, msg.TraceParent)
		}
		for _, r := range fuzzRoutes {
			identifiedIsStorable(t, r, msg)
		}
	})
}
