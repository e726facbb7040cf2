package telemetry

import (
	"context"
	"math/rand/v2"
	"reflect"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// IDsOnly is the tracer provider of a gateway that exports no traces. Its
// spans carry ids and nothing else: the trace id still reaches the evidence
// record, the logs and the downstream's traceparent, with the sampling flag
// the SDK's default sampler (parent-based, every root sampled) would have
// given it, but no span records attributes, events or links that nothing
// would ever read. With the SDK and no exporter every span was recorded and
// dropped at its end, which was a third of a new delivery's allocations.
func IDsOnly() trace.TracerProvider { return idsProvider{} }

type idsProvider struct{ embedded.TracerProvider }

func (idsProvider) Tracer(string, ...trace.TracerOption) trace.Tracer { return idsTracer{} }

type idsTracer struct{ embedded.Tracer }

// Start returns a non-recording span with a fresh span id: in the parent's
// trace and with its flags and trace state when there is a valid parent
// (and no WithNewRoot), in a new sampled trace otherwise.
func (idsTracer) Start(ctx context.Context, _ string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	parent := trace.SpanContextFromContext(ctx)
	if newRoot(opts) {
		parent = trace.SpanContext{}
	}
	cfg := trace.SpanContextConfig{SpanID: newSpanID(), TraceFlags: trace.FlagsSampled}
	if parent.IsValid() {
		cfg.TraceID, cfg.TraceFlags, cfg.TraceState = parent.TraceID(), parent.TraceFlags(), parent.TraceState()
	} else {
		cfg.TraceID = newTraceID()
	}
	ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(cfg))
	return ctx, trace.SpanFromContext(ctx)
}

// attributesOption is the type of trace.WithAttributes's option, which
// newRoot skips: applying it would copy attributes nothing records.
var attributesOption = reflect.TypeOf(trace.WithAttributes())

// newRoot reports whether opts ask for a span without a parent.
func newRoot(opts []trace.SpanStartOption) bool {
	for _, o := range opts {
		if reflect.TypeOf(o) == attributesOption {
			continue
		}
		if cfg := trace.NewSpanStartConfig(o); cfg.NewRoot() {
			return true
		}
	}
	return false
}

// The ids need to be unique, not secret: the runtime's per-thread generator
// is enough and takes no lock.
func newTraceID() trace.TraceID {
	var id trace.TraceID
	for !id.IsValid() {
		putUint64(id[:8], rand.Uint64())
		putUint64(id[8:], rand.Uint64())
	}
	return id
}

func newSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		putUint64(id[:], rand.Uint64())
	}
	return id
}

func putUint64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}
