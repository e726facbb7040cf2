package seal_test

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/internal/seal"
)

func newKey(t testing.TB, id string) seal.Key {
	t.Helper()
	secret := make([]byte, seal.KeySize)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	k, err := seal.ParseKey(id + ":" + base64.StdEncoding.EncodeToString(secret))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func keyring(t testing.TB, current seal.Key, old ...seal.Key) *seal.Keyring {
	t.Helper()
	k, err := seal.NewKeyring(current, old...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Sealing replaces exactly the private values, each by a sealed string, and
// leaves every other byte of the document as it was; unsealing gives the
// document back byte for byte.
func TestSealRoundTripIsExact(t *testing.T) {
	t.Parallel()
	k := keyring(t, newKey(t, "k1"))
	for _, tc := range []struct {
		name, doc string
		pointers  []string
		secrets   []string // must not be readable in the sealed document
	}{
		{"a string", `{"card":"4242-4242","amount":12}`, []string{"/card"}, []string{"4242-4242"}},
		{"odd spacing kept", "{ \"amount\" : 12 ,\n\t\"card\"  :  \"4242-4242\" }", []string{"/card"}, []string{"4242-4242"}},
		{"a number", `{"pin":123456,"n":1}`, []string{"/pin"}, []string{"123456"}},
		{"a number at the end", `{"n":1,"pin":123456}`, []string{"/pin"}, []string{"123456"}},
		{"an object", `{"payer":{"iban":"DE89 3704","name":"Ann"},"n":1}`, []string{"/payer"}, []string{"DE89 3704", "Ann"}},
		{"nested, and its parent", `{"payer":{"iban":"DE89 3704","name":"Ann"}}`, []string{"/payer/iban", "/payer"}, []string{"DE89 3704", "Ann"}},
		{"in an array", `{"cards":["1111","2222"],"n":[1]}`, []string{"/cards/1"}, []string{"2222"}},
		{"escaped member name", `{"c\u0061rd":"4242-4242"}`, []string{"/card"}, []string{"4242-4242"}},
		{"a member named twice", `{"card":"1111-1111","card":"2222-2222"}`, []string{"/card"}, []string{"1111-1111", "2222-2222"}},
		{"pointer escapes", `{"a/b":{"~c":"s3cr3t-value"}}`, []string{"/a~1b/~0c"}, []string{"s3cr3t-value"}},
		{"non-ASCII and escapes", `{"name":"Zoë \u00e9 \ud83d\ude00 \"q\""}`, []string{"/name"}, []string{"Zoë"}},
		{"absent pointer", `{"n":1}`, []string{"/card", "/n/x", "/list/0"}, nil},
		{"null", `{"card":null}`, []string{"/card"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sealed, err := k.Seal([]byte(tc.doc), tc.pointers, "op_1")
			if err != nil {
				t.Fatal(err)
			}
			if !json.Valid(sealed) {
				t.Fatalf("sealed document is not JSON: %s", sealed)
			}
			for _, s := range tc.secrets {
				if bytes.Contains(sealed, []byte(s)) {
					t.Fatalf("sealed document still holds %q: %s", s, sealed)
				}
			}
			if len(tc.secrets) > 0 && !bytes.Contains(sealed, []byte(seal.Prefix+"k1:")) {
				t.Fatalf("nothing sealed: %s", sealed)
			}
			back, err := k.Unseal(sealed, tc.pointers, "op_1")
			if err != nil || string(back) != tc.doc {
				t.Fatalf("unsealed %q, %v; want %q", back, err, tc.doc)
			}
		})
	}
	// The same value sealed twice differs (a fresh nonce each time).
	a, _ := k.Seal([]byte(`{"card":"4242"}`), []string{"/card"}, "op_1")
	b, _ := k.Seal([]byte(`{"card":"4242"}`), []string{"/card"}, "op_1")
	if bytes.Equal(a, b) {
		t.Fatal("two seals of one value are equal")
	}
}

// A sealed value opens only where it was sealed: under the same context
// (the outbox entry) and pointer, with a key of the ring, unaltered.
func TestSealedValuesOpenOnlyWhereSealed(t *testing.T) {
	t.Parallel()
	k := keyring(t, newKey(t, "k1"))
	doc := []byte(`{"card":"4242","other":"x"}`)
	sealed, err := k.Seal(doc, []string{"/card"}, "op_1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Unseal(sealed, []string{"/card"}, "op_2"); !errors.Is(err, seal.ErrOpen) {
		t.Errorf("another context: %v, want ErrOpen", err)
	}
	var m map[string]string
	_ = json.Unmarshal(sealed, &m)
	moved, _ := json.Marshal(map[string]string{"card": "x", "other": m["card"]})
	if _, err := k.Unseal(moved, []string{"/other"}, "op_1"); !errors.Is(err, seal.ErrOpen) {
		t.Errorf("moved to another pointer: %v, want ErrOpen", err)
	}
	tampered := bytes.Replace(sealed, []byte(m["card"][len(m["card"])-4:]), []byte("AAAA"), 1)
	if _, err := k.Unseal(tampered, []string{"/card"}, "op_1"); !errors.Is(err, seal.ErrOpen) {
		t.Errorf("altered: %v, want ErrOpen", err)
	}
	if _, err := keyring(t, newKey(t, "k1")).Unseal(sealed, []string{"/card"}, "op_1"); !errors.Is(err, seal.ErrOpen) {
		t.Errorf("another secret under the same id: %v, want ErrOpen", err)
	}
	if _, err := k.Unseal(doc, []string{"/card"}, "op_1"); !errors.Is(err, seal.ErrNotSealed) {
		t.Errorf("a clear value: %v, want ErrNotSealed", err)
	}
	if _, err := k.Unseal([]byte(`{"card":12}`), []string{"/card"}, "op_1"); !errors.Is(err, seal.ErrNotSealed) {
		t.Errorf("a clear number: %v, want ErrNotSealed", err)
	}
	// A publisher's value that looks sealed is sealed again like any other,
	// and comes back as it was.
	lookalike := []byte(`{"card":"` + seal.Prefix + `k1:AAAA"}`)
	s2, err := k.Seal(lookalike, []string{"/card"}, "op_1")
	if back, err2 := k.Unseal(s2, []string{"/card"}, "op_1"); err != nil || err2 != nil || !bytes.Equal(back, lookalike) {
		t.Errorf("a look-alike value: %s, %v, %v", back, err, err2)
	}
}

// Rotation: a ring seals with its current key and opens values sealed with
// an older one it holds; a ring without that key cannot.
func TestSealKeyRotation(t *testing.T) {
	t.Parallel()
	k1, k2 := newKey(t, "2026-01"), newKey(t, "2026-07")
	before := keyring(t, k1)
	sealed, err := before.Seal([]byte(`{"card":"4242"}`), []string{"/card"}, "op_1")
	if err != nil {
		t.Fatal(err)
	}
	rotated := keyring(t, k2, k1)
	if back, err := rotated.Unseal(sealed, []string{"/card"}, "op_1"); err != nil || string(back) != `{"card":"4242"}` {
		t.Fatalf("old value after rotation: %s, %v", back, err)
	}
	fresh, _ := rotated.Seal([]byte(`{"card":"4242"}`), []string{"/card"}, "op_1")
	if !bytes.Contains(fresh, []byte(seal.Prefix+"2026-07:")) || rotated.CurrentID() != "2026-07" {
		t.Fatalf("new values are not sealed with the current key: %s", fresh)
	}
	if _, err := keyring(t, k2).Unseal(sealed, []string{"/card"}, "op_1"); !errors.Is(err, seal.ErrOpen) || !strings.Contains(err.Error(), "2026-01") {
		t.Fatalf("the old key dropped: %v, want ErrOpen naming it", err)
	}
	if _, err := seal.NewKeyring(k1, k1); err == nil {
		t.Fatal("a key id given twice was accepted")
	}
}

func TestSealRefusals(t *testing.T) {
	t.Parallel()
	k := keyring(t, newKey(t, "k1"))
	if _, err := k.Seal([]byte(`{"card":"4242"} trailing`), []string{"/card"}, "op"); !errors.Is(err, seal.ErrNotJSON) {
		t.Errorf("not JSON: %v", err)
	}
	if _, err := k.Seal([]byte(`{}`), []string{"card"}, "op"); err == nil {
		t.Error("a pointer without / was accepted")
	}
	if out, err := k.Seal([]byte("not json"), nil, "op"); err != nil || string(out) != "not json" {
		t.Errorf("no pointers: %q, %v", out, err)
	}
	whole := k.SealBytes([]byte("raw \x00 body"), "op")
	if back, err := k.OpenBytes(whole, "op"); err != nil || string(back) != "raw \x00 body" {
		t.Errorf("SealBytes round trip: %q, %v", back, err)
	}
	if _, err := k.OpenBytes(whole, "other"); !errors.Is(err, seal.ErrOpen) {
		t.Errorf("SealBytes in another context: %v", err)
	}
	for _, bad := range []string{"", "nokey", "k1:", "k1:c2hvcnQ=", "bad id:" + base64.StdEncoding.EncodeToString(make([]byte, 32)),
		"k1:" + base64.StdEncoding.EncodeToString(make([]byte, 31)), strings.Repeat("a", 33) + ":" + base64.StdEncoding.EncodeToString(make([]byte, 32))} {
		if _, err := seal.ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) accepted", bad)
		} else if strings.Contains(err.Error(), "c2hvcnQ") {
			t.Errorf("ParseKey quotes the secret: %v", err)
		}
	}
}

// Whatever the document and pointers, Seal either refuses or gives a JSON
// document that Unseal turns back into the original, byte for byte.
func FuzzSealRoundTrip(f *testing.F) {
	k := keyring(f, newKey(f, "k1"))
	f.Add([]byte(`{"card":"4242","n":1}`), "/card", "/n")
	f.Add([]byte(`{"a":{"b":[1,{"c":"d"}]}}`), "/a/b/1/c", "/a")
	f.Add([]byte(`[1,2,{"x":"y"}]`), "/2/x", "/0")
	f.Add([]byte(`{"a":"\ud800","a":1e400}`), "/a", "/b")
	f.Add([]byte("{\"a\":\"\xff\"}"), "/a", "/a/")
	f.Add([]byte(` "s" `), "/", "/x")
	f.Fuzz(func(t *testing.T, doc []byte, p1, p2 string) {
		pointers := []string{p1, p2}
		sealed, err := k.Seal(doc, pointers, "ctx")
		if err != nil {
			return
		}
		if !json.Valid(sealed) {
			t.Fatalf("sealed %q is not JSON: %q", doc, sealed)
		}
		back, err := k.Unseal(sealed, pointers, "ctx")
		if err != nil || !bytes.Equal(back, doc) {
			t.Fatalf("round trip of %q under %q: %q, %v", doc, pointers, back, err)
		}
	})
}
