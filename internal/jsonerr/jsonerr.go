// Package jsonerr says why a push body is not the JSON its broker sends,
// without repeating any of the body.
//
// Pub/Sub envelopes are decoded in handlers and SNS messages in brokerauth.
// The wording lives here rather than in either, so that a sender reads the
// same kind of answer from both brokers' endpoints and neither package leans
// on the other for it.
package jsonerr

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/ackgate/ackgate/gate"
)

// maxFieldLen bounds a field path in a description. The path is made of the
// body's own keys (an attribute name, for one), so it is the sender's text.
const maxFieldLen = 64

// Describe turns an error from decoding a body with encoding/json into a
// short reason fit for the answer to the broker: where the syntax breaks (a
// byte offset), which field has the wrong type, or that the body ended early.
// It names positions, field paths and JSON types, never a value.
func Describe(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("invalid JSON at byte %d", syn.Offset)
	case errors.As(err, &typ) && typ.Field == "":
		return fmt.Sprintf("body is a JSON %s, not an object", typ.Value)
	case errors.As(err, &typ):
		return fmt.Sprintf("field %q has the wrong type (JSON %s)", gate.Bound(typ.Field, maxFieldLen), typ.Value)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "body is empty or truncated"
	}
	return "invalid JSON"
}
