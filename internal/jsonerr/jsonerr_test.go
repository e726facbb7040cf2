package jsonerr_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/internal/jsonerr"
)

type body struct {
	Message *struct {
		Data       *string           `json:"data"`
		Attributes map[string]string `json:"attributes"`
	} `json:"message"`
}

func decode(s string) error {
	var b body
	return json.NewDecoder(strings.NewReader(s)).Decode(&b)
}

func TestDescribe(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 100)
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"syntax error names the byte", decode(`{"message": {"data": x}}`), "invalid JSON at byte 22"},
		{"wrong type names the field", decode(`{"message": {"data": 5}}`), `field "message.data" has the wrong type (JSON number)`},
		{"wrong type in a map names the map", decode(`{"message": {"attributes": {"a": true}}}`), `field "message.attributes" has the wrong type (JSON bool)`},
		{"a long path is bounded", &json.UnmarshalTypeError{Value: "number", Field: long}, `field "` + long[:64] + `" has the wrong type (JSON number)`},
		{"not an object", decode(`[1, 2]`), "body is a JSON array, not an object"},
		{"empty body", decode(``), "body is empty or truncated"},
		{"truncated body", decode(`{"message": {"da`), "body is empty or truncated"},
		{"anything else", errors.New("boom"), "invalid JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := jsonerr.Describe(tc.err); got != tc.want {
				t.Errorf("Describe(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}

// A description never carries the body's values, only positions, paths and
// JSON types.
func TestDescribeDoesNotEchoValues(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-payload"
	for _, in := range []string{
		`{"message": {"data": ` + secret + `}}`,
		`{"message": {"data": {"x": "` + secret + `"}}}`,
		`{"message": "` + secret + `"}`,
		`"` + secret + `"`,
	} {
		var b body
		err := json.NewDecoder(bytes.NewReader([]byte(in))).Decode(&b)
		if err == nil {
			t.Fatalf("%s decoded", in)
		}
		if got := jsonerr.Describe(err); strings.Contains(got, secret) || strings.Contains(got, "s3cret") {
			t.Errorf("Describe of %s = %q: echoes the body", in, got)
		}
	}
}
