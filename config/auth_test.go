package config_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/gate"
)

const topicARN = "arn:aws:sns:us-east-1:123456789012:orders"

func snsRoute(auth string) map[string]any {
	m := baseRoute()
	m["broker"] = "sns"
	m["auth"] = auth
	m["sources"] = []string{topicARN}
	return m
}

func oidcRoute() map[string]any {
	m := baseRoute()
	m["auth"] = "oidc"
	m["oidc"] = map[string]any{"audience": "https://gw.example/v1/push/pubsub/r", "service_account": "push@p.iam.gserviceaccount.com"}
	return m
}

func TestAuthenticatedRoutes(t *testing.T) {
	t.Parallel()
	o := oidcRoute()
	o["name"] = "o"
	o["verification_token_env"] = "ORDERS_PUSH_TOKEN"
	o["pubsub_mode"] = "unwrapped"
	o["oidc"].(map[string]any)["jwks_url"] = "http://127.0.0.1:1/certs"
	s := snsRoute("sns_signature")
	s["name"] = "s"
	b := snsRoute("basic")
	b["name"] = "b"
	b["raw_delivery"] = true
	b["basic_auth"] = map[string]any{"username_env": "SNS_USER", "password_env": "SNS_PASSWORD"}
	routes, err := config.ParseRoutes(routesYAML(t, o, s, b))
	if err != nil {
		t.Fatal(err)
	}
	ro, rs, rb := routes[0], routes[1], routes[2]
	if ro.Auth != gate.AuthOIDC || ro.OIDC == nil || ro.OIDC.ServiceAccount != "push@p.iam.gserviceaccount.com" ||
		ro.OIDC.JWKSURL != "http://127.0.0.1:1/certs" || ro.VerificationTokenEnv != "ORDERS_PUSH_TOKEN" || ro.PubSubMode != gate.PubSubUnwrapped {
		t.Errorf("oidc route = %+v", ro)
	}
	if rs.Auth != gate.AuthSNSSignature || rs.PubSubMode != "" || rs.RawDelivery {
		t.Errorf("sns route = %+v", rs)
	}
	if rb.Auth != gate.AuthBasic || !rb.RawDelivery || rb.BasicAuth == nil || rb.BasicAuth.PasswordEnv != "SNS_PASSWORD" {
		t.Errorf("basic route = %+v", rb)
	}
	if w := config.AuthNoneWarnings(routes); len(w) != 0 {
		t.Errorf("warnings for authenticated routes: %q", w)
	}

	// Secrets are resolved from the environment, by name, and never show up
	// in a route's contract.
	getenv := env(map[string]string{"ORDERS_PUSH_TOKEN": "tok-secret-1", "SNS_USER": "sns", "SNS_PASSWORD": "pw-secret-2"})
	creds, err := config.ResolveCredentials(routes, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if !creds["o"].VerificationToken.Matches("tok-secret-1") || !creds["b"].BasicPassword.Matches("pw-secret-2") ||
		creds["s"].VerificationToken.IsSet() {
		t.Errorf("credentials = %+v", creds)
	}
	j, _ := json.Marshal(routes)
	for _, secret := range []string{"tok-secret-1", "pw-secret-2"} {
		if strings.Contains(string(j), secret) {
			t.Errorf("route JSON holds a secret: %s", j)
		}
	}
	if !strings.Contains(string(j), `"verification_token_env":"ORDERS_PUSH_TOKEN"`) {
		t.Errorf("route JSON does not name the token's variable: %s", j)
	}

	_, err = config.ResolveCredentials(routes, env(map[string]string{"SNS_USER": "sns"}))
	for _, want := range []string{
		`route "o": verification_token_env: environment variable ORDERS_PUSH_TOKEN is not set`,
		`route "b": basic_auth.password_env: environment variable SNS_PASSWORD is not set`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ResolveCredentials with variables missing = %v, want %q", err, want)
		}
	}
}

func TestAuthChangesTheContract(t *testing.T) {
	t.Parallel()
	version := func(m map[string]any) string {
		routes, err := config.ParseRoutes(routesYAML(t, m))
		if err != nil {
			t.Fatal(err)
		}
		return routes[0].ContractVersion
	}
	base := version(oidcRoute())
	other := oidcRoute()
	other["oidc"].(map[string]any)["audience"] = "https://gw.example/other"
	unwrapped := oidcRoute()
	unwrapped["pubsub_mode"] = "unwrapped"
	explicit := oidcRoute()
	explicit["pubsub_mode"] = "wrapped"
	if version(other) == base || version(unwrapped) == base {
		t.Error("audience or body form did not change the contract version")
	}
	if version(explicit) != base {
		t.Error("writing out the default body form changed the contract version")
	}
}

