package downstream

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/ackgate/ackgate/gate"
)

// BodyCloudEventBinary is the body mode of a CloudEvent in the HTTP binding's
// binary mode: the message data as the body, the event's attributes as ce-*
// headers. gate.BodyCloudEvent is the structured mode, the whole event as
// one application/cloudevents+json document. The value is this adapter's,
// which alone gives it a meaning; config accepts it as effect.body_mode.
const BodyCloudEventBinary gate.BodyMode = "cloudevent_binary"

// AttributeHeaderPrefix names the headers that carry a message's
// attributes in raw mode: X-Ackgate-Attr-<name>: <value>, both
// percent-encoded (attributeHeaderName, attributeHeaderValue).
const AttributeHeaderPrefix = "X-Ackgate-Attr-"

// cloudEventType names the route in the event, so that a receiver can route on
// it without knowing ackgate's configuration.
func cloudEventType(route string) string { return "ackgate." + route }

// encodeCloudEvent builds the CloudEvents 1.0 event of m with the CloudEvents
// SDK and writes it in the HTTP binding's binary or structured mode.
//
// Data is carried as JSON when the message data is JSON (structured mode:
// "data", readable without decoding base64) and as bytes otherwise
// ("data_base64"); in binary mode it is the body either way. The message's
// attributes become extensions (extensionNames).
func encodeCloudEvent(r *gate.Route, m *gate.Message, binary bool) (body, error) {
	ev := event.New()
	ev.SetID(m.MessageID)
	source := m.Source
	if source == "" {
		// source is REQUIRED and non-empty; the broker is the next best
		// description of where the event came from.
		source = "ackgate:" + string(m.Broker)
	}
	ev.SetSource(source)
	ev.SetType(cloudEventType(r.Name))
	if !m.PublishTime.IsZero() {
		ev.SetTime(m.PublishTime.UTC())
	}
	var err error
	switch {
	case len(m.Data) == 0:
		// No data: CloudEvents lets it be absent.
	case json.Valid(m.Data):
		err = ev.SetData(contentTypeJSON, json.RawMessage(m.Data))
	default:
		err = ev.SetData(contentTypeOctet, m.Data)
	}
	if err != nil {
		return body{}, fmt.Errorf("cloudevent: %w", err)
	}
	for name, ext := range extensionNames(m.Attributes) {
		ev.SetExtension(ext, m.Attributes[name]) // an invalid one fails Validate
	}
	if err := ev.Validate(); err != nil {
		return body{}, fmt.Errorf("cloudevent: %w", err)
	}

	// The SDK writes the event into a request of its own; its headers and
	// bytes are then put on the effect request, which must stay one the
	// Transport cannot resend (newEffectRequest).
	ctx := context.Background()
	if !binary {
		ctx = binding.WithForceStructured(ctx)
	}
	scratch, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://cloudevent.invalid/", nil)
	if err != nil {
		return body{}, err
	}
	if err := cehttp.WriteRequest(ctx, binding.ToMessage(&ev), scratch); err != nil {
		return body{}, fmt.Errorf("cloudevent: %w", err)
	}
	var data []byte
	if scratch.Body != nil {
		if data, err = io.ReadAll(scratch.Body); err != nil {
			return body{}, fmt.Errorf("cloudevent: %w", err)
		}
	}
	ct := scratch.Header.Get("Content-Type")
	scratch.Header.Del("Content-Type")
	// The HTTP binding (1.0.2, 3.1.3.2) has string values percent-encoded
	// in ce-* headers: a space, '"', '%' and everything outside printable
	// ASCII. The SDK writes them as they are, which for a line break is a
	// request the transport refuses, so it is done here.
	for k, vs := range scratch.Header {
		for i, v := range vs {
			vs[i] = percentEncode(v, func(c byte) bool { return c > ' ' && c < 0x7f && c != '"' && c != '%' })
		}
		scratch.Header[k] = vs
	}
	return body{data: data, contentType: ct, owned: true, headers: scratch.Header}, nil
}

// contextAttributes are the names CloudEvents 1.0 gives its own attributes
// (and the structured form's data members); no extension may take one.
var contextAttributes = []string{"specversion", "id", "source", "type", "datacontenttype",
	"dataschema", "subject", "time", "data", "database64"}

// maxExtensionName is the length the specification asks extension names to
// stay within.
const maxExtensionName = 20

// extensionNames maps each attribute name to a valid CloudEvents extension
// name. CloudEvents names are lower-case ASCII letters and digits only, so
// a name is lower-cased and loses every other character (event_type
// becomes eventtype). When that leaves it empty, longer than 20
// characters, equal to a context attribute's name, or equal to what another
// attribute's name becomes, it is "attr" followed by the first 16 hex digits
// of the SHA-256 of the original name instead, which a receiver can compute
// from the names it expects. (A name that already looks like that, "attr"
// and 16 more characters, takes its own hash too, so that it cannot meet
// another's.) Every attribute is kept; none collide.
func extensionNames(attrs map[string]string) map[string]string {
	if len(attrs) == 0 {
		return nil
	}
	simple := make(map[string]string, len(attrs))
	count := map[string]int{}
	for name := range attrs {
		var b strings.Builder
		for _, c := range strings.ToLower(name) {
			if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
				b.WriteRune(c)
			}
		}
		simple[name] = b.String()
		count[b.String()]++
	}
	out := make(map[string]string, len(attrs))
	for name, s := range simple {
		if s == "" || len(s) > maxExtensionName || slices.Contains(contextAttributes, s) || count[s] > 1 || strings.HasPrefix(s, "attr") && len(s) == 20 {
			sum := sha256.Sum256([]byte(name))
			s = "attr" + hex.EncodeToString(sum[:8])
		}
		out[name] = s
	}
	return out
}

// attributeHeaders are a raw-mode request's attribute headers: one per
// attribute, AttributeHeaderPrefix followed by its encoded name, with its
// encoded value.
func attributeHeaders(attrs map[string]string) http.Header {
	if len(attrs) == 0 {
		return nil
	}
	h := make(http.Header, len(attrs))
	for name, v := range attrs {
		h[http.CanonicalHeaderKey(AttributeHeaderPrefix+attributeHeaderName(name))] = []string{attributeHeaderValue(v)}
	}
	return h
}

// attributeHeaderName percent-encodes every byte of name other than a-z,
// 0-9 and the token punctuation !#$&'*+-.^_`|~, upper-case letters
// included: a header name is case-insensitive, so only this keeps
// "eventType" apart from "eventtype". A receiver lower-cases what follows
// the prefix and percent-decodes it.
func attributeHeaderName(name string) string {
	return percentEncode(name, func(c byte) bool {
		return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("!#$&'*+-.^_`|~", c) >= 0
	})
}

// attributeHeaderValue percent-encodes every byte of v outside printable
// ASCII (controls, DEL, and every byte of a multi-byte character), the
// space and the percent sign, so that any value survives as a header value,
// leading or trailing spaces included. A receiver percent-decodes it.
func attributeHeaderValue(v string) string {
	return percentEncode(v, func(c byte) bool { return c > ' ' && c < 0x7f && c != '%' })
}

func percentEncode(s string, keep func(byte) bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; keep(c) {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
