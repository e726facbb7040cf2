package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"
)

// Sessions are stateless: the cookie carries who logged in, a random session
// id and its expiry, signed with HMAC-SHA256 under a key derived from the
// admin token. Any replica that holds the same admin token accepts a cookie
// another replica issued, so the console needs no shared store and works
// behind a load balancer without affinity. Changing the admin token ends
// every session at once. A session cannot be revoked alone before it
// expires; logging out deletes the browser's cookie, and the expiry bounds
// what a stolen cookie is worth.

const (
	sessionCookie = "ackgate_console"
	// loginCookie holds the login form's one-time CSRF value: the form is
	// posted before any session exists.
	loginCookie = "ackgate_console_login"
	loginTTL    = 15 * time.Minute
	cookiePath  = "/console/"
)

// session is what a signed cookie says.
type session struct {
	// Name is who logged in, as they gave it: the console records its
	// actions as "console:" + Name.
	Name string `json:"n"`
	ID   string `json:"s"`
	Exp  int64  `json:"e"`
}

type keyring struct {
	session []byte
	csrf    []byte
}

// newKeyring derives the signing keys from the admin token, each under its
// own label, so that no key doubles for another purpose and nothing derived
// from a cookie can reveal the token.
func newKeyring(adminToken string) keyring {
	derive := func(label string) []byte {
		m := hmac.New(sha256.New, []byte(adminToken))
		m.Write([]byte("ackgate console " + label + " v1"))
		return m.Sum(nil)
	}
	return keyring{session: derive("session"), csrf: derive("csrf")}
}

func (k keyring) mac(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

var errBadSession = errors.New("no valid session")

// seal signs s into a cookie value.
func (k keyring) seal(s session) string {
	payload, _ := json.Marshal(s)
	p := base64.RawURLEncoding.EncodeToString(payload)
	return p + "." + base64.RawURLEncoding.EncodeToString(k.mac(k.session, p))
}

// open verifies a cookie value and its expiry.
func (k keyring) open(v string, now time.Time) (session, error) {
	p, sig, ok := strings.Cut(v, ".")
	if !ok {
		return session{}, errBadSession
	}
	// Strict: one MAC has exactly one spelling, so a cookie cannot be
	// altered in its unused low bits and still pass.
	got, err := base64.RawURLEncoding.Strict().DecodeString(sig)
	if err != nil || !hmac.Equal(got, k.mac(k.session, p)) {
		return session{}, errBadSession
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(p)
	if err != nil {
		return session{}, errBadSession
	}
	var s session
	if err := json.Unmarshal(raw, &s); err != nil || s.ID == "" || s.Name == "" {
		return session{}, errBadSession
	}
	if now.Unix() >= s.Exp {
		return session{}, errBadSession
	}
	return s, nil
}

// csrfToken is the session's CSRF token: bound to the session id, so a
// token taken from one session is worth nothing in another, and never
// stored anywhere but in the pages the session is shown.
func (k keyring) csrfToken(s session) string {
	return base64.RawURLEncoding.EncodeToString(k.mac(k.csrf, "session", s.ID))
}

func (k keyring) checkCSRF(s session, got string) bool {
	want := k.csrfToken(s)
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func randomID() string {
	var b [18]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func (c *Console) setCookie(w http.ResponseWriter, name, value string, ttl time.Duration) {
	ck := &http.Cookie{
		Name: name, Value: value, Path: cookiePath,
		HttpOnly: true, Secure: !c.o.AllowHTTP, SameSite: http.SameSiteStrictMode,
	}
	if ttl > 0 {
		ck.MaxAge = int(ttl / time.Second)
		ck.Expires = c.o.Now().Add(ttl)
	} else {
		ck.MaxAge = -1
		ck.Expires = time.Unix(1, 0)
	}
	http.SetCookie(w, ck)
}
