package downstream

import (
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

// sendOnce is the effect request body. It is deliberately a type net/http does
// not recognise: http.NewRequest gives *bytes.Reader, *bytes.Buffer and
// *strings.Reader bodies a GetBody, and a GetBody is what lets the Transport
// rewind and resend a request on its own. It reads the slice itself, and
// lives in the call's one allocation (effectCall) rather than one of its own;
// a wrapped bytes.Reader took two.
type sendOnce struct {
	b   []byte
	off int
}

func (s *sendOnce) Read(p []byte) (int, error) {
	if s.off >= len(s.b) {
		return 0, io.EOF
	}
	n := copy(p, s.b[s.off:])
	s.off += n
	return n, nil
}

func (s *sendOnce) Close() error { return nil }
