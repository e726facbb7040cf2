package brokerauth_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/internal/authtest"
)

const (
	audience = "https://gateway.example/v1/push/pubsub/orders"
	account  = "push@project.iam.gserviceaccount.com"
)

func TestOIDCPushTokens(t *testing.T) {
	t.Parallel()
	iss := authtest.NewIssuer(t)
	v := brokerauth.NewOIDCVerifier(brokerauth.OIDCOptions{DefaultJWKSURL: iss.JWKSURL()})
	want := brokerauth.PushExpectation{Audience: audience, ServiceAccount: account}
	claims := func(mutate func(c map[string]any)) map[string]any {
		c := iss.Claims(audience, account)
		if mutate != nil {
			mutate(c)
		}
		return c
	}
	rs256 := map[string]any{"alg": "RS256", "typ": "JWT", "kid": iss.KID}

	id, err := v.VerifyPush(context.Background(), "Bearer "+iss.Token(t, claims(nil)), want)
	if err != nil || id.Email != account {
		t.Fatalf("valid token: %+v, %v", id, err)
	}
	if _, err := v.VerifyPush(context.Background(), "bearer "+iss.Token(t, claims(func(c map[string]any) { c["iss"] = "accounts.google.com"; c["aud"] = []string{"other", audience} })), want); err != nil {
		t.Fatalf("scheme-less issuer, audience list: %v", err)
	}

	hs := func() string {
		h, _ := json.Marshal(map[string]any{"alg": "HS256", "typ": "JWT", "kid": iss.KID})
		c, _ := json.Marshal(claims(nil))
		s := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c)
		mac := hmac.New(sha256.New, []byte("secret"))
		mac.Write([]byte(s))
		return s + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
	}()
	cases := []struct {
		name  string
		token string
		want  brokerauth.Kind
	}{
		{"wrong audience", iss.Token(t, claims(func(c map[string]any) { c["aud"] = "https://elsewhere" })), brokerauth.Forbidden},
		{"wrong email", iss.Token(t, claims(func(c map[string]any) { c["email"] = "other@p.iam.gserviceaccount.com" })), brokerauth.Forbidden},
		{"unverified email", iss.Token(t, claims(func(c map[string]any) { c["email_verified"] = false })), brokerauth.Forbidden},
		{"email_verified as a string", iss.Token(t, claims(func(c map[string]any) { c["email_verified"] = "true" })), brokerauth.Forbidden},
		{"no email_verified", iss.Token(t, claims(func(c map[string]any) { delete(c, "email_verified") })), brokerauth.Forbidden},
		{"expired", iss.Token(t, claims(func(c map[string]any) { c["exp"] = time.Now().Add(-time.Minute).Unix() })), brokerauth.Unauthenticated},
		{"no exp", iss.Token(t, claims(func(c map[string]any) { delete(c, "exp") })), brokerauth.Unauthenticated},
		{"not yet valid", iss.Token(t, claims(func(c map[string]any) { c["nbf"] = time.Now().Add(time.Hour).Unix() })), brokerauth.Unauthenticated},
		{"issued in the future", iss.Token(t, claims(func(c map[string]any) { c["iat"] = time.Now().Add(time.Hour).Unix() })), brokerauth.Unauthenticated},
		{"no iat", iss.Token(t, claims(func(c map[string]any) { delete(c, "iat") })), brokerauth.Unauthenticated},
		{"other issuer", iss.Token(t, claims(func(c map[string]any) { c["iss"] = "https://evil.example" })), brokerauth.Unauthenticated},
		{"unknown key", authtest.SignJWT(t, iss.Stranger, map[string]any{"alg": "RS256", "kid": "stranger"}, claims(nil)), brokerauth.Unauthenticated},
		{"known kid, wrong key", authtest.SignJWT(t, iss.Stranger, rs256, claims(nil)), brokerauth.Unauthenticated},
		{"no kid, wrong key", authtest.SignJWT(t, iss.Stranger, map[string]any{"alg": "RS256"}, claims(nil)), brokerauth.Unauthenticated},
		{"alg none", authtest.SignJWT(t, nil, map[string]any{"alg": "none", "kid": iss.KID}, claims(nil)), brokerauth.Unauthenticated},
		{"HS256 with a made-up secret", hs, brokerauth.Unauthenticated},
		{"tampered claims", tamper(iss.Token(t, claims(nil))), brokerauth.Unauthenticated},
		{"not a JWT", "abc.def", brokerauth.Unauthenticated},
	}
	for _, c := range cases {
		_, err := v.VerifyPush(context.Background(), "Bearer "+c.token, want)
		if brokerauth.KindOf(err) != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
	for _, h := range []string{"", "Bearer", "Bearer ", "Basic abc", iss.Token(t, claims(nil))} {
		if _, err := v.VerifyPush(context.Background(), h, want); brokerauth.KindOf(err) != brokerauth.Unauthenticated {
			t.Errorf("Authorization %q: %v, want Unauthenticated", h, err)
		}
	}
	// The unknown kid made at most one extra fetch; the rest were served from
	// the cache.
	if n := iss.Hits(); n > 2 {
		t.Errorf("key set fetched %d times", n)
	}
}

