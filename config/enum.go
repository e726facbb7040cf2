package config

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ackgate/ackgate/downstream"
	"github.com/ackgate/ackgate/gate"
)

// enum is the set of values an enumerated route field may take, and what an
// empty one means: def, or, when def is empty, a required field left out.
// Every enumerated field is read by parse, so each answers a mistake in the
// same words.
type enum[T ~string] struct {
	def    T
	values []T
}

// The routes file's enumerated fields. auth is not among them: a route must
// name its authenticator, and its errors say how to ask for none.
var (
	brokers     = enum[gate.Broker]{values: []gate.Broker{gate.BrokerPubSub, gate.BrokerSNS}}
	shapes      = enum[gate.Shape]{values: []gate.Shape{gate.ShapeIdempotent, gate.ShapeLookup, gate.ShapeUnsafe, gate.ShapeRepeatable, gate.ShapeHandoff, gate.ShapeLocal}}
	deadLetters = enum[gate.DeadLetterPolicy]{def: gate.DeadLetterBroker, values: []gate.DeadLetterPolicy{gate.DeadLetterGateway, gate.DeadLetterBroker}}
	keyKinds    = enum[gate.KeyKind]{def: gate.KeyMessageID, values: []gate.KeyKind{gate.KeyMessageID, gate.KeyAttribute, gate.KeyJSONPointer}}
	bodyModes   = enum[gate.BodyMode]{def: gate.BodyRaw, values: []gate.BodyMode{gate.BodyRaw, gate.BodyEnvelope, gate.BodyCloudEvent, downstream.BodyCloudEventBinary}}
	pubsubModes = enum[gate.PubSubMode]{def: gate.PubSubWrapped, values: []gate.PubSubMode{gate.PubSubWrapped, gate.PubSubUnwrapped}}
	// effectMethods are compared after upper-casing: methods are
	// case-insensitive in the file and upper case on the wire.
	effectMethods = enum[string]{def: DefaultEffectMethod, values: []string{"DELETE", "GET", "PATCH", "POST", "PUT"}}
)

// parse reads raw as field: empty takes the default or is reported as
// required, an unlisted value is reported with the choices. ok is false when
// something was reported.
func (e enum[T]) parse(errs *routeErrs, field, raw string) (v T, ok bool) {
	switch {
	case raw == "" && e.def != "":
		return e.def, true
	case raw == "":
		errs.add(field, "required: %s", e.choices())
		return "", false
	case slices.Contains(e.values, T(raw)):
		return T(raw), true
	}
	errs.add(field, "%q is not %s", raw, e.choices())
	return T(raw), false
}

// choices spells the values the way an error message lists them: "a, b or c".
func (e enum[T]) choices() string {
	s := make([]string, len(e.values))
	for i, v := range e.values {
		s[i] = string(v)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return fmt.Sprintf("%s or %s", strings.Join(s[:len(s)-1], ", "), s[len(s)-1])
}
