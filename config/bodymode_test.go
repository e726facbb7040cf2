package config_test

import (
	"strings"
	"testing"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/downstream"
	"github.com/ackgate/ackgate/gate"
)

// Every body mode the effect client can encode is a value of
// effect.body_mode, the binary CloudEvents mode among them, on a handoff
// route too; anything else is refused with the choices.
func TestBodyModes(t *testing.T) {
	t.Parallel()
	route := func(shape, mode string) string {
		extra, lookup := "    dedupe_window: 1h\n", ""
		if shape == "handoff" {
			extra, lookup = "    dead_letter: gateway\n", "      lookup_url: http://d/e/{key}\n"
		}
		return "routes:\n  - name: r\n    broker: pubsub\n    auth: none\n    shape: " + shape + "\n" + extra +
			"    effect:\n      url: http://d/e\n      result_id_header: X-Result-Id\n" + lookup + "      body_mode: " + mode + "\n"
	}
	for mode, want := range map[string]gate.BodyMode{
		"raw": gate.BodyRaw, "envelope": gate.BodyEnvelope, "cloudevent": gate.BodyCloudEvent,
		"cloudevent_binary": downstream.BodyCloudEventBinary,
	} {
		routes, err := config.ParseRoutes([]byte(route("idempotent", mode)))
		if err != nil || routes[0].Effect.BodyMode != want {
			t.Errorf("body_mode %s: %v, %v", mode, routes, err)
		}
	}
	if _, err := config.ParseRoutes([]byte(route("handoff", "cloudevent_binary"))); err != nil {
		t.Errorf("a handoff route in cloudevent_binary: %v", err)
	}
	_, err := config.ParseRoutes([]byte(route("idempotent", "xml")))
	if err == nil || !strings.Contains(err.Error(), "cloudevent_binary") {
		t.Errorf("body_mode xml: %v, want the choices listed", err)
	}
}