// tamper swaps the claims of a signed token for other claims.
func tamper(tok string) string {
	parts := strings.Split(tok, ".")
	c, _ := json.Marshal(map[string]any{"iss": "https://accounts.google.com", "aud": audience, "email": account,
		"email_verified": true, "iat": time.Now().Unix(), "exp": time.Now().Add(2 * time.Hour).Unix()})
	parts[1] = base64.RawURLEncoding.EncodeToString(c)
	return strings.Join(parts, ".")
}

// A key set that cannot be fetched is not the sender's fault: Unavailable,
// until keys are cached; once cached they are used through an outage.
func TestOIDCKeySetUnavailable(t *testing.T) {
	t.Parallel()
	iss := authtest.NewIssuer(t)
	var down atomic.Bool
	down.Store(true)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		resp, err := http.Get(iss.JWKSURL())
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		var body json.RawMessage
		_ = json.NewDecoder(resp.Body).Decode(&body)
		_, _ = w.Write(body)
	}))
	t.Cleanup(proxy.Close)
	now := time.Now()
	var clock atomic.Int64
	v := brokerauth.NewOIDCVerifier(brokerauth.OIDCOptions{
		DefaultJWKSURL: proxy.URL, KeysMaxAge: time.Minute,
		Now: func() time.Time { return now.Add(time.Duration(clock.Load())) },
	})
	want := brokerauth.PushExpectation{Audience: audience, ServiceAccount: account}
	tok := "Bearer " + iss.Token(t, iss.Claims(audience, account))
	if _, err := v.VerifyPush(context.Background(), tok, want); brokerauth.KindOf(err) != brokerauth.Unavailable {
		t.Fatalf("key set down, nothing cached: %v, want Unavailable", err)
	}
	down.Store(false)
	clock.Add(int64(2 * time.Second)) // past the pause after a failed fetch
	if _, err := v.VerifyPush(context.Background(), tok, want); err != nil {
		t.Fatalf("key set back: %v", err)
	}
	down.Store(true)
	clock.Add(int64(2 * time.Minute)) // the keys are stale now
	if _, err := v.VerifyPush(context.Background(), tok, want); err != nil {
		t.Fatalf("stale keys during an outage: %v", err)
	}
	// Per-route key set URLs are honoured.
	other := brokerauth.PushExpectation{Audience: audience, ServiceAccount: account, JWKSURL: iss.JWKSURL()}
	if _, err := v.VerifyPush(context.Background(), tok, other); err != nil {
		t.Fatalf("route's own JWKS URL: %v", err)
	}
}
