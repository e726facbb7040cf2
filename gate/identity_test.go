package gate

import (
	"errors"
	"strings"
	"testing"
)

// What the ledger keeps as text must be storable: a NUL byte or invalid UTF-8
// in the message id, the source or the operation key is a message without a
// usable identity, not a ledger failure.
func TestIdentityRefusesTextTheLedgerCannotStore(t *testing.T) {
	t.Parallel()
	byID := &Route{Name: "r", Tenant: "t", Fingerprint: FingerprintSpec{Version: 1, Data: true}}
	byAttr := &Route{Name: "r", Tenant: "t", Key: KeySource{Kind: KeyAttribute, Name: "k"}, Fingerprint: FingerprintSpec{Version: 1, Data: true}}
	byPtr := &Route{Name: "r", Tenant: "t", Key: KeySource{Kind: KeyJSONPointer, Name: "/k"}, Fingerprint: FingerprintSpec{Version: 1, Data: true}}
	byHashed := &Route{Name: "r", Tenant: "t", Key: KeySource{Kind: KeyAttribute, Name: "k", Hashed: true},
		Fingerprint: FingerprintSpec{Version: 1, Data: true}, HashKey: NewKeyHash([]byte("key-hash-secret-0123456789abcdef0123"))}
	byPtrObj := &Route{Name: "r", Tenant: "t", Key: KeySource{Kind: KeyJSONPointer, Name: "/k"}, Fingerprint: FingerprintSpec{Version: 1, Data: true}}
	byFP := &Route{Name: "r", Tenant: "t", Key: KeySource{Kind: KeyJSONPointer, Name: "/k"}, Fingerprint: FingerprintSpec{Version: 1, Pointers: []string{"/amount"}}}
	msg := func(id, source, attr, data string) *Message {
		return &Message{Broker: BrokerPubSub, MessageID: id, Source: source, Attributes: map[string]string{"k": attr}, Data: []byte(data)}
	}
	for _, tc := range []struct {
		name  string
		route *Route
		msg   *Message
		want  string // "" for a usable identity
	}{
		{"plain", byID, msg("m-1", "projects/p/subscriptions/s", "", "x"), ""},
		{"non-ASCII is fine", byAttr, msg("m-1", "s", "Bestellung-ä-😀", "x"), ""},
		{"NUL in the message id", byID, msg("m\x00-1", "s", "", "x"), "operation key contains a NUL byte"},
		{"NUL in a message id that is not the key", byAttr, msg("m\x00-1", "s", "a", "x"), "message id contains a NUL byte"},
		{"NUL in the source", byID, msg("m-1", "s\x00", "", "x"), "source contains a NUL byte"},
		{"NUL in an attribute key", byAttr, msg("m-1", "s", "a\x00b", "x"), "operation key contains a NUL byte"},
		{"invalid UTF-8 in an attribute key", byAttr, msg("m-1", "s", "a\xffb", "x"), "operation key is not valid UTF-8"},
		{"NUL in a JSON pointer key", byPtr, msg("m-1", "s", "", `{"k": "a\u0000b"}`), "operation key contains a NUL byte"},
		{"NUL in a private key", byHashed, msg("m-1", "s", "a\x00b", "x"), "operation key contains a NUL byte"},
		{"invalid UTF-8 in a private key", byHashed, msg("m-1", "s", "a\xffb", "x"), "operation key is not valid UTF-8"},
		{"invalid UTF-8 in a JSON pointer key", byPtr, msg("m-1", "s", "", "{\"k\": \"a\xffb\"}"), "is not valid UTF-8"},
		{"a lone surrogate in a JSON pointer key", byPtr, msg("m-1", "s", "", `{"k": "a\udcffb"}`), "unpaired surrogate"},
		{"a lone surrogate inside a JSON pointer value", byPtrObj, msg("m-1", "s", "", `{"k": {"x": ["\ud800"]}}`), "unpaired surrogate"},
		{"U+FFFD itself is a character", byPtr, msg("m-1", "s", "", `{"k": "a\ufffdb"}`), ""},
		{"a surrogate pair is a character", byPtr, msg("m-1", "s", "", `{"k": "a\ud83d\ude00b"}`), ""},
		{"invalid UTF-8 elsewhere in the data", byPtr, msg("m-1", "s", "", "{\"k\": \"a\", \"x\": \"\xff\"}"), ""},
		{"invalid UTF-8 in a fingerprint pointer", byFP, msg("m-1", "s", "", "{\"k\": \"a\", \"amount\": \"1\xff\"}"), "fingerprint: pointer /amount: value is not valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Identify(tc.route, tc.msg)
			var ie *IdentityError
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Identify: %v", err)
			case tc.want != "" && (!errors.As(err, &ie) || !strings.Contains(ie.Reason, tc.want)):
				t.Fatalf("Identify = %v, want an IdentityError saying %q", err, tc.want)
			}
		})
	}
}
