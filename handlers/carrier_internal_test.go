package handlers

import (
	"net/http"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/propagation"
)

// requestCarrier reads a request's header as propagation.HeaderCarrier
// does, for the fields propagators ask for and any other.
func TestRequestCarrierReadsAsHeaderCarrier(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	h.Set("Tracestate", "k=v")
	h.Add("Baggage", "a=1")
	h.Add("Baggage", "b=2")
	h.Set("X-Other", "x")
	want, got := propagation.HeaderCarrier(h), requestCarrier(h)
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
	if g := requestCarrier(nil).Get("traceparent"); g != "" {
		t.Errorf("Get on no header = %q", g)
	}
}
