package handlers

import (
	"strings"
	"testing"
)

// The envelope is read in place; its refusals say what a reader of one JSON
// value followed by the end of the body would say.
func TestDecodeEnvelopeReasons(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"message":{"data":"YQ==","messageId":"m"},"subscription":"s"}`:         "",
		`{"message":{"data":"YQ==","messageId":"m"},"subscription":"s"}` + " \n": "",
		`{"message":{"messageId":"m"},"subscription":"s"} {"again":1}`:           "body has data after the envelope",
		`{"message":{"messageId":"m"},"subscription":"s"}}`:                      "body has data after the envelope",
		`{"message":{"messageId":"m"},"subscription":"s"}x`:                      "body has data after the envelope",
		`{"message":5,"subscription":"s"} {}`:                                    `body is not a Pub/Sub push envelope: field "message" has the wrong type (JSON number)`,
		`{"message":{"messageId":"m"},"subscription":`:                           "body is not a Pub/Sub push envelope: body is empty or truncated",
		`{"message":x}`: "body is not a Pub/Sub push envelope: invalid JSON at byte 12",
		`[]`:            "body is not a Pub/Sub push envelope: body is a JSON array, not an object",
		``:              "body is not a Pub/Sub push envelope: body is empty or truncated",
		` x`:            "body is not a Pub/Sub push envelope: invalid JSON at byte 2",
	} {
		var env pushEnvelope
		rej := decodeEnvelope([]byte(body), &env)
		switch {
		case want == "" && rej != nil:
			t.Errorf("%q: refused: %s", body, rej.Reason)
		case want != "" && (rej == nil || !strings.HasPrefix(rej.Reason, want) || !rej.Poison):
			t.Errorf("%q: %+v, want a poison refusal %q", body, rej, want)
		}
	}
}
