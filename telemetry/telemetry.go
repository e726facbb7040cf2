// Package telemetry sets up OpenTelemetry for the gateway and owns its
// instruments. It exists so that main wires tracing, metrics and logs in one
// call, and so that gate/ can stay on the OpenTelemetry APIs behind the
// Recorder interface it declares: the SDK, the exporters and the Prometheus
// registry live here and nowhere else.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ServiceName is the default service.name; OTEL_SERVICE_NAME overrides it.
const ServiceName = "ackgate"

// Telemetry is what the rest of the gateway needs from OpenTelemetry.
type Telemetry struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Propagators    propagation.TextMapPropagator
	Metrics        *Metrics
	// MetricsHandler serves the Prometheus exposition of every instrument.
	MetricsHandler http.Handler
	shutdown       []func(context.Context) error
}

// Setup builds tracing and metrics from the standard OTEL_* variables.
//
// Traces are exported only when an exporter is configured: OTEL_TRACES_EXPORTER
// (otlp, console, none), or an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). Without one, spans still get ids and
// sampling flags, so trace ids reach the ledger, the logs and the downstream,
// but nothing is recorded (IDsOnly), unless OTEL_TRACES_SAMPLER asks for the
// SDK's sampling anyway. The exporter itself is chosen by autoexport, which
// reads the process environment. Metrics always go to the Prometheus handler.
func Setup(ctx context.Context, getenv func(string) string) (*Telemetry, error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(
			attribute.String("service.name", ServiceName),
			attribute.String("service.version", Version()),
		),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
		resource.WithTelemetrySDK(),
		resource.WithHost(),
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	if !tracesConfigured(getenv) && getenv("OTEL_TRACES_SAMPLER") == "" {
		return WithPrometheus(IDsOnly(), res)
	}
	topts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if tracesConfigured(getenv) {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: span exporter: %w", err)
		}
		topts = append(topts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(topts...)
	t, err := WithPrometheus(tp, res)
	if err != nil {
		return nil, err
	}
	t.shutdown = append([]func(context.Context) error{tp.Shutdown}, t.shutdown...)
	return t, nil
}

// WithPrometheus wires tp with a meter provider whose instruments are served
// in the Prometheus format by MetricsHandler, from a registry of its own.
// The same registry carries the Go runtime's and the process's series
// (go_goroutines, go_memstats_*, go_gc_duration_seconds, process_open_fds,
// process_resident_memory_bytes, ...) from client_golang's own collectors,
// the names every Prometheus dashboard for a Go service already expects.
func WithPrometheus(tp trace.TracerProvider, res *resource.Resource) (*Telemetry, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("telemetry: go collector: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("telemetry: process collector: %w", err)
	}
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	opts := []sdkmetric.Option{sdkmetric.WithReader(exp), sdkmetric.WithResource(res)}
	for _, v := range durationViews() {
		opts = append(opts, sdkmetric.WithView(v))
	}
	mp := sdkmetric.NewMeterProvider(opts...)
	t, err := New(tp, mp)
	if err != nil {
		return nil, err
	}
	t.MetricsHandler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	t.shutdown = append(t.shutdown, mp.Shutdown)
	return t, nil
}

// New wires given providers (tests pass in-memory ones).
func New(tp trace.TracerProvider, mp metric.MeterProvider) (*Telemetry, error) {
	m, err := NewMetrics(mp)
	if err != nil {
		return nil, err
	}
	return &Telemetry{
		TracerProvider: tp,
		MeterProvider:  mp,
		Propagators:    propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		Metrics:        m,
	}, nil
}

// Shutdown flushes spans still buffered and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

func tracesConfigured(getenv func(string) string) bool {
	if v := getenv("OTEL_TRACES_EXPORTER"); v != "" {
		return v != "none"
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// version is stamped at build time: the Dockerfile's VERSION build argument
// reaches it through -ldflags "-X github.com/ackgate/ackgate/telemetry.version=...".
// A build from a module download (go install ...@v1.2.3) has no stamp but
// knows its module version.
var version string

// Version is the version the binary was stamped with at build time, else
// the module version it was built from, else "dev". It is the resource's
// service.version and what `gateway version` prints.
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
