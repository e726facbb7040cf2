package handlers_test

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
)

// waitSpans returns the recorded spans once want(spans) holds: some spans
// end after the response (post-ack bookkeeping), so tests wait for them.
func waitSpans(t *testing.T, exp *tracetest.InMemoryExporter, want func([]tracetest.SpanStub) bool) []tracetest.SpanStub {
	t.Helper()
	var spans []tracetest.SpanStub
	testenv.Eventually(t, 10*time.Second, func() bool { spans = exp.GetSpans(); return want(spans) }, func() string {
		var names []string
		for _, s := range spans {
			names = append(names, s.Name)
		}
		return fmt.Sprintf("spans never matched; have %v", names)
	})
	return spans
}

func findSpan(spans []tracetest.SpanStub, match func(tracetest.SpanStub) bool) (tracetest.SpanStub, bool) {
	for _, s := range spans {
		if match(s) {
			return s, true
		}
	}
	return tracetest.SpanStub{}, false
}

func named(name string) func(tracetest.SpanStub) bool {
	return func(s tracetest.SpanStub) bool { return s.Name == name }
}

// One trace per delivery: the push request's server span, and under it the
// reservation (with Redis's own span), the ledger writes (with the shared
// batch that carried them and its Postgres query spans), the downstream
// client span, and the ack decision. The
// downstream, instrumented on its own with otelhttp, sees the same trace.
func TestOneTraceFromPushToDownstream(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, routeYAML("orders", "idempotent", "broker", ""))
	m := msg{ID: "m-traced", Data: "x"}
	wantStatus(t, e.push("orders", m), http.StatusNoContent)

	spans := waitSpans(t, e.spans, func(s []tracetest.SpanStub) bool {
		_, ok := findSpan(s, named("process orders"))
		return ok
	})
	server, _ := findSpan(spans, named("process orders"))
	if server.SpanKind != trace.SpanKindServer {
		t.Fatalf("push span kind = %v, want server", server.SpanKind)
	}
	tid := server.SpanContext.TraceID()
	inTrace := func(match func(tracetest.SpanStub) bool) func(tracetest.SpanStub) bool {
		return func(s tracetest.SpanStub) bool { return s.SpanContext.TraceID() == tid && match(s) }
	}
	for _, want := range []struct {
		what  string
		match func(tracetest.SpanStub) bool
	}{
		{"reservation", named("reserve")},
		{"Redis command", func(s tracetest.SpanStub) bool {
			return hasAttr(s, "db.system", "redis") || hasAttr(s, "db.system.name", "redis")
		}},
		{"ledger claim", named("ledger claim")},
		{"ledger settle", named("ledger settle")},
		{"ledger batch", named("ledger batch")},
		{"Postgres query", func(s tracetest.SpanStub) bool {
			return hasAttr(s, "db.system", "postgresql") || hasAttr(s, "db.system.name", "postgresql")
		}},
		{"downstream effect", named("downstream effect")},
		{"downstream HTTP client span", func(s tracetest.SpanStub) bool {
			return s.SpanKind == trace.SpanKindClient && hasAttr(s, "http.request.method", "POST")
		}},
		{"ack decision", named("ack decision")},
	} {
		if _, ok := findSpan(spans, inTrace(want.match)); !ok {
			t.Errorf("no %s span in the delivery's trace", want.what)
		}
	}
	client, _ := findSpan(spans, inTrace(func(s tracetest.SpanStub) bool {
		return s.SpanKind == trace.SpanKindClient && hasAttr(s, "http.request.method", "POST")
	}))
	down := waitSpans(t, e.down.spans, func(s []tracetest.SpanStub) bool { return len(s) > 0 })
	if got := down[0].SpanContext.TraceID(); got != tid {
		t.Fatalf("downstream saw trace %s, the delivery is trace %s", got, tid)
	}
	if down[0].Parent.SpanID() != client.SpanContext.SpanID() {
		t.Fatalf("downstream span's parent %s is not the gateway's client span %s", down[0].Parent.SpanID(), client.SpanContext.SpanID())
	}
	if attr(server, "messaging.system") != "gcp_pubsub" || attr(server, "messaging.message.id") != "m-traced" ||
		attr(server, "http.response.status_code") != "204" {
		t.Fatalf("server span attributes: %v", server.Attributes)
	}

	// The trace id is in the ledger and the evidence API.
	rec := e.record(e.opID("orders", m))
	if rec.Operation.TraceID != tid.String() || rec.Deliveries[0].TraceID != tid.String() {
		t.Fatalf("ledger trace ids %q / %q, want %s", rec.Operation.TraceID, rec.Deliveries[0].TraceID, tid)
	}
	var ev adminapi.EvidenceRecord
	e.adminGet("/v1/operations/"+rec.Operation.ID, &ev)
	if ev.Evidence.TraceID != tid.String() {
		t.Fatalf("evidence API trace id %q, want %s", ev.Evidence.TraceID, tid)
	}

	// A redelivery has a trace of its own, linked to the first delivery's span.
	wantStatus(t, e.push("orders", m), http.StatusNoContent)
	spans = waitSpans(t, e.spans, func(s []tracetest.SpanStub) bool {
		n := 0
		for _, sp := range s {
			if sp.Name == "process orders" {
				n++
			}
		}
		return n == 2
	})
	var second tracetest.SpanStub
	for _, s := range spans {
		if s.Name == "process orders" && s.SpanContext.TraceID() != tid {
			second = s
		}
	}
	if len(second.Links) != 1 || second.Links[0].SpanContext.TraceID() != tid || second.Links[0].SpanContext.SpanID() != server.SpanContext.SpanID() {
		t.Fatalf("redelivery links = %+v, want one link to %s/%s", second.Links, tid, server.SpanContext.SpanID())
	}
}

