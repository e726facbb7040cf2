package telemetry

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ackgate/ackgate/gate"
)

// scrape reads h's Prometheus exposition the way a Prometheus server would:
// the real exporter's text output, parsed.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics answered %d", rec.Code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("/metrics is not the Prometheus text format: %v", err)
	}
	return fams
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// series finds the one sample of family whose labels include want.
func series(t *testing.T, fams map[string]*dto.MetricFamily, family string, want map[string]string) *dto.Metric {
	t.Helper()
	f, ok := fams[family]
	if !ok {
		t.Fatalf("no %s in the scrape", family)
	}
next:
	for _, m := range f.GetMetric() {
		for k, v := range want {
			if labelValue(m, k) != v {
				continue next
			}
		}
		return m
	}
	t.Fatalf("no %s series with %v", family, want)
	return nil
}

// bucketCount is the cumulative count of h at upper bound le.
func bucketCount(t *testing.T, h *dto.Histogram, le float64) uint64 {
	t.Helper()
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == le {
			return b.GetCumulativeCount()
		}
	}
	t.Fatalf("no bucket le=%v among %v", le, bounds(h))
	return 0
}

func bounds(h *dto.Histogram) []float64 {
	var out []float64
	for _, b := range h.GetBucket() {
		if !math.IsInf(b.GetUpperBound(), 1) {
			out = append(out, b.GetUpperBound())
		}
	}
	return out
}

