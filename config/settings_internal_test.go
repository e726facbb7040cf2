package config

import (
	"errors"
	"strings"
	"testing"
)

// Every variable envconfig lists has a parser, and envconfig's list carries
// the names and defaults of the struct tags.
func TestEveryVariableHasAParser(t *testing.T) {
	t.Parallel()
	vars, err := envVars()
	if err != nil {
		t.Fatal(err)
	}
	if len(vars) < 20 {
		t.Fatalf("envconfig listed %d variables: %v", len(vars), vars)
	}
	for _, v := range vars {
		if !strings.HasPrefix(v.key, EnvPrefix+"_") {
			t.Errorf("variable %q lacks the %s_ prefix", v.key, EnvPrefix)
		}
		var s Settings
		// Parse errors are fine here (an empty duration, say); only a
		// variable nobody parses is not.
		if err := s.set(v.key, v.def); errors.Is(err, errNoParser) {
			t.Errorf("%s has no case in Settings.set", v.key)
		}
	}
	want := map[string]string{
		"GATEWAY_LISTEN_ADDR":   ":8080",
		"GATEWAY_OIDC_JWKS_URL": "https://www.googleapis.com/oauth2/v3/certs",
		"GATEWAY_ROUTES_FILE":   "",
		"GATEWAY_DATABASE_URL":  "postgres://ackgate:ackgate@127.0.0.1:5432/ackgate?sslmode=disable",
	}
	for _, v := range vars {
		if def, ok := want[v.key]; ok {
			if v.def != def {
				t.Errorf("%s: default %q, want %q", v.key, v.def, def)
			}
			delete(want, v.key)
		}
	}
	if len(want) != 0 {
		t.Errorf("envconfig did not list %v", want)
	}
	var s Settings
	if err := s.set("GATEWAY_NO_SUCH_THING", "x"); !errors.Is(err, errNoParser) {
		t.Errorf("an unknown variable was parsed: %v", err)
	}
}

func TestParseList(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string][]string{
		"a":           {"a"},
		"a,b":         {"a", "b"},
		" a , b , ":   {"a", "b"},
		",,":          nil,
		"h1:1,h2:2,,": {"h1:1", "h2:2"},
	} {
		if got := parseList(raw); strings.Join(got, "|") != strings.Join(want, "|") || len(got) != len(want) {
			t.Errorf("parseList(%q) = %q, want %q", raw, got, want)
		}
	}
}
