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
	r := &Route{Name: "orders", Broker: BrokerPubSub, DeadLetter: DeadLetterGateway}
	at := time.Unix(1700000000, 0)
	m := &Message{Broker: BrokerPubSub, Source: "projects/p/subscriptions/s", MessageID: "m-1",
		Data: []byte("BODY-MARKER"), Attributes: map[string]string{"b": "2", "a": "1"}, BrokerAttempt: 1}
	p := NewPoison(r, m, nil, "", "no usable identity: key \x00\xff "+strings.Repeat("x", 400), at)
	if p.Route != "orders" || p.MessageID != "m-1" || !p.Acked || !p.At.Equal(at) || !strings.HasPrefix(p.Fingerprint, "px_") ||
		len(p.Reason) > MaxReason || !utf8.ValidString(p.Reason) || strings.ContainsRune(p.Reason, 0) {
		t.Fatalf("poison %+v", p)
	}
	redelivered := *m
	redelivered.BrokerAttempt = 2
	redelivered.Attributes = map[string]string{"a": "1", "b": "2"}
	if q := NewPoison(r, &redelivered, nil, "", "again", at); q.Fingerprint != p.Fingerprint {
		t.Errorf("a redelivery's fingerprint %s differs from %s", q.Fingerprint, p.Fingerprint)
	}
	other := *m
	other.Data = []byte("other")
	if q := NewPoison(r, &other, nil, "", "x", at); q.Fingerprint == p.Fingerprint {
		t.Error("another message has the same fingerprint")
	}

	for _, id := range []string{"m\x00", "m\xff", strings.Repeat("m", 257)} {
		if q := NewPoison(r, nil, []byte("{"), id, "x", at); q.MessageID != "" {
			t.Errorf("message id %q kept as %q", id, q.MessageID)
		}
	}
	a := NewPoison(&Route{Name: "orders", Broker: BrokerSNS, DeadLetter: DeadLetterBroker}, nil, []byte("{nope"), "m-2", "x", at)
	b := NewPoison(r, nil, []byte("{nope!"), "m-2", "x", at)
	if a.Acked || a.Broker != BrokerSNS || a.MessageID != "m-2" || a.Fingerprint == b.Fingerprint {
		t.Errorf("undecoded bodies: %+v, %+v", a, b)
	}
}
