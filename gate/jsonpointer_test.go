package gate

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// The examples of RFC 6901, section 5, plus the ways a pointer misses.
func TestResolvePointer(t *testing.T) {
	t.Parallel()
	var doc any
	if err := json.Unmarshal([]byte(`{
		"foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3, "g|h": 4,
		"i\\j": 5, "k\"l": 6, " ": 7, "m~n": 8, "~1": 9,
		"nested": {"list": [{"id": "x"}]}, "nothing": null
	}`), &doc); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pointer string
		want    any
	}{
		{"", doc},
		{"/foo", []any{"bar", "baz"}},
		{"/foo/0", "bar"},
		{"/foo/1", "baz"},
		{"/", 0.0},
		{"/a~1b", 1.0},
		{"/c%d", 2.0},
		{"/e^f", 3.0},
		{"/g|h", 4.0},
		{"/i\\j", 5.0},
		{"/k\"l", 6.0},
		{"/ ", 7.0},
		{"/m~0n", 8.0},
		{"/~01", 9.0}, // ~0 then 1, never ~ then 01
		{"/nested/list/0/id", "x"},
	} {
		got, err := ResolvePointer(doc, tc.pointer)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ResolvePointer(%q) = %v, %v; want %v", tc.pointer, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ pointer, want string }{
		{"foo", `pointer "foo" must start with /`},
		{"/bar", `pointer /bar: no member "bar"`},
		{"/foo/2", `pointer /foo/2: no element "2"`},
		{"/foo/-1", `pointer /foo/-1: no element "-1"`},
		{"/foo/-", `pointer /foo/-: no element "-"`},
		{"/foo/x", `pointer /foo/x: no element "x"`},
		{"/foo/0/x", `pointer /foo/0/x: "x" is not inside an object or array`},
		{"/nothing", `pointer /nothing: value is null`},
	} {
		if got, err := ResolvePointer(doc, tc.pointer); err == nil || err.Error() != tc.want {
			t.Errorf("ResolvePointer(%q) = %v, %v; want error %q", tc.pointer, got, err, tc.want)
		}
	}
}

func TestPointerValue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, doc, pointer, want string
	}{
		{"a string is itself", `{"id": "A-1"}`, "/id", "A-1"},
		{"a string that looks like JSON is still itself", `{"id": "{\"x\":1}"}`, "/id", `{"x":1}`},
		{"a number is re-encoded", `{"id": 42}`, "/id", "42"},
		{"a boolean is re-encoded", `{"ok": true}`, "/ok", "true"},
		{"an object is re-encoded with sorted keys", `{"o": { "b": 1,  "a": [1, 2] }}`, "/o", `{"a":[1,2],"b":1}`},
		{"an array element", `{"items": [{"sku": "s1"}, {"sku": "s2"}]}`, "/items/1/sku", "s2"},
	} {
		got, err := pointerValue([]byte(tc.doc), tc.pointer)
		if err != nil || got != tc.want {
			t.Errorf("%s: pointerValue(%s, %q) = %q, %v; want %q", tc.name, tc.doc, tc.pointer, got, err, tc.want)
		}
	}
	// Whitespace and key order are not part of the value.
	a, errA := pointerValue([]byte(`{"o":{"x":1,"y":{"q":[true,null]}}}`), "/o")
	b, errB := pointerValue([]byte("{ \"o\" : {\n\"y\": {\"q\": [ true , null ]}, \"x\": 1 } }"), "/o")
	if errA != nil || errB != nil || a != b {
		t.Errorf("the same object spelt two ways: %q (%v) and %q (%v)", a, errA, b, errB)
	}
	for _, tc := range []struct{ name, doc, pointer, want string }{
		{"not JSON", `id=1`, "/id", "data is not JSON"},
		{"empty data", ``, "/id", "data is not JSON"},
		{"data after the document", `{"id": 1} {"id": 2}`, "/id", "data is not JSON"},
		{"missing member", `{"id": 1}`, "/key", `no member "key"`},
		{"null", `{"id": null}`, "/id", "value is null"},
	} {
		if got, err := pointerValue([]byte(tc.doc), tc.pointer); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: pointerValue = %q, %v; want an error containing %q", tc.name, got, err, tc.want)
		}
	}
}