func TestInvalidAuth(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		m    func() map[string]any
		want string
	}{
		{"oidc on sns", func() map[string]any {
			m := snsRoute("oidc")
			m["oidc"] = oidcRoute()["oidc"]
			return m
		}, `route "r": auth: oidc verifies Pub/Sub push tokens`},
		{"sns_signature on pubsub", func() map[string]any { m := baseRoute(); m["auth"] = "sns_signature"; return m }, `route "r": auth: sns_signature is for sns routes`},
		{"basic on pubsub", func() map[string]any { m := baseRoute(); m["auth"] = "basic"; return m }, `route "r": auth: basic is for sns routes`},
		{"oidc without block", func() map[string]any { m := baseRoute(); m["auth"] = "oidc"; return m }, `route "r": oidc: required for auth: oidc`},
		{"oidc block without oidc", func() map[string]any { m := oidcRoute(); m["auth"] = "none"; return m }, `route "r": oidc: only applies to auth: oidc`},
		{"oidc audience missing", func() map[string]any {
			m := oidcRoute()
			delete(m["oidc"].(map[string]any), "audience")
			return m
		}, `route "r": oidc.audience: required`},
		{"oidc account not an email", func() map[string]any {
			m := oidcRoute()
			m["oidc"].(map[string]any)["service_account"] = "push"
			return m
		}, `route "r": oidc.service_account: "push" must be`},
		{"oidc account with a name", func() map[string]any {
			m := oidcRoute()
			m["oidc"].(map[string]any)["service_account"] = "Push <push@p.iam.gserviceaccount.com>"
			return m
		}, `route "r": oidc.service_account:`},
		{"oidc jwks url", func() map[string]any {
			m := oidcRoute()
			m["oidc"].(map[string]any)["jwks_url"] = "file:///etc/keys"
			return m
		}, `route "r": oidc.jwks_url:`},
		{"token env name", func() map[string]any { m := oidcRoute(); m["verification_token_env"] = "MY-TOKEN"; return m }, `route "r": verification_token_env: "MY-TOKEN" is not an environment variable name`},
		{"token on sns", func() map[string]any { m := snsRoute("sns_signature"); m["verification_token_env"] = "T"; return m }, `route "r": verification_token_env: only applies to pubsub routes`},
		{"sns_signature without sources", func() map[string]any { m := snsRoute("sns_signature"); delete(m, "sources"); return m }, `route "r": sources: required for auth: sns_signature`},
		{"basic without credentials", func() map[string]any { return snsRoute("basic") }, `route "r": basic_auth: required for auth: basic`},
		{"basic credentials without basic", func() map[string]any {
			m := snsRoute("sns_signature")
			m["basic_auth"] = map[string]any{"username_env": "U", "password_env": "P"}
			return m
		}, `route "r": basic_auth: only applies to auth: basic`},
		{"basic env names", func() map[string]any {
			m := snsRoute("basic")
			m["basic_auth"] = map[string]any{"username_env": "U", "password_env": ""}
			return m
		}, `route "r": basic_auth.password_env: "" is not an environment variable name`},
		{"raw delivery with signatures", func() map[string]any { m := snsRoute("sns_signature"); m["raw_delivery"] = true; return m }, `route "r": raw_delivery: raw messages carry no signature; accept them only with auth: basic`},
		{"raw delivery without auth", func() map[string]any { m := snsRoute("none"); m["raw_delivery"] = true; return m }, `route "r": raw_delivery: raw messages carry no signature`},
		{"raw delivery on pubsub", func() map[string]any { m := baseRoute(); m["raw_delivery"] = true; return m }, `route "r": raw_delivery: only applies to sns routes`},
		{"pubsub mode unknown", func() map[string]any { m := baseRoute(); m["pubsub_mode"] = "raw"; return m }, `route "r": pubsub_mode: "raw" is not wrapped or unwrapped`},
		{"pubsub mode on sns", func() map[string]any { m := snsRoute("sns_signature"); m["pubsub_mode"] = "wrapped"; return m }, `route "r": pubsub_mode: only applies to pubsub routes`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := config.ParseRoutes(routesYAML(t, tc.m()))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error:\n%v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

func TestBrokerAuthSettings(t *testing.T) {
	t.Parallel()
	s, err := config.LoadSettings(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if s.OIDCJWKSURL != "https://www.googleapis.com/oauth2/v3/certs" || len(s.SNSTrustedURLPrefixes) != 0 {
		t.Errorf("defaults: jwks %q, trusted prefixes %q (must be empty)", s.OIDCJWKSURL, s.SNSTrustedURLPrefixes)
	}
	s, err = config.LoadSettings(env(map[string]string{
		"GATEWAY_OIDC_JWKS_URL":            "http://127.0.0.1:9/certs",
		"GATEWAY_SNS_TRUSTED_URL_PREFIXES": "http://127.0.0.1:4100/, http://localhost:4100/",
	}))
	if err != nil || s.OIDCJWKSURL != "http://127.0.0.1:9/certs" || len(s.SNSTrustedURLPrefixes) != 2 {
		t.Fatalf("settings = %+v, %v", s, err)
	}
	_, err = config.LoadSettings(env(map[string]string{
		"GATEWAY_OIDC_JWKS_URL":            "keys.json",
		"GATEWAY_SNS_TRUSTED_URL_PREFIXES": "http://127.0.0.1:4100",
	}))
	for _, want := range []string{"GATEWAY_OIDC_JWKS_URL:", `GATEWAY_SNS_TRUSTED_URL_PREFIXES: trusted URL prefix "http://127.0.0.1:4100" must end with /`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error = %v, want %q", err, want)
		}
	}
}
