package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"time"
)

// Sessions live on the server, in a store every replica shares
// (SessionStore; storage.ConsoleSessions keeps them in Redis). The cookie
// carries only a random session id; the store keeps, under a hash of that
// id, who logged in (the name of the admin credential they gave), that
// credential's version, the session's CSRF token and its expiry. So a
// session ends for good when its operator logs out (the record is
// deleted), when the credential's token is rotated or removed (the version
// no longer matches), or when it expires; and someone who can read the
// store cannot turn what it holds into a cookie.
//
// The login form's CSRF value is a nonce kept in the store when the form is
// shown and taken from it, once, when the form is posted: a form can be
// posted once, on any replica.

const (
	sessionCookie = "ackgate_console"
	// loginCookie holds the login form's nonce: the form is posted before
	// any session exists, so its CSRF check is the cookie and the form
	// agreeing, and the nonce being unused.
	loginCookie = "ackgate_console_login"
	loginTTL    = 15 * time.Minute
	cookiePath  = "/console/"
)

// SessionStore keeps console sessions and login nonces where every replica
// finds them. Keys are the console's own ("session:HASH", "login:HASH");
// values expire after ttl.
type SessionStore interface {
	Put(ctx context.Context, key string, value []byte, ttl time.Duration) error
	// Get returns the value under key; found is false when there is none.
	Get(ctx context.Context, key string) (value []byte, found bool, err error)
	// Take returns the value under key and deletes it, so that of two
	// calls for one key at most one finds it.
	Take(ctx context.Context, key string) (value []byte, found bool, err error)
	Delete(ctx context.Context, key string) error
}

// session is a logged-in operator as the store keeps it. ID is the
// cookie's value and is not stored.
type session struct {
	// Name is the admin credential's name: the console records its actions
	// as "console:" + Name.
	Name string `json:"n"`
	// Version is the credential's version at login (admincred.Set.Version).
	Version string `json:"v"`
	CSRF    string `json:"c"`
	Exp     int64  `json:"e"`

	ID string `json:"-"`
}

var errBadSession = errors.New("no valid session")

// storeKey is where the store keeps what belongs to secret (a session id, a
// login nonce): a hash of it, so the store's contents are not cookies.
func storeKey(kind, secret string) string {
	sum := sha256.Sum256([]byte(kind + "\x00" + secret))
	return kind + ":" + hex.EncodeToString(sum[:])
}

// newSession starts a session for the credential name at version.
func (c *Console) newSession(ctx context.Context, name, version string) (session, error) {
	s := session{Name: name, Version: version, CSRF: randomID(), Exp: c.o.Now().Add(c.o.SessionTTL).Unix(), ID: randomID()}
	b, err := json.Marshal(s)
	if err != nil {
		return session{}, err
	}
	return s, c.o.Sessions.Put(ctx, storeKey("session", s.ID), b, c.o.SessionTTL)
}

// openSession finds the session of a cookie value. errBadSession: there is
// none, it expired, or its credential's token has changed since (then it is
// deleted); any other error is the store's.
func (c *Console) openSession(ctx context.Context, id string) (session, error) {
	if id == "" || len(id) > 128 {
		return session{}, errBadSession
	}
	b, found, err := c.o.Sessions.Get(ctx, storeKey("session", id))
	if err != nil {
		return session{}, err
	}
	if !found {
		return session{}, errBadSession
	}
	var s session
	if err := json.Unmarshal(b, &s); err != nil || s.Name == "" || s.CSRF == "" {
		return session{}, errBadSession
	}
	s.ID = id
	if c.o.Now().Unix() >= s.Exp {
		return session{}, errBadSession
	}
	if v := c.o.Credentials.Version(s.Name); v == "" || subtle.ConstantTimeCompare([]byte(v), []byte(s.Version)) != 1 {
		// Rotated or removed: the session ends with the token it was
		// opened with.
		_ = c.o.Sessions.Delete(ctx, storeKey("session", id))
		return session{}, errBadSession
	}
	return s, nil
}

// endSession deletes a session: its cookie opens nothing any more, on any
// replica.
func (c *Console) endSession(ctx context.Context, id string) error {
	return c.o.Sessions.Delete(ctx, storeKey("session", id))
}

// checkCSRF compares a form's CSRF value with the session's own.
func (s session) checkCSRF(got string) bool {
	return s.CSRF != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.CSRF)) == 1
}

// newLoginNonce keeps a fresh nonce for one login form.
func (c *Console) newLoginNonce(ctx context.Context) (string, error) {
	nonce := randomID()
	return nonce, c.o.Sessions.Put(ctx, storeKey("login", nonce), []byte{1}, loginTTL)
}

// takeLoginNonce reports whether nonce was issued and not used yet, and
// uses it up.
func (c *Console) takeLoginNonce(ctx context.Context, nonce string) (bool, error) {
	if nonce == "" || len(nonce) > 128 {
		return false, nil
	}
	_, found, err := c.o.Sessions.Take(ctx, storeKey("login", nonce))
	return found, err
}

func randomID() string {
	var b [32]byte
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
