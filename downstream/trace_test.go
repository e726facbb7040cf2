package downstream_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackgate/ackgate/downstream"
	"github.com/ackgate/ackgate/gate"
)

func tracedClient(t *testing.T) (*downstream.Client, *tracetest.SpanRecorder, trace.Tracer) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	c := downstream.New(downstream.Options{TracerProvider: tp, Propagators: propagation.TraceContext{}})
	t.Cleanup(c.CloseIdleConnections)
	return c, rec, tp.Tracer("test")
}

func spanAttr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// Every call is a client span under the delivery's span, and the request
// carries that span as its traceparent, so the downstream's spans join the
// delivery's trace.
func TestCallsCarryTheirTrace(t *testing.T) {
	t.Parallel()
	c, rec, tracer := tracedClient(t)
	srv, last := recorder(t)
	ctx, parent := tracer.Start(context.Background(), "delivery")
	got := c.Execute(ctx, newRequest(newRoute(srv.URL+"/effects")))
	parent.End()
	if got.Outcome != gate.OutcomeConfirmed {
		t.Fatalf("got %+v", got)
	}
	var client sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindClient {
			if client != nil {
				t.Fatal("more than one client span for one call")
			}
			client = s
		}
	}
	if client == nil {
		t.Fatalf("no client span among %d", len(rec.Ended()))
	}
	if client.Name() != "HTTP POST" || client.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("client span %q with parent %s; want HTTP POST under the delivery's %s", client.Name(), client.Parent().SpanID(), parent.SpanContext().SpanID())
	}
	for key, want := range map[string]string{"http.request.method": "POST", "http.response.status_code": "204", "url.path": "/effects", "server.address": "127.0.0.1"} {
		if v, ok := spanAttr(client, key); !ok || v.String() != want {
			t.Errorf("attribute %s = %q (present %v); want %q", key, v.String(), ok, want)
		}
	}
	port, err := strconv.Atoi(strings.TrimPrefix(srv.URL[strings.LastIndex(srv.URL, ":"):], ":"))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := spanAttr(client, "server.port"); !ok || v.AsInt64() != int64(port) {
		t.Errorf("attribute server.port = %v (present %v); want %d", v.String(), ok, port)
	}
	if _, ok := spanAttr(client, "error.type"); ok || client.Status().Code == codes.Error {
		t.Errorf("a 204 marked the span as an error: %+v", client.Status())
	}
	sent := propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(last().header))
	if sc := trace.SpanContextFromContext(sent); sc.TraceID() != parent.SpanContext().TraceID() || sc.SpanID() != client.SpanContext().SpanID() {
		t.Errorf("traceparent sent names %s/%s; want the client span %s/%s", sc.TraceID(), sc.SpanID(), client.SpanContext().TraceID(), client.SpanContext().SpanID())
	}
}

// A call without an answer, and an answer that is a client error, end their
// spans as errors with a low-cardinality error.type.
func TestCallSpansRecordFailures(t *testing.T) {
	t.Parallel()
	c, rec, _ := tracedClient(t)
	if got := c.Execute(context.Background(), newRequest(newRoute(refusedURL(t)))); got.Outcome != gate.OutcomeRetryable {
		t.Fatalf("refused: %+v", got)
	}
	srv := serve(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) })
	r := newRoute("http://unused.invalid")
	r.Effect.LookupURL = srv.URL + "/effects/{key}"
	if got := c.Lookup(context.Background(), newRequest(r)); got.Outcome != gate.OutcomeAbsent {
		t.Fatalf("lookup: %+v", got)
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans; want one per call", len(spans))
	}
	for i, want := range []string{"_OTHER", "404"} {
		s := spans[i]
		if v, _ := spanAttr(s, "error.type"); s.Status().Code != codes.Error || v.String() != want {
			t.Errorf("span %q: status %+v, error.type %q; want an error of type %s", s.Name(), s.Status(), v.String(), want)
		}
	}
	if spans[1].Name() != "HTTP GET" {
		t.Errorf("lookup span %q; want HTTP GET", spans[1].Name())
	}
	if v, ok := spanAttr(spans[1], "http.response.status_code"); !ok || v.AsInt64() != 404 {
		t.Errorf("lookup span's http.response.status_code = %v (present %v); want 404", v.String(), ok)
	}
}

// Without a tracer provider a call carries no trace context of its own.
func TestUntracedCallsSendNoTraceparent(t *testing.T) {
	t.Parallel()
	srv, last := recorder(t)
	if got := newClient(t).Execute(context.Background(), newRequest(newRoute(srv.URL))); got.Outcome != gate.OutcomeConfirmed {
		t.Fatalf("got %+v", got)
	}
	if v := last().header.Get("Traceparent"); v != "" {
		t.Errorf("traceparent %q sent without tracing", v)
	}
}
