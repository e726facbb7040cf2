package gate

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// A poison record keeps nothing the ledger cannot hold and nothing of the
// body, and the same message redelivered has the same fingerprint.
func TestNewPoisonIsMinimized(t *testing.T) {
	r := &Route{Name: "orders", DeadLetter: DeadLetterGateway}
	at := time.Unix(1700000000, 0)
	m := &Message{Broker: BrokerPubSub, Source: "projects/p/subscriptions/s", MessageID: "m-1",
		Data: []byte("BODY-MARKER"), Attributes: map[string]string{"b": "2", "a": "1"}, BrokerAttempt: 1}
	p := NewPoison(r, BrokerPubSub, m, nil, "", "no usable identity: key \x00\xff "+strings.Repeat("x", 400), at)
	if p.Route != "orders" || p.MessageID != "m-1" || !p.Acked || !p.At.Equal(at) || !strings.HasPrefix(p.Fingerprint, "px_") ||
		len(p.Reason) > MaxReason || !utf8.ValidString(p.Reason) || strings.ContainsRune(p.Reason, 0) {
		t.Fatalf("poison %+v", p)
	}
	redelivered := *m
	redelivered.BrokerAttempt = 2
	redelivered.Attributes = map[string]string{"a": "1", "b": "2"}
	if q := NewPoison(r, BrokerPubSub, &redelivered, nil, "", "again", at); q.Fingerprint != p.Fingerprint {
		t.Errorf("a redelivery's fingerprint %s differs from %s", q.Fingerprint, p.Fingerprint)
	}
	other := *m
	other.Data = []byte("other")
	if q := NewPoison(r, BrokerPubSub, &other, nil, "", "x", at); q.Fingerprint == p.Fingerprint {
		t.Error("another message has the same fingerprint")
	}

	for _, id := range []string{"m\x00", "m\xff", strings.Repeat("m", 257)} {
		if q := NewPoison(r, BrokerPubSub, nil, []byte("{"), id, "x", at); q.MessageID != "" {
			t.Errorf("message id %q kept as %q", id, q.MessageID)
		}
	}
	a := NewPoison(&Route{Name: "orders", DeadLetter: DeadLetterBroker}, BrokerSNS, nil, []byte("{nope"), "m-2", "x", at)
	b := NewPoison(r, BrokerSNS, nil, []byte("{nope!"), "m-2", "x", at)
	if a.Acked || a.MessageID != "m-2" || a.Fingerprint == b.Fingerprint {
		t.Errorf("undecoded bodies: %+v, %+v", a, b)
	}
}
