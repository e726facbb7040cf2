package config

import (
	"errors"
	"slices"
	"testing"
)

type color string

func TestEnumParse(t *testing.T) {
	t.Parallel()
	colors := []color{"red", "green", "blue"}
	for _, tc := range []struct {
		name    string
		enum    enum[color]
		raw     string
		want    color
		wantOK  bool
		wantErr string
	}{
		{"empty takes the default", enum[color]{def: "red", values: colors}, "", "red", true, ""},
		{"a listed value is kept", enum[color]{def: "red", values: colors}, "blue", "blue", true, ""},
		{"the default may be written out", enum[color]{def: "red", values: colors}, "red", "red", true, ""},
		{"empty without a default is required", enum[color]{values: colors}, "", "", false, "paint: required: red, green or blue"},
		{"an unlisted value names the choices", enum[color]{def: "red", values: colors}, "Blue", "Blue", false, `paint: "Blue" is not red, green or blue`},
		{"an unlisted value without a default", enum[color]{values: colors}, "pink", "pink", false, `paint: "pink" is not red, green or blue`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var errs routeErrs
			got, ok := tc.enum.parse(&errs, "paint", tc.raw)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("parse(%q) = %q, %v; want %q, %v", tc.raw, got, ok, tc.want, tc.wantOK)
			}
			switch err := errors.Join(errs...); {
			case tc.wantErr == "" && err != nil:
				t.Errorf("parse(%q) reported %v", tc.raw, err)
			case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr):
				t.Errorf("parse(%q) reported %v, want %s", tc.raw, err, tc.wantErr)
			}
		})
	}
}

func TestEnumChoices(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		values []color
		want   string
	}{
		{nil, ""},
		{[]color{"a"}, "a"},
		{[]color{"a", "b"}, "a or b"},
		{[]color{"a", "b", "c"}, "a, b or c"},
	} {
		if got := (enum[color]{values: tc.values}).choices(); got != tc.want {
			t.Errorf("choices(%q) = %q, want %q", tc.values, got, tc.want)
		}
	}
}

// Every default is one of its own enum's values: a default outside the list
// would be applied without a word to every route that leaves the field out.
func TestEnumDefaultsAreListed(t *testing.T) {
	t.Parallel()
	for field, listed := range map[string]bool{
		"dead_letter":        slices.Contains(deadLetters.values, deadLetters.def),
		"operation_key.kind": slices.Contains(keyKinds.values, keyKinds.def),
		"effect.body_mode":   slices.Contains(bodyModes.values, bodyModes.def),
		"pubsub_mode":        slices.Contains(pubsubModes.values, pubsubModes.def),
		"effect.method":      slices.Contains(effectMethods.values, effectMethods.def),
		"broker (required)":  brokers.def == "",
		"shape (required)":   shapes.def == "",
	} {
		if !listed {
			t.Errorf("%s: the default is not one of the values", field)
		}
	}
}
