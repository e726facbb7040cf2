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
			vs[i] = percentEncode(v, keepInCEValue)
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

// attributeHeaderKey is the header a raw-mode request carries an
// attribute's value in: AttributeHeaderPrefix followed by the attribute's
// encoded name (attributeHeaderName), in canonical form, exactly
// http.CanonicalHeaderKey(AttributeHeaderPrefix + attributeHeaderName(name)).
//
// It is built in one allocation, the key itself, where the composition took
// three (the encoded name, the concatenation, the canonical copy): this runs
// for every attribute of every raw-mode call. The canonical form is made the
// way net/textproto makes it (upper case first and after each '-', lower
// case elsewhere), which is all textproto does to this key: every byte of
// it is a header token byte (the prefix's, the kept ones, '%' and upper-case
// hex digits), so textproto does not give up on it as invalid, and no
// common header starts with the prefix, so it does not return an interned
// one instead. The package's tests compare the two.
func attributeHeaderKey(name string) string {
	var buf [128]byte // most keys fit here, so only the string is allocated
	key := append(buf[:0], AttributeHeaderPrefix...)
	key = appendPercentEncoded(key, name, keepInName)
	upper := true
	for i, c := range key {
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		key[i] = c
		upper = c == '-'
	}
	return string(key)
}

// attributeHeaderName percent-encodes every byte of name other than a-z,
// 0-9 and the token punctuation !#$&'*+-.^_`|~, upper-case letters
// included: a header name is case-insensitive, so only this keeps
// "eventType" apart from "eventtype". A receiver lower-cases what follows
// the prefix and percent-decodes it. It is the rule's reference;
// attributeHeaderKey applies it without this intermediate string.
func attributeHeaderName(name string) string { return percentEncode(name, keepInName) }

// keepInName is the set of bytes attributeHeaderName leaves as they are.
func keepInName(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("!#$&'*+-.^_`|~", c) >= 0
}

// attributeHeaderValue percent-encodes every byte of v outside printable
// ASCII (controls, DEL, and every byte of a multi-byte character), the
// space and the percent sign, so that any value survives as a header value,
// leading or trailing spaces included. A receiver percent-decodes it.
func attributeHeaderValue(v string) string { return percentEncode(v, keepInValue) }

// keepInValue is the set of bytes attributeHeaderValue leaves as they are.
func keepInValue(c byte) bool { return c > ' ' && c < 0x7f && c != '%' }

// keepInCEValue is the set of bytes a ce-* header value keeps as they are
// (the HTTP binding's rule; encodeCloudEvent).
func keepInCEValue(c byte) bool { return c > ' ' && c < 0x7f && c != '"' && c != '%' }

// percentEncode writes every byte of s that keep rejects as %XX (upper-case
// hex). Most attribute values and names need no escape at all, so s itself
// is returned when none does, without an allocation; otherwise the result
// is allocated once, at its exact size.
func percentEncode(s string, keep func(byte) bool) string {
	escapes := 0
	for i := 0; i < len(s); i++ {
		if !keep(s[i]) {
			escapes++
		}
	}
	if escapes == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*escapes)
	for i := 0; i < len(s); i++ {
		if c := s[i]; keep(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('%')
			b.WriteByte(upperHex[c>>4])
			b.WriteByte(upperHex[c&0xf])
		}
	}
	return b.String()
}

// appendPercentEncoded appends s to dst encoded as percentEncode encodes it.
func appendPercentEncoded(dst []byte, s string, keep func(byte) bool) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; keep(c) {
			dst = append(dst, c)
		} else {
			dst = append(dst, '%', upperHex[c>>4], upperHex[c&0xf])
		}
	}
	return dst
}

// upperHex are the digits of a percent escape, upper case as RFC 3986 asks.
const upperHex = "0123456789ABCDEF"