func newPrometheus(t *testing.T) *Telemetry {
	t.Helper()
	tel, err := Setup(context.Background(), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	return tel
}

// A 30 ms downstream call and 30 ms of the gate's own time land in the
// 50 ms bucket and not below 25 ms: the boundaries are seconds.
func TestThirtyMillisecondsLandBelowFiftyMilliseconds(t *testing.T) {
	t.Parallel()
	tel := newPrometheus(t)
	route := &gate.Route{Name: "orders", Broker: gate.BrokerPubSub}
	ctx := context.Background()
	tel.Metrics.Downstream(ctx, route, gate.AttemptEffect, gate.OutcomeConfirmed, 30*time.Millisecond)
	tel.Metrics.Delivered(ctx, route, gate.BrokerPubSub, gate.Ack, 30*time.Millisecond)
	fams := scrape(t, tel.MetricsHandler)
	for _, family := range []string{"ackgate_downstream_duration_seconds", "ackgate_gate_duration_seconds"} {
		h := series(t, fams, family, map[string]string{"route": "orders"}).GetHistogram()
		if below, at := bucketCount(t, h, 0.025), bucketCount(t, h, 0.05); below != 0 || at != 1 {
			t.Errorf("%s: le=0.025 holds %d and le=0.05 holds %d, want 0 and 1 (boundaries %v)", family, below, at, bounds(h))
		}
		if h.GetSampleCount() != 1 || math.Abs(h.GetSampleSum()-0.03) > 1e-9 {
			t.Errorf("%s: count %d sum %v, want 1 and 0.03", family, h.GetSampleCount(), h.GetSampleSum())
		}
	}
}

// Every histogram the gateway exports has the boundaries histogramBuckets
// gives it, in seconds; one added without an entry there would come out
// with the SDK's millisecond defaults and fail here.
func TestEveryHistogramHasSecondBuckets(t *testing.T) {
	t.Parallel()
	tel := newPrometheus(t)
	ctx := context.Background()
	route := &gate.Route{Name: "orders", Broker: gate.BrokerPubSub, Shape: gate.ShapeHandoff}
	tel.Metrics.Downstream(ctx, route, gate.AttemptEffect, gate.OutcomeConfirmed, time.Millisecond)
	tel.Metrics.Delivered(ctx, route, gate.BrokerPubSub, gate.Ack, time.Millisecond)
	rm, err := tel.Metrics.NewRecoveryMetrics([]string{"orders"})
	if err != nil {
		t.Fatal(err)
	}
	rm.Reconciled(ctx, "orders", "found", time.Millisecond)
	relay, err := tel.Metrics.NewRelayMetrics()
	if err != nil {
		t.Fatal(err)
	}
	relay.Relayed(ctx, "orders", "acked", time.Millisecond)

	fams := scrape(t, tel.MetricsHandler)
	want := map[string][]float64{}
	for name, b := range histogramBuckets {
		want[promName(name)] = b
	}
	seen := 0
	for name, f := range fams {
		if f.GetType() != dto.MetricType_HISTOGRAM || !strings.HasPrefix(name, "ackgate_") {
			continue
		}
		seen++
		b, ok := want[name]
		if !ok {
			t.Errorf("%s has no entry in histogramBuckets", name)
			continue
		}
		for _, m := range f.GetMetric() {
			if got := bounds(m.GetHistogram()); !slices.Equal(got, b) {
				t.Errorf("%s: boundaries %v, want %v", name, got, b)
			}
		}
	}
	if seen != len(histogramBuckets) {
		t.Errorf("%d ackgate histograms in the scrape, want %d (one per histogramBuckets entry)", seen, len(histogramBuckets))
	}
	for name, b := range histogramBuckets {
		// Seconds: the top boundary is minutes at most, never 10000.
		if !slices.IsSorted(b) || b[len(b)-1] > 600 {
			t.Errorf("%s: boundaries %v are not increasing seconds", name, b)
		}
	}
}

// promName is the Prometheus name the exporter gives an instrument in
// seconds.
func promName(instrument string) string {
	out := []byte(instrument)
	for i, c := range out {
		if c == '.' {
			out[i] = '_'
		}
	}
	return string(out) + "_seconds"
}

// The Go runtime's and the process's own series are on the same /metrics.
func TestRuntimeAndProcessMetrics(t *testing.T) {
	t.Parallel()
	fams := scrape(t, newPrometheus(t).MetricsHandler)
	for _, name := range []string{
		"go_goroutines", "go_threads", "go_memstats_heap_alloc_bytes", "go_gc_duration_seconds",
		"process_open_fds", "process_resident_memory_bytes", "process_cpu_seconds_total",
	} {
		f, ok := fams[name]
		if !ok || len(f.GetMetric()) == 0 {
			t.Errorf("no %s in the scrape", name)
		}
	}
	if g := fams["go_goroutines"].GetMetric()[0].GetGauge().GetValue(); g < 1 {
		t.Errorf("go_goroutines = %v", g)
	}
}

// Before any delivery, every route has its counters at 0, so that the
// first increment is an increase() an alert sees.
func TestRouteCountersStartAtZero(t *testing.T) {
	t.Parallel()
	tel := newPrometheus(t)
	routes := []*gate.Route{
		{Name: "orders", Broker: gate.BrokerPubSub},
		{Name: "invoices", Broker: gate.BrokerSNS, Shape: gate.ShapeHandoff},
	}
	tel.Metrics.Routes(routes)
	relay, err := tel.Metrics.NewRelayMetrics()
	if err != nil {
		t.Fatal(err)
	}
	relay.Routes(routes)
	fams := scrape(t, tel.MetricsHandler)
	zero := func(family string, labels map[string]string) {
		t.Helper()
		m := series(t, fams, family, labels)
		if v := m.GetCounter().GetValue(); v != 0 {
			t.Errorf("%s%v = %v, want 0", family, labels, v)
		}
	}
	for _, r := range routes {
		for _, d := range zeroDecisions {
			zero("ackgate_deliveries_total", map[string]string{"route": r.Name, "broker": string(r.Broker), "decision": string(d)})
		}
		for _, s := range zeroStatuses {
			zero("ackgate_responses_total", map[string]string{"route": r.Name, "status": strconv.Itoa(s)})
		}
		for _, k := range zeroMalformed {
			zero("ackgate_malformed_total", map[string]string{"route": r.Name, "kind": k})
		}
		zero("ackgate_transitions_total", map[string]string{"route": r.Name, "from": "new", "to": "received"})
		zero("ackgate_transitions_total", map[string]string{"route": r.Name, "from": "pending_effect", "to": "terminal_failure"})
		zero("ackgate_reservation_contended_total", map[string]string{"route": r.Name})
	}
	for _, tr := range gate.Transitions() {
		zero("ackgate_transitions_total", map[string]string{"route": "orders", "from": string(tr.From), "to": string(tr.To)})
	}
	for _, o := range zeroRelayOutcomes {
		zero("ackgate_relay_passes_total", map[string]string{"route": "invoices", "outcome": o})
	}
	for _, m := range fams["ackgate_relay_passes_total"].GetMetric() {
		if labelValue(m, "route") == "orders" {
			t.Errorf("relay series for orders, which is not a handoff route")
		}
	}
	for _, s := range zeroRelayStages {
		zero("ackgate_relay_failures_total", map[string]string{"stage": s})
	}
	for _, e := range zeroAuthPlaces {
		for _, r := range zeroAuthWhys {
			zero("ackgate_admin_auth_failures_total", map[string]string{"endpoint": e, "reason": r})
		}
	}
	// And a counted delivery goes on from 0 under the same labels.
	tel.Metrics.Delivered(context.Background(), routes[0], gate.BrokerPubSub, gate.Nack, time.Millisecond)
	if v := series(t, scrape(t, tel.MetricsHandler), "ackgate_deliveries_total",
		map[string]string{"route": "orders", "decision": "nack"}).GetCounter().GetValue(); v != 1 {
		t.Errorf("nack after one delivery = %v, want 1", v)
	}
}
