package telemetry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

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

// Without any OTEL_* variable the gateway still gives spans sampled ids
// (they go to the ledger, the logs and the downstream) without recording
// them, and serves metrics.
func TestSetupWithoutExporter(t *testing.T) {
	t.Parallel()
	tel, err := Setup(context.Background(), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	_, span := tel.TracerProvider.Tracer("t").Start(context.Background(), "x")
	if sc := span.SpanContext(); !sc.IsValid() || !sc.IsSampled() || span.IsRecording() {
		t.Fatalf("span context %v, recording %v: want a valid, sampled span that records nothing", sc, span.IsRecording())
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

// A sampler named in the environment still gets the SDK, which records what
// it samples, also without an exporter.
func TestSetupWithSamplerButNoExporter(t *testing.T) {
	t.Parallel()
	tel, err := Setup(context.Background(), func(k string) string {
		if k == "OTEL_TRACES_SAMPLER" {
			return "always_on"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	_, span := tel.TracerProvider.Tracer("t").Start(context.Background(), "x")
	defer span.End()
	if !span.IsRecording() {
		t.Fatal("with OTEL_TRACES_SAMPLER set, spans should come from the SDK and record")
	}
}

// IDsOnly gives the ids and flags the SDK's default sampler would: a new
// sampled trace at the root, the parent's trace, flags and state below it,
// a new trace for WithNewRoot; and never a recording span.
func TestIDsOnly(t *testing.T) {
	t.Parallel()
	tr := IDsOnly().Tracer("t")
	ctx, root := tr.Start(context.Background(), "root")
	rc := root.SpanContext()
	if !rc.IsValid() || !rc.IsSampled() || root.IsRecording() {
		t.Fatalf("root %v, recording %v: want valid, sampled, not recording", rc, root.IsRecording())
	}
	_, child := tr.Start(ctx, "child", trace.WithSpanKind(trace.SpanKindClient))
	cc := child.SpanContext()
	if cc.TraceID() != rc.TraceID() || cc.SpanID() == rc.SpanID() || !cc.IsSampled() || child.IsRecording() {
		t.Errorf("child %v of %v: want the same trace, a new span id, sampled, not recording", cc, rc)
	}
	state, err := trace.ParseTraceState("vendor=x")
	if err != nil {
		t.Fatal(err)
	}
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceState: state, Remote: true,
	})
	_, under := tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), remote), "under an unsampled parent")
	uc := under.SpanContext()
	if uc.TraceID() != remote.TraceID() || uc.IsSampled() || uc.TraceState().String() != "vendor=x" || uc.IsRemote() {
		t.Errorf("child %v of the unsampled remote %v: want its trace and state, unsampled, local", uc, remote)
	}
	_, fresh := tr.Start(ctx, "new root", trace.WithAttributes(attribute.String("k", "v")), trace.WithNewRoot())
	if fc := fresh.SpanContext(); fc.TraceID() == rc.TraceID() || !fc.IsSampled() {
		t.Errorf("new root %v under %v: want a trace of its own, sampled", fc, rc)
	}
	seen := map[trace.TraceID]bool{}
	for range 1000 {
		_, s := tr.Start(context.Background(), "x")
		if id := s.SpanContext().TraceID(); seen[id] {
			t.Fatalf("trace id %v repeated", id)
		} else {
			seen[id] = true
		}
	}
}

// The metrics reuse one attribute set per label combination: every
// combination still counts under its own labels, and instruments whose
// labels share values never mix.
func TestMetricsLabelCombinations(t *testing.T) {
	t.Parallel()
	tel, err := Setup(context.Background(), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	ctx := context.Background()
	route := &gate.Route{Name: "orders"}
	for range 3 {
		tel.Metrics.Response(ctx, gate.BrokerPubSub, "orders", 204)
	}
	tel.Metrics.Response(ctx, gate.BrokerPubSub, "orders", 503)
	tel.Metrics.Response(ctx, gate.BrokerSNS, "orders", 204)
	tel.Metrics.Malformed(ctx, gate.BrokerPubSub, "orders", "envelope")
	tel.Metrics.Transitioned(ctx, route, []gate.Step{{Transition: gate.Transition{To: gate.StateReceived}}, {Transition: gate.Transition{From: gate.StateReceived, To: gate.StateReserved}}})
	tel.Metrics.Transitioned(ctx, route, []gate.Step{{Transition: gate.Transition{To: gate.StateReceived}}})
	tel.Metrics.Contended(ctx, route)
	rec := httptest.NewRecorder()
	tel.MetricsHandler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`ackgate_responses_total{broker="pubsub",otel_scope_name=`,
		`route="orders",status="204"} 3`,
		`route="orders",status="503"} 1`,
		`broker="sns",`,
		`kind="envelope",`,
		`from="new",`,
		`to="received"} 2`,
		`from="received",`,
		`to="reserved"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}
}
