package handlers_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/authtest"
)

const (
	pushAudience = "https://gateway.test/v1/push/pubsub/orders"
	pushAccount  = "push@project.iam.gserviceaccount.com"
)

func oidcRouteYAML(jwksURL, extra string) string {
	return `
  - name: orders
    broker: pubsub
    auth: oidc
    oidc:
      audience: ` + pushAudience + `
      service_account: ` + pushAccount + `
      jwks_url: ` + jwksURL + `
    shape: unsafe
` + extra + `    effect:
      url: {{DOWN}}/effects
      result_id_header: X-Result-Id
`
}

func (e *env) pushWith(path string, m msg, authorization string) (reply, http.Header) {
	e.t.Helper()
	h := map[string]string{"Content-Type": "application/json"}
	if authorization != "" {
		h["Authorization"] = authorization
	}
	return e.post(path, envelope(m), h)
}

// Documented statuses: 401 for a token that is missing or does not verify
// (alg none, unknown key, expired, ...), 403 for a genuine token that is not
// for this route (audience, service account, unverified email). Pub/Sub
// redelivers both; nothing is executed or recorded for either.
func TestPubSubOIDC(t *testing.T) {
	t.Parallel()
	iss := authtest.NewIssuer(t)
	e := newEnv(t, false, oidcRouteYAML(iss.JWKSURL(), ""))

	claims := func(mutate func(c map[string]any)) map[string]any {
		c := iss.Claims(pushAudience, pushAccount)
		if mutate != nil {
			mutate(c)
		}
		return c
	}
	cases := []struct {
		name  string
		token string
		want  int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"wrong audience", iss.Token(t, claims(func(c map[string]any) { c["aud"] = "https://gateway.test/v1/push/pubsub/other" })), http.StatusForbidden},
		{"wrong email", iss.Token(t, claims(func(c map[string]any) { c["email"] = "intruder@project.iam.gserviceaccount.com" })), http.StatusForbidden},
		{"unverified email", iss.Token(t, claims(func(c map[string]any) { c["email_verified"] = false })), http.StatusForbidden},
		{"expired", iss.Token(t, claims(func(c map[string]any) {
			c["iat"] = time.Now().Add(-2 * time.Hour).Unix()
			c["exp"] = time.Now().Add(-time.Hour).Unix()
		})), http.StatusUnauthorized},
		{"unknown key", authtest.SignJWT(t, iss.Stranger, map[string]any{"alg": "RS256", "typ": "JWT", "kid": "rotated-away"}, claims(nil)), http.StatusUnauthorized},
		{"alg none", authtest.SignJWT(t, nil, map[string]any{"alg": "none", "typ": "JWT"}, claims(nil)), http.StatusUnauthorized},
		{"other issuer", iss.Token(t, claims(func(c map[string]any) { c["iss"] = "https://issuer.test" })), http.StatusUnauthorized},
	}
	for i, c := range cases {
		auth := ""
		if c.token != "" {
			auth = "Bearer " + c.token
		}
		r, h := e.pushWith("/v1/push/pubsub/orders", msg{ID: "m-" + c.name, Data: "x"}, auth)
		if r.Status != c.want || r.Body.Decision != gate.Reject {
			t.Errorf("case %d %s: %d %+v, want %d reject", i, c.name, r.Status, r.Body, c.want)
		}
		if c.want == http.StatusUnauthorized && !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: 401 without a Bearer challenge", c.name)
		}
	}
	e.nothingRecorded("after refused tokens")

	r, _ := e.pushWith("/v1/push/pubsub/orders", msg{ID: "m-ok", Data: "x"}, "Bearer "+iss.Token(t, claims(nil)))
	wantStatus(t, r, http.StatusNoContent)
	if n := e.down.effectCalls.Load(); n != 1 {
		t.Fatalf("downstream called %d times", n)
	}
}

// A key set that cannot be fetched is a nack, not a verdict.
func TestPubSubOIDCKeySetDown(t *testing.T) {
	t.Parallel()
	iss := authtest.NewIssuer(t)
	down := authtest.NewRecorder(t) // answers 200 with a body that is no key set
	e := newEnv(t, false, oidcRouteYAML(down.URL()+"/certs", ""))
	tok := iss.Token(t, iss.Claims(pushAudience, pushAccount))
	r, _ := e.pushWith("/v1/push/pubsub/orders", msg{ID: "m-1", Data: "x"}, "Bearer "+tok)
	wantStatus(t, r, http.StatusServiceUnavailable)
	e.nothingRecorded("with the key set down")
}

// The legacy verification token is an extra check, compared in constant time
// and taken from the environment.
func TestPubSubVerificationToken(t *testing.T) {
	t.Parallel()
	iss := authtest.NewIssuer(t)
	e := newEnvWith(t, false, oidcRouteYAML(iss.JWKSURL(), "    verification_token_env: ORDERS_PUSH_TOKEN\n"),
		map[string]string{"ORDERS_PUSH_TOKEN": "legacy-token-123"})
	bearer := "Bearer " + iss.Token(t, iss.Claims(pushAudience, pushAccount))
	for _, path := range []string{"/v1/push/pubsub/orders", "/v1/push/pubsub/orders?token=wrong", "/v1/push/pubsub/orders?token="} {
		r, _ := e.pushWith(path, msg{ID: "m-1", Data: "x"}, bearer)
		wantStatus(t, r, http.StatusUnauthorized)
	}
	e.nothingRecorded("without the right token")
	r, _ := e.pushWith("/v1/push/pubsub/orders?token=legacy-token-123", msg{ID: "m-1", Data: "x"}, bearer)
	wantStatus(t, r, http.StatusNoContent)

	// GET /v1/routes shows which variable holds the token, never the token.
	var list struct {
		Routes []map[string]any `json:"routes"`
	}
	if code := e.adminGet("/v1/routes", &list); code != http.StatusOK {
		t.Fatalf("admin status %d", code)
	}
	if len(list.Routes) != 1 || list.Routes[0]["verification_token_env"] != "ORDERS_PUSH_TOKEN" {
		t.Fatalf("routes = %v", list.Routes)
	}
	var one map[string]any
	e.adminGet("/v1/routes/orders", &one)
	for _, v := range []map[string]any{list.Routes[0], one} {
		if s := strings.Join(flatten(v), " "); strings.Contains(s, "legacy-token-123") {
			t.Fatalf("route contract holds the token: %s", s)
		}
	}
}

func flatten(v any) []string {
	switch x := v.(type) {
	case map[string]any:
		var out []string
		for k, e := range x {
			out = append(out, k)
			out = append(out, flatten(e)...)
		}
		return out
	case []any:
		var out []string
		for _, e := range x {
			out = append(out, flatten(e)...)
		}
		return out
	case string:
		return []string{x}
	}
	return nil
}
