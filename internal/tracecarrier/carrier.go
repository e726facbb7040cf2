// Package tracecarrier carries trace context in an http.Header without the
// allocation propagation.HeaderCarrier makes on every call.
//
// Propagators name the W3C Trace Context and Baggage fields in lower case
// ("traceparent"), and http.Header canonicalizes each name into a new
// string. The ingress reads these fields from every push and the effect
// client writes them into every call, so both adapters use this carrier;
// it lives apart from either because adapters do not import each other.
package tracecarrier

import (
	"net/http"

	"go.opentelemetry.io/otel/propagation"
)

// Header is propagation.HeaderCarrier, reading and writing exactly what it
// does (the same names, values and keys), without canonicalizing the names
// of the W3C fields.
type Header http.Header

var (
	_ propagation.TextMapCarrier = Header(nil)
	_ propagation.ValuesGetter   = Header(nil)
)

// Get returns what propagation.HeaderCarrier's Get returns.
func (h Header) Get(key string) string {
	if vs := h[canonical(key)]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// Values returns what propagation.HeaderCarrier's Values returns.
func (h Header) Values(key string) []string { return h[canonical(key)] }

// Set sets key to value as http.Header.Set does: the canonical name, and a
// value slice of its own.
func (h Header) Set(key, value string) { h[canonical(key)] = []string{value} }

// Keys returns what propagation.HeaderCarrier's Keys returns.
func (h Header) Keys() []string { return propagation.HeaderCarrier(h).Keys() }

// canonical is http.CanonicalHeaderKey(key), without an allocation for the
// W3C fields' names.
func canonical(key string) string {
	switch key {
	case "traceparent":
		return "Traceparent"
	case "tracestate":
		return "Tracestate"
	case "baggage":
		return "Baggage"
	}
	return http.CanonicalHeaderKey(key)
}