// A message carrying googclient_traceparent continues the publisher's trace;
// without it, the push request's traceparent header is the parent.
func TestPublisherTraceContextIsTheParent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, routeYAML("orders", "idempotent", "broker", ""))
	const (
		pubTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
		pubSpan   = "00f067aa0ba902b7"
		hdrTrace  = "0af7651916cd43dd8448eb211c80319c"
		hdrSpan   = "b7ad6b7169203331"
		publisher = "00-" + pubTrace + "-" + pubSpan + "-01"
		header    = "00-" + hdrTrace + "-" + hdrSpan + "-01"
	)
	push := func(m msg) {
		req, _ := http.NewRequest(http.MethodPost, e.ingest.URL+"/v1/push/pubsub/orders", strings.NewReader(string(envelope(m))))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("push %s: %d", m.ID, resp.StatusCode)
		}
	}
	push(msg{ID: "m-pub", Data: "x", Attrs: map[string]string{"googclient_traceparent": publisher}})
	push(msg{ID: "m-hdr", Data: "y"})
	spans := waitSpans(t, e.spans, func(s []tracetest.SpanStub) bool {
		n := 0
		for _, sp := range s {
			if sp.Name == "process orders" {
				n++
			}
		}
		return n == 2
	})
	for _, s := range spans {
		if s.Name != "process orders" {
			continue
		}
		wantTrace, wantParent := hdrTrace, hdrSpan
		if attr(s, "messaging.message.id") == "m-pub" {
			wantTrace, wantParent = pubTrace, pubSpan
		}
		if s.SpanContext.TraceID().String() != wantTrace || s.Parent.SpanID().String() != wantParent {
			t.Errorf("%s: trace %s parent %s, want trace %s parent %s", attr(s, "messaging.message.id"),
				s.SpanContext.TraceID(), s.Parent.SpanID(), wantTrace, wantParent)
		}
	}
}

