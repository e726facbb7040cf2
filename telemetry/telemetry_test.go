package telemetry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/gate"
)

func TestTracesExportedOnlyWhenConfigured(t *testing.T) {
	t.Parallel()
	for env, want := range map[string]bool{
		"":                             false,
		"OTEL_TRACES_EXPORTER=none":    false,
		"OTEL_TRACES_EXPORTER=otlp":    true,
		"OTEL_TRACES_EXPORTER=console": true,
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318":     true,
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://c:1": true,
	} {
		k, v, _ := strings.Cut(env, "=")
		getenv := func(name string) string {
			if name == k {
				return v
			}
			return ""
		}
		if got := tracesConfigured(getenv); got != want {
			t.Errorf("%q: exporting = %v, want %v", env, got, want)
		}
	}
}

// Without any OTEL_* variable the gateway still creates sampled spans (their
// ids go to the ledger and logs) and serves metrics.
func TestSetupWithoutExporter(t *testing.T) {
	t.Parallel()
	tel, err := Setup(context.Background(), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	_, span := tel.TracerProvider.Tracer("t").Start(context.Background(), "x")
	if sc := span.SpanContext(); !sc.IsValid() || !sc.IsSampled() {
		t.Fatalf("span context %v: want a valid, sampled span", sc)
	}
	span.End()
	tel.Metrics.Response(context.Background(), gate.BrokerPubSub, "orders", 204)
	rec := httptest.NewRecorder()
	tel.MetricsHandler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	if rec.Code != http.StatusOK || !strings.Contains(string(body), `ackgate_responses_total{`) {
		t.Fatalf("/metrics %d:\n%s", rec.Code, body)
	}
}
