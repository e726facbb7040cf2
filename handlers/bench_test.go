package handlers_test

import (
	"bytes"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ackgate/ackgate/telemetry"
)

// The cost of a delivery through the whole gateway (HTTP in, Postgres ledger,
// Redis reservation, an HTTP downstream on loopback, HTTP out), fully
// instrumented as in production. Run with `make bench-go`; figures (with
// allocations per delivery) are in docs/performance.md. These are
// measurements, never assertions.

func BenchmarkPushNewOperation(b *testing.B) {
	benchmarkNewOperations(b, newEnv(b, true, routeYAML("orders", "idempotent", "broker", "")))
}

// The same with no delivery sampled (a parent-based sampler that samples
// no root), as under a low sampling ratio: what tracing costs a delivery
// that is not traced.
func BenchmarkPushNewOperationUnsampled(b *testing.B) {
	benchmarkNewOperations(b, newEnvSampled(b, true, routeYAML("orders", "idempotent", "broker", ""), nil,
		sdktrace.ParentBased(sdktrace.NeverSample())))
}

// The same with the tracer provider of a gateway that exports no traces
// (telemetry.IDsOnly): every span has its ids, none records.
func BenchmarkPushNewOperationNoExporter(b *testing.B) {
	benchmarkNewOperations(b, newEnvTraced(b, true, routeYAML("orders", "idempotent", "broker", ""), nil,
		telemetry.IDsOnly(), tracetest.NewInMemoryExporter()))
}

func benchmarkNewOperations(b *testing.B, e *env) {
	client := &http.Client{}
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := envelope(msg{ID: fmt.Sprintf("bench-%d", n.Add(1)), Data: "x"})
			resp, err := client.Post(e.ingest.URL+"/v1/push/pubsub/orders", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	})
}

func BenchmarkPushRedeliveryOfConfirmed(b *testing.B) {
	e := newEnv(b, true, routeYAML("orders", "idempotent", "broker", ""))
	body := envelope(msg{ID: "bench-again", Data: "x"})
	client := &http.Client{}
	post := func() {
		resp, err := client.Post(e.ingest.URL+"/v1/push/pubsub/orders", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	post()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			post()
		}
	})
}