// A scrape of /metrics shows the counters and the lane gauges moving.
func TestMetricsMoveAsDeliveriesRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("orders", "idempotent", "broker", "")+routeYAML("mail", "unsafe", "broker", ""))
	scrape := func() string {
		t.Helper()
		// The lane gauges show the latest background count; take one now.
		if err := e.gw.Lanes.Refresh(t.Context()); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, e.admin.URL+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/metrics: %d %s", resp.StatusCode, b)
		}
		return string(b)
	}
	lane := func(text, route string, state gate.State) float64 {
		return metricValue(t, text, "ackgate_lane_operations", map[string]string{"route": route, "state": string(state)})
	}
	before := scrape()
	if lane(before, "orders", gate.StatePendingEffect) != 0 || lane(before, "mail", gate.StateEffectIndeterminate) != 0 {
		t.Fatalf("lanes not empty at start:\n%s", before)
	}

	wantStatus(t, e.push("orders", msg{ID: "ok-1", Data: "a"}), http.StatusNoContent)
	e.down.set(status(http.StatusServiceUnavailable))
	wantStatus(t, e.push("orders", msg{ID: "fail-1", Data: "b"}), http.StatusServiceUnavailable)
	e.down.set(dropAfterApply)
	wantStatus(t, e.push("mail", msg{ID: "lost-1", Data: "c"}), http.StatusServiceUnavailable)
	after := scrape()

	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ackgate_deliveries_total", map[string]string{"route": "orders", "decision": "ack", "broker": "pubsub"}, 1},
		{"ackgate_deliveries_total", map[string]string{"route": "orders", "decision": "nack"}, 1},
		{"ackgate_responses_total", map[string]string{"route": "orders", "status": "204"}, 1},
		{"ackgate_responses_total", map[string]string{"route": "mail", "status": "503"}, 1},
		// Every edge is exported from the start (at 0), so the edge is named.
		{"ackgate_transitions_total", map[string]string{"route": "orders", "from": "pending_effect", "to": "effect_confirmed"}, 1},
		{"ackgate_transitions_total", map[string]string{"route": "mail", "from": "pending_effect", "to": "effect_indeterminate"}, 1},
		{"ackgate_downstream_duration_seconds_count", map[string]string{"route": "orders", "outcome": "retryable"}, 1},
		{"ackgate_gate_duration_seconds_count", map[string]string{"route": "orders", "decision": "ack"}, 1},
		{"ackgate_lane_operations", map[string]string{"route": "orders", "state": "pending_effect"}, 1},
		{"ackgate_lane_operations", map[string]string{"route": "mail", "state": "effect_indeterminate"}, 1},
	} {
		if got := metricValue(t, after, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// Group commit's round trips: at least one a delivery, each carrying a
	// step or more, and the time they were out.
	moved := func(name string) float64 {
		return metricValue(t, after, name, nil) - metricValue(t, before, name, nil)
	}
	if batches, steps, busy := moved("ackgate_ledger_batches_total"), moved("ackgate_ledger_batch_steps_total"),
		moved("ackgate_ledger_busy_seconds_total"); batches < 3 || steps < batches || busy <= 0 {
		t.Errorf("group commit: %v batches of %v steps, out %v s; want 3 or more, a step each, some time", batches, steps, busy)
	}

	// Contention is counted when a delivery finds the lease held.
	entered, release := make(chan struct{}, 1), testenv.NewRelease(t)
	e.down.set(func(w http.ResponseWriter, _ *http.Request, apply func() string) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release.C
		answer(w, apply())
	})
	done := make(chan reply, 1)
	go func() { done <- e.push("orders", msg{ID: "busy", Data: "d"}) }()
	testenv.Receive(t, entered, "the first delivery never reached the downstream")
	wantStatus(t, e.push("orders", msg{ID: "busy", Data: "d"}), http.StatusServiceUnavailable)
	release.Now()
	testenv.Receive(t, done, "the lease holder was not answered after its downstream call returned")
	if got := metricValue(t, scrape(), "ackgate_reservation_contended_total", map[string]string{"route": "orders"}); got != 1 {
		t.Fatalf("contention counter = %v, want 1", got)
	}
}

