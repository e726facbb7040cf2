package downstream

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/tracecarrier"
)

// The header code builds its strings and maps without the allocations the
// straightforward composition takes. These tests hold it to that
// composition, kept here as the reference: what goes on the wire is the
// same, byte for byte.

// percentEncodeRef is percentEncode as it was written first.
func percentEncodeRef(s string, keep func(byte) bool) string {
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

// attributeHeaderKeyRef is the attribute header's key as the documented
// rule composes it.
func attributeHeaderKeyRef(name string) string {
	return http.CanonicalHeaderKey(AttributeHeaderPrefix + percentEncodeRef(name, keepInName))
}

// setHeadersRef is setHeaders as it was written first, with http.Header.Set
// into NewRequest's header and the attributes as an http.Header of their
// own copied in.
func setHeadersRef(r *http.Request, spec *gate.EffectSpec, req *gate.EffectRequest, b body) {
	r.Header.Set("User-Agent", userAgent)
	if b.contentType != "" {
		r.Header.Set("Content-Type", b.contentType)
	}
	for k, v := range spec.Headers {
		switch {
		case strings.EqualFold(k, "Host"):
			r.Host = v
		case b.owned && (strings.EqualFold(k, "Content-Type") || len(k) > 3 && strings.EqualFold(k[:3], "ce-")):
		default:
			r.Header.Set(k, v)
		}
	}
	for k, vs := range b.headers {
		r.Header[k] = vs
	}
	for name, v := range b.attrs {
		r.Header[attributeHeaderKeyRef(name)] = []string{percentEncodeRef(v, keepInValue)}
	}
	r.Header.Set(HeaderIdempotencyKey, req.IdempotencyKey)
	r.Header.Set(HeaderFence, fmt.Sprint(req.Fence))
	r.Header.Set(HeaderOperation, req.OperationID)
}

// encodingInputs are names and values of every kind the encoders meet:
// brokers let publishers write nearly anything, and invalid UTF-8,
// controls, DEL, percent signs, quotes, hyphens before letters and hex
// escapes next to letters are where a hand-made encoder would go wrong.
func encodingInputs() []string {
	in := []string{
		"", "a", "A", "event_type", "eventType", "Region-2", "region", "-a", "a-b-c", "a--b", "x-Y-z",
		"%", "%41", "100%", "a b", " lead", "trail ", "multi\nline", "a\r\nb", "tab\t", "nul\x00", "del\x7f",
		"Ünïcode", "ünïcödé 日本 100%", "\xff\xfe", "\xc3", "invalid \xc3\x28 utf8", `quote"d`, "!#$&'*+-.^_`|~",
		"googclient_traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		strings.Repeat("long-name_", 30), strings.Repeat("\xe6\x97\xa5", 60),
	}
	for c := range 256 {
		in = append(in, string([]byte{byte(c)}), "-"+string([]byte{byte(c)})+"x")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, rng.IntN(48))
		for i := range b {
			if rng.IntN(3) == 0 {
				b[i] = byte(rng.IntN(256))
			} else {
				b[i] = "abcXYZ09-_% \n\"é"[rng.IntN(16)]
			}
		}
		in = append(in, string(b))
	}
	return in
}

// checkEncodings fails when any encoder differs from its reference on s.
func checkEncodings(t *testing.T, s string) {
	t.Helper()
	for _, e := range []struct {
		name string
		got  func(string) string
		want func(string) string
	}{
		{"name", attributeHeaderName, func(s string) string { return percentEncodeRef(s, keepInName) }},
		{"value", attributeHeaderValue, func(s string) string { return percentEncodeRef(s, keepInValue) }},
		{"ce value", func(s string) string { return percentEncode(s, keepInCEValue) }, func(s string) string { return percentEncodeRef(s, keepInCEValue) }},
		{"key", attributeHeaderKey, attributeHeaderKeyRef},
	} {
		if got, want := e.got(s), e.want(s); got != want {
			t.Fatalf("%s of %q: %q, want %q", e.name, s, got, want)
		}
	}
}

func TestEncodersMatchTheirReference(t *testing.T) {
	t.Parallel()
	for _, s := range encodingInputs() {
		checkEncodings(t, s)
	}
}

// FuzzEncoders holds the encoders to their reference on any input; go test
// runs the seeds.
func FuzzEncoders(f *testing.F) {
	for _, s := range encodingInputs()[:64] {
		f.Add(s)
	}
	f.Fuzz(checkEncodings)
}

// What needs no escape is returned as it is, without an allocation; an
// attribute header's key is its one allocation.
func TestEncodersAllocate(t *testing.T) {
	plain := "order.created-eu_west_1"
	for _, c := range []struct {
		name string
		f    func()
		want float64
	}{
		{"plain value", func() { _ = attributeHeaderValue(plain) }, 0},
		{"plain name", func() { _ = attributeHeaderName(plain) }, 0},
		{"escaped value", func() { _ = attributeHeaderValue("ünïcödé 100%") }, 1},
		{"key", func() { _ = attributeHeaderKey("eventType") }, 1},
	} {
		if got := testing.AllocsPerRun(100, c.f); got != c.want {
			t.Errorf("%s: %v allocations, want %v", c.name, got, c.want)
		}
	}
	if got := attributeHeaderValue(plain); got != plain {
		t.Errorf("plain value %q came back as %q", plain, got)
	}
}

