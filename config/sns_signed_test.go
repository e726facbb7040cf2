package config_test

import (
	"strings"
	"testing"

	"github.com/ackgate/ackgate/config"
)

// SNS signs MessageId, TopicArn, Subject, Message and Timestamp, but not
// MessageAttributes: a captured message replayed with a changed attribute
// still verifies. A route whose operation key or fingerprint reads an
// attribute would take such a replay for a new operation, so it is refused at
// start; keys and fingerprints drawn from the message id or the signed
// Message are accepted.
func TestSNSKeysAndFingerprintsComeFromSignedFields(t *testing.T) {
	t.Parallel()
	sns := func(mutate func(m map[string]any)) map[string]any {
		m := baseRoute()
		m["broker"] = "sns"
		m["auth"] = "sns_signature"
		m["sources"] = []string{"arn:aws:sns:us-east-1:123456789012:orders"}
		mutate(m)
		return m
	}
	refused := []struct {
		name  string
		route map[string]any
		want  string
	}{
		{"key from an attribute", sns(func(m map[string]any) {
			m["operation_key"] = map[string]any{"kind": "attribute", "name": "order_id"}
		}), `route "r": operation_key.kind: attribute: SNS does not sign MessageAttributes`},
		{"fingerprint over attributes", sns(func(m map[string]any) {
			m["fingerprint"] = map[string]any{"attributes": []string{"event_type"}}
		}), `route "r": fingerprint.attributes: SNS does not sign MessageAttributes`},
		{"both, on an unauthenticated route", sns(func(m map[string]any) {
			m["auth"] = "none"
			m["operation_key"] = map[string]any{"kind": "attribute", "name": "order_id"}
			m["fingerprint"] = map[string]any{"data": false, "attributes": []string{"order_id"}}
		}), `route "r": fingerprint.attributes: SNS does not sign MessageAttributes`},
	}
	for _, c := range refused {
		_, err := config.ParseRoutes(routesYAML(t, c.route))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: ParseRoutes = %v, want an error containing %q", c.name, err, c.want)
		}
	}

	accepted := map[string]map[string]any{
		"message id key": sns(func(map[string]any) {}),
		"pointer key and fingerprint": sns(func(m map[string]any) {
			m["operation_key"] = map[string]any{"kind": "json_pointer", "name": "/order/id"}
			m["fingerprint"] = map[string]any{"data": false, "pointers": []string{"/order/id", "/amount"}}
		}),
	}
	for name, route := range accepted {
		if _, err := config.ParseRoutes(routesYAML(t, route)); err != nil {
			t.Errorf("%s: ParseRoutes = %v", name, err)
		}
	}
	// Pub/Sub signs nothing in the message either, but its push token
	// authenticates the whole request, attributes included.
	pubsub := baseRoute()
	pubsub["operation_key"] = map[string]any{"kind": "attribute", "name": "order_id"}
	pubsub["fingerprint"] = map[string]any{"attributes": []string{"event_type"}}
	if _, err := config.ParseRoutes(routesYAML(t, pubsub)); err != nil {
		t.Errorf("pubsub route keyed by an attribute: %v", err)
	}
}
