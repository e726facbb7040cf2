package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ackgate/ackgate/config"
)

// The console's settings: on by default, Secure cookies unless told
// otherwise, a bounded session, and a trace viewer URL that has a place for
// the id.
func TestConsoleSettings(t *testing.T) {
	t.Parallel()
	s, err := config.LoadSettings(env(nil))
	if err != nil || !s.ConsoleEnabled || s.ConsoleAllowHTTP || s.ConsoleSessionTTL != 8*time.Hour || s.ConsoleTraceURL != "" {
		t.Fatalf("defaults: %+v, %v", s, err)
	}
	s, err = config.LoadSettings(env(map[string]string{
		"GATEWAY_CONSOLE_ENABLED": "false", "GATEWAY_CONSOLE_ALLOW_HTTP": "true", "GATEWAY_CONSOLE_SESSION_TTL": "30m",
		"GATEWAY_CONSOLE_TRACE_URL": "http://jaeger.local:16686/trace/{trace_id}",
	}))
	if err != nil || s.ConsoleEnabled || !s.ConsoleAllowHTTP || s.ConsoleSessionTTL != 30*time.Minute ||
		s.ConsoleTraceURL != "http://jaeger.local:16686/trace/{trace_id}" {
		t.Fatalf("set: %+v, %v", s, err)
	}
	for k, bad := range map[string]string{
		"GATEWAY_CONSOLE_SESSION_TTL": "169h",
		"GATEWAY_CONSOLE_TRACE_URL":   "https://jaeger.local/trace/",
		"GATEWAY_CONSOLE_ENABLED":     "maybe",
	} {
		if _, err := config.LoadSettings(env(map[string]string{k: bad})); err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%q: %v, want an error naming it", k, bad, err)
		}
	}
	for _, bad := range []string{"0s", "-1h"} {
		if _, err := config.LoadSettings(env(map[string]string{"GATEWAY_CONSOLE_SESSION_TTL": bad})); err == nil {
			t.Errorf("session TTL %q accepted", bad)
		}
	}
	if _, err := config.LoadSettings(env(map[string]string{"GATEWAY_CONSOLE_TRACE_URL": "javascript:alert({trace_id})"})); err == nil {
		t.Error("a javascript: trace URL was accepted")
	}
}
