package config

import (
	"reflect"
	"slices"
	"strings"

	"github.com/ackgate/ackgate/gate"
)

// RouteFileVocabulary is the routes file's vocabulary: the keys each
// section of a route may hold ("" is the route itself; nested sections are
// named by their key, such as "effect" or "operation_key") and the values
// each enumerated field may take ("shape", "effect.body_mode", ...). It is
// read from the same types and enums ParseRoutes decodes with, so that a
// check written elsewhere (the Helm chart validates its routes when it is
// rendered) can be held to it by a test instead of drifting.
func RouteFileVocabulary() (fields, enums map[string][]string) {
	fields = map[string][]string{}
	var walk func(section string, t reflect.Type)
	walk = func(section string, t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if key == "" || key == "-" {
				continue
			}
			fields[section] = append(fields[section], key)
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				walk(key, ft)
			}
		}
		slices.Sort(fields[section])
	}
	walk("", reflect.TypeFor[routeSpec]())
	enums = map[string][]string{
		"broker":             values(brokers.values),
		"shape":              values(shapes.values),
		"dead_letter":        values(deadLetters.values),
		"operation_key.kind": values(keyKinds.values),
		"effect.body_mode":   values(bodyModes.values),
		"pubsub_mode":        values(pubsubModes.values),
		"auth":               values([]gate.Auth{gate.AuthNone, gate.AuthOIDC, gate.AuthSNSSignature, gate.AuthBasic}),
		"effect.evidence":    values([]gate.EvidenceKind{gate.EvidenceResultID, gate.EvidenceStatusOnly}),
	}
	return fields, enums
}

func values[T ~string](vs []T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	slices.Sort(out)
	return out
}