// Logs carry ids, routes and reasons; never message bodies, and never an
// attribute the route marks private, whatever path the delivery takes, even
// when the private attribute is the operation key (which reasons quote).
func TestLogsCarryNoBodiesOrPrivateAttributes(t *testing.T) {
	t.Parallel()
	const body, secret = "BODY-MARKER-7f3a", "PRIVATE-MARKER-91c2"
	e := newEnvWith(t, false, routeYAML("orders", "unsafe", "broker", "    private: [card]\n")+
		routeYAML("keyed", "unsafe", "broker", "    operation_key: {kind: attribute, name: card}\n    private: [card]\n"),
		map[string]string{"GATEWAY_KEY_HASH_SECRET": keyHashSecret})
	attrs := map[string]string{"card": secret}
	wantStatus(t, e.push("keyed", msg{ID: "k-1", Data: body, Attrs: attrs}), http.StatusNoContent)
	wantStatus(t, e.push("keyed", msg{ID: "k-2", Data: body + "-changed", Attrs: attrs}), http.StatusServiceUnavailable) // conflict on the key
	wantStatus(t, e.push("orders", msg{ID: "ok", Data: body, Attrs: attrs}), http.StatusNoContent)
	wantStatus(t, e.push("orders", msg{ID: "ok", Data: body + "-changed", Attrs: attrs}), http.StatusServiceUnavailable) // conflict
	e.down.set(status(http.StatusBadRequest))
	wantStatus(t, e.push("orders", msg{ID: "refused", Data: body, Attrs: attrs}), http.StatusServiceUnavailable)
	e.down.set(dropAfterApply)
	wantStatus(t, e.push("orders", msg{ID: "lost", Data: body, Attrs: attrs}), http.StatusServiceUnavailable)
	wantStatus(t, e.pushRaw("orders", []byte(`{"message":{"data":"`+body+`","messageId":"x","attributes":{"card":"`+secret+`"}},"subscription":"s"}`)), http.StatusBadRequest)
	wantStatus(t, e.pushRaw("orders", []byte(`{"`+body+`":`)), http.StatusBadRequest)

	logs := e.logs.String()
	if strings.Contains(logs, body) || strings.Contains(logs, secret) {
		t.Fatalf("a message body or private attribute reached the logs:\n%s", logs)
	}
	// The logs are not simply empty: each answer is logged with its trace.
	answered := regexp.MustCompile(`"msg":"delivery answered".*"trace_id":"[0-9a-f]{32}"`)
	if n := len(answered.FindAllString(logs, -1)); n < 6 {
		t.Fatalf("%d answered deliveries logged with a trace id, want 6:\n%s", n, logs)
	}
	if !strings.Contains(logs, `"operation_id":"op_`) || !strings.Contains(logs, `"route":"orders"`) {
		t.Fatalf("logs lack operation ids or routes:\n%s", logs)
	}
}

func hasAttr(s tracetest.SpanStub, key, value string) bool { return attr(s, key) == value }

func attr(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// metricValue finds the sample of name whose labels include all of want, in
// Prometheus text format; 0 when there is none. Two matching samples are an
// error: the labels given must pick one series.
func metricValue(t *testing.T, text, name string, want map[string]string) float64 {
	t.Helper()
	var found []float64
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		end := strings.LastIndex(line, "}")
		labels, value := line[len(name)+1:end], strings.TrimSpace(line[end+1:])
		ok := true
		for k, v := range want {
			if !strings.Contains(","+labels+",", ","+k+"="+strconv.Quote(v)+",") {
				ok = false
			}
		}
		if ok {
			f, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatalf("sample %q: %v", line, err)
			}
			found = append(found, f)
		}
	}
	switch len(found) {
	case 0:
		return 0
	case 1:
		return found[0]
	}
	t.Fatalf("%s%v matches %d series; give more labels", name, want, len(found))
	return 0
}