// The header names setHeaders stores directly are the ones http.Header.Set
// would store.
func TestHeaderNamesAreCanonical(t *testing.T) {
	t.Parallel()
	for _, k := range []string{headerUserAgent, headerContentType, HeaderIdempotencyKey, HeaderFence, HeaderOperation} {
		if c := http.CanonicalHeaderKey(k); c != k {
			t.Errorf("%q is not canonical (%q)", k, c)
		}
	}
}

// setHeaders produces the header the Set-based composition did, for raw
// mode with attributes, for a CloudEvent's owned headers, and with
// configuration that tries to replace what it may not.
func TestSetHeadersMatchesReference(t *testing.T) {
	t.Parallel()
	in := encodingInputs()
	attrs := map[string]string{}
	for i, s := range in[:40] {
		attrs[s] = in[len(in)-1-i]
	}
	spec := &gate.EffectSpec{Headers: map[string]string{
		"authorization": "Bearer t", "X-Custom": " spaced ", "Host": "orders.internal", "idempotency-key": "from-config",
		"content-type": "text/plain", "Ce-Id": "forged", "x-ackgate-attr-region": "configured", "x-ackgate-fence": "99",
	}}
	req := &gate.EffectRequest{IdempotencyKey: "ik_abc", OperationID: "op_abc", Fence: 1234567}
	ce := http.Header{"Ce-Id": {"m-1"}, "Ce-Source": {"s"}, "Ce-Specversion": {"1.0"}}
	for _, c := range []struct {
		name string
		b    body
		spec *gate.EffectSpec
	}{
		{"raw with attributes", body{contentType: contentTypeOctet, attrs: attrs}, spec},
		{"raw with few attributes", body{contentType: contentTypeOctet, attrs: map[string]string{"region": "eu"}}, spec},
		{"raw without attributes or configuration", body{contentType: contentTypeOctet}, &gate.EffectSpec{}},
		{"cloudevent binary", body{contentType: contentTypeJSON, owned: true, headers: ce}, spec},
		{"lookup", body{}, spec},
	} {
		for _, more := range []int{0, 2, 20} {
			got, _ := http.NewRequest(http.MethodPost, "http://example.test/", nil)
			want, _ := http.NewRequest(http.MethodPost, "http://example.test/", nil)
			setHeaders(got, c.spec, req, c.b, more)
			setHeadersRef(want, c.spec, req, c.b)
			if !reflect.DeepEqual(got.Header, want.Header) || got.Host != want.Host {
				t.Errorf("%s (more %d): header\n%v\nhost %q; want\n%v\nhost %q", c.name, more, got.Header, got.Host, want.Header, want.Host)
			}
		}
	}
}

// The values setHeaders hands out share one array but not their room: an
// Add to one header leaves every other as it was.
func TestHeaderValuesDoNotOverlap(t *testing.T) {
	t.Parallel()
	r, _ := http.NewRequest(http.MethodPost, "http://example.test/", nil)
	setHeaders(r, &gate.EffectSpec{Headers: map[string]string{"A": "a", "B": "b"}}, &gate.EffectRequest{IdempotencyKey: "k", OperationID: "o", Fence: 1},
		body{contentType: contentTypeOctet, attrs: map[string]string{"x": "1", "y": "2"}}, 0)
	before := r.Header.Clone()
	for k := range before {
		r.Header.Add(k, "added")
	}
	for k, vs := range before {
		if got := r.Header.Values(k); len(got) != len(vs)+1 || !reflect.DeepEqual(got[:len(vs)], vs) || got[len(vs)] != "added" {
			t.Errorf("%s: %q after an Add to every header; want %q then added", k, got, vs)
		}
	}
}

// The propagators' fields land in the header as propagation.HeaderCarrier
// puts them there.
func TestHeaderCarrierMatchesHeaderCarrier(t *testing.T) {
	t.Parallel()
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
		TraceState: func() trace.TraceState { ts, _ := trace.ParseTraceState("vendor=x"); return ts }(),
	})
	m, err := baggage.NewMember("tenant", "t-42")
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(m)
	if err != nil {
		t.Fatal(err)
	}
	ctx := baggage.ContextWithBaggage(trace.ContextWithSpanContext(context.Background(), sc), bag)
	got, want := http.Header{"X-Other": {"o"}}, http.Header{"X-Other": {"o"}}
	prop.Inject(ctx, tracecarrier.Header(got))
	prop.Inject(ctx, propagation.HeaderCarrier(want))
	if len(want) != 4 || !reflect.DeepEqual(got, want) {
		t.Errorf("injected %v; want %v (four headers)", got, want)
	}
	if v := tracecarrier.Header(got).Get("traceparent"); v == "" || v != propagation.HeaderCarrier(want).Get("traceparent") {
		t.Errorf("Get traceparent %q", v)
	}
	gk, wk := tracecarrier.Header(got).Keys(), propagation.HeaderCarrier(want).Keys()
	if len(gk) != len(wk) {
		t.Errorf("Keys %v; want %v", gk, wk)
	}
}