// Numbers: equal values spelt differently are one value, as they were when
// documents were decoded as float64; but integers a float64 cannot hold keep
// every digit, so two 64-bit ids never share a key.
func TestPointerValueNumbers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		doc, want string
	}{
		{`{"n": 1}`, "1"},
		{`{"n": 1.0}`, "1"},
		{`{"n": 1e0}`, "1"},
		{`{"n": 1.50}`, "1.5"},
		{`{"n": -0}`, "-0"},
		{`{"n": 9007199254740992}`, "9007199254740992"}, // 2^53: exact
		{`{"n": 9007199254740993}`, "9007199254740993"}, // 2^53+1: not a float64
		{`{"n": 1152921504606846976}`, "1152921504606846976"},
		{`{"n": 1152921504606846977}`, "1152921504606846977"},
		{`{"n": 1000000000000000000000}`, "1e+21"}, // exact, spelt as before
		{`{"n": 1e400}`, "1e400"},                  // beyond float64: its own text
		{`{"n": {"b": 1.0, "a": [9007199254740993, 2.50]}}`, `{"a":[9007199254740993,2.5],"b":1}`},
	} {
		got, err := pointerValue([]byte(tc.doc), "/n")
		if err != nil || got != tc.want {
			t.Errorf("pointerValue(%s) = %q, %v; want %q", tc.doc, got, err, tc.want)
		}
	}
}

// Two orders whose 64-bit ids differ only beyond float64's precision are two
// operations, not a redelivery of one.
func TestLargeIntegerKeysStayDistinct(t *testing.T) {
	t.Parallel()
	r := &Route{Name: "orders", Tenant: "t", Key: KeySource{Kind: KeyJSONPointer, Name: "/order_id"},
		Fingerprint: FingerprintSpec{Version: 1, Data: true}}
	a, errA := Identify(r, &Message{MessageID: "1", Data: []byte(`{"order_id": 1234567890123456789}`)})
	b, errB := Identify(r, &Message{MessageID: "2", Data: []byte(`{"order_id": 1234567890123456790}`)})
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	if a.Key == b.Key || a.OperationID == b.OperationID {
		t.Fatalf("two order ids share key %q and operation %s", a.Key, a.OperationID)
	}
}

// ExactJSON tells a JSON text whose strings decode byte for byte from one
// where encoding/json would put U+FFFD in place of what it cannot read.
func TestExactJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ doc, want string }{
		{`{"a":"plain"}`, ""},
		{`{"a":"ä 😀 \ufffd \u00e4"}`, ""},
		{`{"a":"\ud83d\ude00"}`, ""},
		{`{"a":"\uD83D\uDE00"}`, ""},
		{`{"a":"\\udcff"}`, ""}, // an escaped backslash, then text
		{`{"a":"\\\ud800"}`, "holds an unpaired surrogate escape"},
		{`{"a":"\u0000"}`, ""}, // a NUL decodes exactly; Unstorable refuses it
		{"{\"a\":\"\xff\"}", "is not valid UTF-8"},
		{"{\"a\":\"\xc3\x28\"}", "is not valid UTF-8"},
		{`{"a":"\ud800"}`, "holds an unpaired surrogate escape"},
		{`{"a":"\udc00"}`, "holds an unpaired surrogate escape"},
		{`{"a":"\ud800\u0041"}`, "holds an unpaired surrogate escape"},
		{`{"a":"\ud800\ud800"}`, "holds an unpaired surrogate escape"},
		{`{"a":"x\ud800`, "holds an unpaired surrogate escape"},
		{`{"\udfff":1}`, "holds an unpaired surrogate escape"},
		{`{"a":"\u12"}`, ""}, // not JSON; the decoder says so
		{`\`, ""},
	} {
		if got := ExactJSON([]byte(tc.doc)); got != tc.want {
			t.Errorf("ExactJSON(%q) = %q, want %q", tc.doc, got, tc.want)
		}
	}
	// What ExactJSON passes decodes to strings that encode back to the same
	// characters: nothing was replaced.
	var v map[string]string
	doc := `{"a":"\ud83d\ude00 \ufffd x"}`
	if err := json.Unmarshal([]byte(doc), &v); err != nil || v["a"] != "😀 \uFFFD x" {
		t.Fatalf("decoded %q, %v", v["a"], err)
	}
}
