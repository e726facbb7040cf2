package gate

import (
	"errors"
	"strings"
	"testing"
)

// A key drawn from a private field is identified by its keyed hash: the same
// message always gets the same operation, the clear key appears nowhere in
// the identity, and another secret makes another key.
func TestIdentifyHashesPrivateKeys(t *testing.T) {
	t.Parallel()
	secret := []byte("key-hash-secret-0123456789abcdef0123")
	r := &Route{Name: "r", Tenant: "t", Key: KeySource{Kind: KeyJSONPointer, Name: "/email", Hashed: true},
		Fingerprint: FingerprintSpec{Version: 1, Data: true}, HashKey: NewKeyHash(secret)}
	m := &Message{Broker: BrokerPubSub, MessageID: "m", Source: "s", Data: []byte(`{"email":"alice@example.com"}`)}
	a, err := Identify(r, m)
	if err != nil {
		t.Fatal(err)
	}
	secret[0] = 'X' // the hash keeps its own copy of the secret
	b, _ := Identify(r, m)
	if a != b || !strings.HasPrefix(a.Key, HashedKeyPrefix) || len(a.Key) != len(HashedKeyPrefix)+64 {
		t.Fatalf("identities %+v and %+v", a, b)
	}
	for _, s := range []string{a.Key, a.ScopeKey, a.OperationID, a.IdempotencyKey} {
		if strings.Contains(s, "alice") {
			t.Errorf("identity field %q carries the clear key", s)
		}
	}
	other := *r
	other.HashKey = NewKeyHash([]byte("another-secret-0123456789abcdef0123"))
	if c, _ := Identify(&other, m); c.Key == a.Key || c.OperationID == a.OperationID {
		t.Error("another secret makes the same key")
	}
	plain := *r
	plain.Key.Hashed, plain.HashKey = false, nil
	if p, _ := Identify(&plain, m); p.Key != "alice@example.com" {
		t.Errorf("an unhashed key is %q", p.Key)
	}

	// A route that should hash but cannot is the gateway's fault, not the
	// message's: not an identity error, which would refuse the message.
	broken := *r
	broken.HashKey = nil
	_, err = Identify(&broken, m)
	var ie *IdentityError
	if err == nil || errors.As(err, &ie) {
		t.Fatalf("no hash: %v, want an error that is not an identity error", err)
	}
}
