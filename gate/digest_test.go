package gate

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// referenceDigest is digest as first written: each part streamed into the
// hash behind its length, the sum base32-encoded and lower-cased. Ids
// already in ledgers were made so; digest must spell them the same.
func referenceDigest(prefix string, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	enc := base32.StdEncoding.WithPadding(base32.NoPadding)
	return prefix + strings.ToLower(enc.EncodeToString(h.Sum(nil))[:26])
}

func TestDigestSpellsIdsAsBefore(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 600) // past digest's stack buffer
	cases := [][]string{
		nil,
		{""},
		{"tenant/orders/message_id:/m-1"},
		{"tenant/orders/message_id:/m-1", "v1:abcdefghijklmnopqrstuvwxyz"},
		{"fp", "1", "data", long, "attr", "k", "true", "v"},
		{long, long},
		{"\x00\xff", "é"},
	}
	for _, parts := range cases {
		if got, want := digest("op_", parts...), referenceDigest("op_", parts...); got != want {
			t.Errorf("digest(%q) = %s, want %s", parts, got, want)
		}
	}
	// Pinned, so that a change to both spellings at once is seen too.
	if got, want := digest("op_", "t/orders/message_id:/m-1"), "op_i3fg6jepo7sylommg4nfooatf3"; got != want {
		t.Errorf("digest = %s, want %s", got, want)
	}
}

// referenceFingerprint is Fingerprint as first written, on referenceDigest.
func referenceFingerprint(spec *FingerprintSpec, m *Message) string {
	parts := []string{"fp", strconv.Itoa(spec.Version)}
	if spec.Data {
		parts = append(parts, "data", string(m.Data))
	}
	attrs := slices.Clone(spec.Attributes)
	slices.Sort(attrs)
	for _, a := range attrs {
		v, ok := m.Attributes[a]
		parts = append(parts, "attr", a, strconv.FormatBool(ok), v)
	}
	for _, p := range spec.Pointers {
		v, err := pointerValue(m.Data, p)
		if err != nil {
			panic(err)
		}
		parts = append(parts, "ptr", p, v)
	}
	return referenceDigest("v"+strconv.Itoa(spec.Version)+":", parts...)
}

func TestFingerprintSpellsAsBefore(t *testing.T) {
	t.Parallel()
	m := &Message{Data: []byte(`{"amount": 12, "customer": {"id": "c-1"}}`),
		Attributes: map[string]string{"kind": "order", "region": "eu"}}
	big := &Message{Data: []byte(`{"pad":"` + strings.Repeat("p", 700) + `"}`), Attributes: m.Attributes}
	for _, c := range []struct {
		spec FingerprintSpec
		m    *Message
	}{
		{FingerprintSpec{Version: 1, Data: true}, m},
		{FingerprintSpec{Version: 2, Data: true, Attributes: []string{"region", "kind", "absent"}}, m},
		{FingerprintSpec{Version: 1, Attributes: []string{"kind"}}, m},
		{FingerprintSpec{Version: 3, Pointers: []string{"/customer/id", "/amount"}}, m},
		{FingerprintSpec{Version: 1, Data: true, Attributes: []string{"region"}}, big},
		{FingerprintSpec{Version: 12345, Data: true, Pointers: []string{"/pad"}}, big},
	} {
		got, err := Fingerprint(&c.spec, c.m)
		if err != nil {
			t.Fatal(err)
		}
		if want := referenceFingerprint(&c.spec, c.m); got != want {
			t.Errorf("Fingerprint(%+v) = %s, want %s", c.spec, got, want)
		}
	}
}
