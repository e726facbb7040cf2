package tracecarrier

import (
	"net/http"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/propagation"
)

// Header reads a header as propagation.HeaderCarrier does, for the fields
// propagators ask for and any other.
func TestHeaderReadsAsHeaderCarrier(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	h.Set("Tracestate", "k=v")
	h.Add("Baggage", "a=1")
	h.Add("Baggage", "b=2")
	h.Set("X-Other", "x")
	want, got := propagation.HeaderCarrier(h), Header(h)
	for _, key := range []string{"traceparent", "tracestate", "baggage", "x-other", "X-Other", "absent", "Traceparent"} {
		if g, w := got.Get(key), want.Get(key); g != w {
			t.Errorf("Get(%q) = %q, want %q", key, g, w)
		}
		if g, w := got.Values(key), want.Values(key); !slices.Equal(g, w) {
			t.Errorf("Values(%q) = %q, want %q", key, g, w)
		}
	}
	gk, wk := got.Keys(), want.Keys()
	slices.Sort(gk)
	slices.Sort(wk)
	if !slices.Equal(gk, wk) {
		t.Errorf("Keys() = %q, want %q", gk, wk)
	}
	if g := Header(nil).Get("traceparent"); g != "" {
		t.Errorf("Get on no header = %q", g)
	}
}

// Set stores what http.Header.Set stores, and the W3C fields' names
// without an allocation. (Not parallel: AllocsPerRun counts the process.)
func TestHeaderSetsAsHTTPHeader(t *testing.T) {
	for _, k := range []string{"traceparent", "tracestate", "baggage", "b3", "X-B3-TraceId", "x-amzn-trace-id", "Traceparent", "with space"} {
		got, want := Header{}, http.Header{}
		got.Set(k, "v")
		want.Set(k, "v")
		if !slices.Equal(Header(want).Keys(), got.Keys()) || got.Get(k) != "v" {
			t.Errorf("Set(%q) stored %v, want %v", k, got, want)
		}
	}
	h := Header{}
	if n := testing.AllocsPerRun(100, func() { _ = h.Get("traceparent"); _ = canonical("tracestate") }); n != 0 {
		t.Errorf("reading a W3C field made %v allocations, want 0", n)
	}
}
