package downstream_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ackgate/ackgate/downstream"
	"github.com/ackgate/ackgate/gate"
)

// BenchmarkExecute is the cost of one effect call on the hot path: a raw
// body with a few attributes (as Pub/Sub publishers set them), a configured
// header, a pooled connection to an httptest downstream on loopback that
// answers 201 with a result id. Allocations per call are the figure it is
// for; they include the in-process server's, which no change here affects.
// A measurement, never an assertion: run it with
//
//	go test -run='^$' -bench=Execute -benchmem ./downstream/
func BenchmarkExecute(b *testing.B) {
	srv := newBenchServer(b)
	b.Run("raw", func(b *testing.B) {
		benchmarkExecute(b, downstream.New(downstream.Options{}), srv, gate.BodyRaw)
	})
	// As the gateway runs it: a client span per call, recorded, and its
	// trace context on the request. The spans go nowhere, so that keeping
	// them costs the figure nothing.
	b.Run("raw-traced", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(discardSpans{}))
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		parent, span := tp.Tracer("bench").Start(context.Background(), "delivery")
		b.Cleanup(func() { span.End() })
		c := downstream.New(downstream.Options{TracerProvider: tp, Propagators: propagation.TraceContext{}})
		benchmarkExecuteCtx(b, parent, c, srv, gate.BodyRaw)
	})
	b.Run("envelope", func(b *testing.B) {
		benchmarkExecute(b, downstream.New(downstream.Options{}), srv, gate.BodyEnvelope)
	})
}

// newBenchServer is a downstream that reads the whole request and confirms
// it with a result id, as a provider would.
func newBenchServer(b *testing.B) string {
	b.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Result-Id", "fx-1")
		w.WriteHeader(http.StatusCreated)
	}))
	b.Cleanup(srv.Close)
	return srv.URL + "/effects"
}

func benchmarkExecute(b *testing.B, c *downstream.Client, url string, mode gate.BodyMode) {
	benchmarkExecuteCtx(b, context.Background(), c, url, mode)
}

func benchmarkExecuteCtx(b *testing.B, ctx context.Context, c *downstream.Client, url string, mode gate.BodyMode) {
	b.Cleanup(c.CloseIdleConnections)
	route := newRoute(url)
	route.Shape = gate.ShapeIdempotent
	route.Effect.BodyMode = mode
	route.Effect.ResultIDHeader = "X-Result-Id"
	route.Effect.Headers = map[string]string{"Authorization": "Bearer t"}
	req := newRequest(route)
	req.Message.Attributes = map[string]string{"event_type": "order.created", "region": "eu-west-1", "tenant": "t-42"}
	if got := c.Execute(ctx, req); got.Outcome != gate.OutcomeConfirmed {
		b.Fatalf("warm-up: %+v", got)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if got := c.Execute(ctx, req); got.Outcome != gate.OutcomeConfirmed {
			b.Fatalf("got %+v", got)
		}
	}
}

// discardSpans is a span processor that keeps nothing: spans record, as
// under an exporter, without a recorder's growing slice in the figures.
type discardSpans struct{}

func (discardSpans) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discardSpans) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discardSpans) Shutdown(context.Context) error                  { return nil }
func (discardSpans) ForceFlush(context.Context) error                { return nil }
