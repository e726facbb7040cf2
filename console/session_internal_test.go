package console

import (
	"strings"
	"testing"
	"time"
)

// A session cookie is good until its expiry, on any replica with the same
// admin token, and worth nothing once altered, expired, or under another
// token.
func TestSessionCookies(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	k := newKeyring("admin-token-0123456789")
	s := session{Name: "erin", ID: randomID(), Exp: now.Add(time.Hour).Unix()}
	v := k.seal(s)

	if got, err := newKeyring("admin-token-0123456789").open(v, now); err != nil || got != s {
		t.Fatalf("another replica with the same token: %+v, %v", got, err)
	}
	if _, err := k.open(v, now.Add(time.Hour)); err == nil {
		t.Fatal("an expired session was accepted")
	}
	if _, err := newKeyring("rotated-token-0123456789").open(v, now); err == nil {
		t.Fatal("a session outlived the admin token it was issued under")
	}
	payload, sig, _ := strings.Cut(v, ".")
	for _, bad := range []string{"", v + "x", payload, "." + sig, flip(payload) + "." + sig, payload + "." + flip(sig),
		k.seal(session{Name: "", ID: "x", Exp: s.Exp}), k.seal(session{Name: "x", ID: "", Exp: s.Exp})} {
		if _, err := k.open(bad, now); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	// The same MAC spelt with its unused low bits set is not the same
	// cookie: only the canonical encoding opens.
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, sig[len(sig)-1])
	if alt := payload + "." + sig[:len(sig)-1] + string(alphabet[last^1]); alt != v {
		if _, err := k.open(alt, now); err == nil {
			t.Errorf("accepted a non-canonical signature %q", alt)
		}
	}
	// The CSRF token is the session's own, and never the session key's
	// MAC of the same input.
	other := session{Name: "erin", ID: randomID(), Exp: s.Exp}
	if !k.checkCSRF(s, k.csrfToken(s)) || k.checkCSRF(other, k.csrfToken(s)) || k.checkCSRF(s, "") {
		t.Fatal("CSRF tokens are not bound to their session")
	}
	if k.csrfToken(s) == k.csrfToken(other) {
		t.Fatal("two sessions share a CSRF token")
	}
}

func TestCheckTraceURL(t *testing.T) {
	t.Parallel()
	for tmpl, ok := range map[string]bool{
		"": true, "https://t.example/trace/{trace_id}": true, "http://t.example/?q={trace_id}&x=1": true,
		"https://t.example/trace/": false, "javascript:{trace_id}": false, "/trace/{trace_id}": false,
	} {
		if err := CheckTraceURL(tmpl); (err == nil) != ok {
			t.Errorf("%q: %v", tmpl, err)
		}
	}
}

func TestCheckName(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{"dana": true, "Dana O'Neil": true, "": false, "a\x00b": false, "tab\there": false,
		strings.Repeat("x", 65): false, "ünïcode": true} {
		if (checkName(name) == "") != ok {
			t.Errorf("%q: %q", name, checkName(name))
		}
	}
}

// flip changes the last character of s.
func flip(s string) string {
	last := byte('A')
	if s[len(s)-1] == 'A' {
		last = 'B'
	}
	return s[:len(s)-1] + string(last)
}
