package gate

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Recorder hears what the gate did, for metrics. The gate declares it so that
// it depends on no metrics SDK; telemetry/ implements it. Calls must not block.
type Recorder interface {
	// Delivered is called once per delivery with the gate's answer and the
	// time the gate itself took, the downstream's time excluded.
	Delivered(ctx context.Context, r *Route, broker Broker, d Decision, gateTime time.Duration)
	// Transitioned is called for the steps of every committed ledger write.
	Transitioned(ctx context.Context, r *Route, steps []Step)
	// Contended is called when a delivery found the lease held by another.
	Contended(ctx context.Context, r *Route)
	// Downstream is called after every effect call and lookup.
	Downstream(ctx context.Context, r *Route, kind AttemptKind, o Outcome, took time.Duration)
}

type noRecorder struct{}

func (noRecorder) Delivered(context.Context, *Route, Broker, Decision, time.Duration) {}
func (noRecorder) Transitioned(context.Context, *Route, []Step)                       {}
func (noRecorder) Contended(context.Context, *Route)                                  {}
func (noRecorder) Downstream(context.Context, *Route, AttemptKind, Outcome, time.Duration) {
}

func (g *Gate) recorder() Recorder {
	if g.Recorder == nil {
		return noRecorder{}
	}
	return g.Recorder
}

func (g *Gate) tracer() trace.Tracer {
	if g.Tracer == nil {
		return noop.NewTracerProvider().Tracer("")
	}
	return g.Tracer
}

// startSpan starts a child span for one step of the gate. Callers set its
// attributes only when it is recording, so that a delivery whose trace is not
// sampled builds none of them.
func (g *Gate) startSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	return g.tracer().Start(ctx, name)
}

// endSpan ends s, recording err (if any) on it.
func endSpan(s trace.Span, err error) {
	if err != nil && s.IsRecording() {
		s.RecordError(err)
		s.SetStatus(codes.Error, err.Error())
	}
	s.End()
}

// linkFirstDelivery links the current span to the trace of the operation's
// first delivery, so a redelivery's trace leads back to where the work began.
func linkFirstDelivery(ctx context.Context, op *Operation) {
	if op == nil || op.TraceID == "" || op.SpanID == "" || !trace.SpanFromContext(ctx).IsRecording() {
		return
	}
	tid, err := trace.TraceIDFromHex(op.TraceID)
	if err != nil {
		return
	}
	sid, err := trace.SpanIDFromHex(op.SpanID)
	if err != nil {
		return
	}
	cur := trace.SpanFromContext(ctx)
	if cur.SpanContext().TraceID() == tid {
		return
	}
	cur.AddLink(trace.Link{
		SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true}),
		Attributes:  []attribute.KeyValue{attribute.String("ackgate.link", "first_delivery"), attribute.String("ackgate.operation.id", op.ID)},
	})
}

func spanID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.HasSpanID() {
		return ""
	}
	return sc.SpanID().String()
}

// span is startSpan for the steps off the delivery path (the relay, the
// reconciler, resolutions, local statements), where building the
// attributes up front costs nothing that matters; they are set only on a
// span that records.
func (g *Gate) span(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, func(error)) {
	ctx, s := g.startSpan(ctx, name)
	if s.IsRecording() {
		s.SetAttributes(attrs...)
	}
	return ctx, func(err error) { endSpan(s, err) }
}
