package downstream

import (
	"bytes"
	"fmt"
	"io"
	"net/http"

	"github.com/ackgate/ackgate/gate"
)

const (
	contentTypeOctet = "application/octet-stream"
	contentTypeJSON  = "application/json"
)

// body is an effect request's body and the headers that describe it.
type body struct {
	data []byte
	// contentType is the body's media type; a route's configured
	// Content-Type replaces it unless owned says otherwise.
	contentType string
	// owned: the encoding defines the media type (a CloudEvent's), and a
	// configured one would make the body unreadable.
	owned bool
	// headers carry the event's context (CloudEvents binary mode);
	// configuration cannot replace them.
	headers http.Header
	// attrs are the message's attributes (raw mode), which setHeaders
	// writes as attribute headers (attributeHeaderKey,
	// attributeHeaderValue) straight into the request's header, with the
	// same precedence as headers: an intermediate http.Header cost a map
	// and a value slice per attribute on every raw-mode call.
	attrs map[string]string
}

// encodeBody returns the effect body for the route's body mode.
func encodeBody(r *gate.Route, m *gate.Message) (body, error) {
	switch r.Effect.BodyMode {
	case gate.BodyRaw, "":
		return body{data: m.Data, contentType: contentTypeOctet, attrs: m.Attributes}, nil
	case gate.BodyEnvelope:
		return body{data: m.Envelope, contentType: contentTypeJSON}, nil
	case gate.BodyCloudEvent:
		return encodeCloudEvent(r, m, false)
	case BodyCloudEventBinary:
		return encodeCloudEvent(r, m, true)
	default:
		return body{}, fmt.Errorf("unknown body mode %q", r.Effect.BodyMode)
	}
}

// requestBody is the effect request body: a *bytes.Reader behind
// io.NopCloser, which net/http knows to be in memory and so writes in the
// same write as the request's header (any other reader has the header
// flushed ahead of it: a second write syscall on every call, and a second
// segment for the downstream to read). http.NewRequest gives a GetBody only
// to a bare *bytes.Reader, *bytes.Buffer or *strings.Reader, and a GetBody is
// what would let the Transport rewind and resend the request on its own; a
// NopCloser around one gets none (newEffectRequest). The reader lives in
// the call's one allocation (effectCall); the NopCloser is the one
// allocation of its own.
func requestBody(r *bytes.Reader) io.ReadCloser { return io.NopCloser(r) }
