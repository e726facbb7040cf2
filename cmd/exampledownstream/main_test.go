package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/ackgate/ackgate/downstream"
	"github.com/ackgate/ackgate/gate"
)

func newTestServer(t *testing.T, f faults) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(newServer(newStore(), f, slog.New(slog.DiscardHandler)))
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, url, key, body string) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return do(t, req)
}

func get(t *testing.T, url string) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) (int, http.Header, map[string]any) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("%s %s: body is not a JSON object: %v", req.Method, req.URL.Path, err)
	}
	return resp.StatusCode, resp.Header, v
}

func countsOf(t *testing.T, base string) map[string]any {
	t.Helper()
	status, _, v := get(t, base+"/effects")
	if status != http.StatusOK {
		t.Fatalf("GET /effects: %d", status)
	}
	return v
}

func TestSameKeyAppliesOnce(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, faults{})

	status, h, first := post(t, srv.URL+"/effects", "k-1", `{"order":1}`)
	if status != http.StatusCreated || first["id"] == "" || h.Get("X-Result-Id") != first["id"] {
		t.Fatalf("first call: %d %v header %q", status, first, h.Get("X-Result-Id"))
	}
	status, h, again := post(t, srv.URL+"/effects", "k-1", `{"order":1}`)
	if status != http.StatusOK || again["id"] != first["id"] || h.Get("X-Result-Id") != first["id"] {
		t.Fatalf("repeat: %d %v; want 200 with id %v", status, again, first["id"])
	}
	status, _, _ = post(t, srv.URL+"/effects", "k-1", `{"order":2}`)
	if status != http.StatusConflict {
		t.Fatalf("same key, different body: %d; want 409", status)
	}

	status, _, found := get(t, srv.URL+"/effects/k-1")
	if status != http.StatusOK || found["id"] != first["id"] {
		t.Fatalf("lookup: %d %v", status, found)
	}
	if status, _, _ := get(t, srv.URL+"/effects/k-2"); status != http.StatusNotFound {
		t.Fatalf("lookup of an unknown key: %d; want 404", status)
	}
	c := countsOf(t, srv.URL)
	if c["effects"] != float64(1) || c["repeats"] != float64(1) || c["conflicts"] != float64(1) {
		t.Fatalf("counts %v; want one effect, one repeat, one conflict", c)
	}
}

func TestKeyIsRequired(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, faults{})
	if status, _, _ := post(t, srv.URL+"/effects", "", `{}`); status != http.StatusBadRequest {
		t.Fatalf("no key: %d; want 400", status)
	}
	if c := countsOf(t, srv.URL); c["effects"] != float64(0) {
		t.Fatalf("counts %v; want nothing applied", c)
	}
}

func TestConcurrentSameKeyAppliesOnce(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, faults{})
	const n = 16
	ids := make([]any, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/effects", strings.NewReader("same"))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("Idempotency-Key", "k-c")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var v map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
				t.Error(err)
			}
			ids[i] = v["id"]
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("ids differ: %v", ids)
		}
	}
	if c := countsOf(t, srv.URL); c["effects"] != float64(1) || c["repeats"] != float64(n-1) {
		t.Fatalf("counts %v; want one effect and %d repeats", c, n-1)
	}
}

func TestInjectedFailureAppliesNothing(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, faults{})
	if status, _, _ := post(t, srv.URL+"/effects?fail=503", "k-f", `{}`); status != http.StatusServiceUnavailable {
		t.Fatalf("?fail=503: %d", status)
	}
	if status, _, _ := get(t, srv.URL+"/effects/k-f"); status != http.StatusNotFound {
		t.Fatalf("a failed call left an effect: %d", status)
	}
	if c := countsOf(t, srv.URL); c["effects"] != float64(0) || c["injected_failures"] != float64(1) {
		t.Fatalf("counts %v", c)
	}

	always := newTestServer(t, faults{failRate: 1, failStatus: 429})
	if status, _, _ := post(t, always.URL+"/effects", "k-f", `{}`); status != http.StatusTooManyRequests {
		t.Fatalf("-fail-rate 1 -fail-status 429: %d", status)
	}
}

// TestWithGatewayClient drives the example with the gateway's own effect
// client: a lost answer is unknown, the retry with the same key is confirmed
// with the same id, and the effect was applied once.
func TestWithGatewayClient(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, faults{})
	client := downstream.New(downstream.Options{})
	t.Cleanup(client.CloseIdleConnections)

	route := &gate.Route{Name: "orders", Effect: gate.EffectSpec{
		URL:             srv.URL + "/effects?drop=1",
		BodyMode:        gate.BodyRaw,
		ResultIDHeader:  "X-Result-Id",
		ResultIDPointer: "/id",
		LookupURL:       srv.URL + "/effects/{key}",
	}}
	req := &gate.EffectRequest{
		Route:          route,
		Message:        &gate.Message{MessageID: "m-1", Data: []byte(`{"order":1}`)},
		OperationID:    "op_1",
		IdempotencyKey: "ik_1",
		Fence:          1,
	}
	ctx := context.Background()

	if got := client.Lookup(ctx, req); got.Outcome != gate.OutcomeAbsent {
		t.Fatalf("lookup before the effect: %+v", got)
	}
	lost := client.Execute(ctx, req)
	if lost.Outcome != gate.OutcomeUnknown {
		t.Fatalf("dropped answer: %+v; want unknown", lost)
	}
	found := client.Lookup(ctx, req)
	if found.Outcome != gate.OutcomeConfirmed || found.ResultID == "" {
		t.Fatalf("lookup after the effect: %+v", found)
	}
	retry := client.Execute(ctx, req)
	if retry.Outcome != gate.OutcomeConfirmed || retry.ResultID != found.ResultID {
		t.Fatalf("retry: %+v; want confirmed with %q", retry, found.ResultID)
	}
	if c := countsOf(t, srv.URL); c["effects"] != float64(1) || c["dropped_answers"] != float64(1) {
		t.Fatalf("counts %v; want one effect, one dropped answer", c)
	}
}

// logSink collects run's log lines and hands over the listening address.
type logSink struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	addr chan string
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(p)
	if s.addr != nil {
		for _, f := range strings.FieldsFunc(s.buf.String(), func(r rune) bool { return r == ' ' || r == ',' || r == '\n' }) {
			if a, ok := strings.CutPrefix(f, "addr="); ok {
				s.addr <- a
				s.addr = nil
				break
			}
			if a, ok := strings.CutPrefix(f, `"addr":"`); ok {
				s.addr <- strings.TrimSuffix(a, `"`)
				s.addr = nil
				break
			}
		}
	}
	return len(p), nil
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// The downstream logs one record per request in the format chosen, JSON
// unless told otherwise, and GATEWAY_LOG_FORMAT chooses it for both of
// make run's processes.
func TestRun(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
		text bool
	}{
		{"default json", nil, nil, false},
		{"flag text", []string{"-log-format", "text"}, nil, true},
		{"gateway's setting", nil, map[string]string{"GATEWAY_LOG_FORMAT": "text"}, true},
		{"own setting first", nil, map[string]string{"GATEWAY_LOG_FORMAT": "text", "EXAMPLEDOWNSTREAM_LOG_FORMAT": "json"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			out := runOnce(t, c.args, c.env)
			if c.text {
				for _, want := range []string{"path=/readyz status=200", "path=/effects status=201", "key=k-run", "outcome=applied", "msg=stopped"} {
					if !strings.Contains(out, want) {
						t.Errorf("logs lack %q:\n%s", want, out)
					}
				}
				return
			}
			var msgs []string
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				var rec map[string]any
				if err := json.Unmarshal([]byte(line), &rec); err != nil {
					t.Fatalf("not a JSON record: %q", line)
				}
				if rec["msg"] == "request" && rec["path"] == "/effects" && (rec["status"] != float64(201) || rec["key"] != "k-run" || rec["outcome"] != "applied") {
					t.Errorf("effect request record: %v", rec)
				}
				msgs = append(msgs, rec["msg"].(string))
			}
			if strings.Join(msgs, ",") != "listening,request,request,stopped" {
				t.Errorf("records %v:\n%s", msgs, out)
			}
		})
	}
}

// runOnce runs the downstream with args and env, makes a readiness check
// and one effect call, stops it, and returns what it logged.
func runOnce(t *testing.T, args []string, env map[string]string) string {
	t.Helper()
	addr := make(chan string, 1)
	logs := &logSink{addr: addr}
	var stderr bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"exampledownstream", "-addr", "127.0.0.1:0"}, args...), func(k string) string { return env[k] }, logs, &stderr)
	}()

	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("run returned before listening: %v (%s)", err, stderr.String())
	}
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("readyz: %d", resp.StatusCode)
	}
	if status, _, _ := post(t, base+"/effects", "k-run", `{}`); status != http.StatusCreated {
		t.Fatalf("effect: %d", status)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	return logs.String()
}

func TestConfigFromEnvAndFlags(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"EXAMPLEDOWNSTREAM_ADDR":      "127.0.0.1:7000",
		"EXAMPLEDOWNSTREAM_FAIL_RATE": "0.25",
	}
	cfg, err := parseConfig([]string{"x", "-drop-rate", "0.5"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := config{addr: "127.0.0.1:7000", logFormat: "json", faults: faults{failRate: 0.25, failStatus: 503, dropRate: 0.5}}
	if cfg != want {
		t.Fatalf("config %+v; want %+v", cfg, want)
	}
	for _, args := range [][]string{{"x", "-fail-rate", "2"}, {"x", "-fail-status", "200"}, {"x", "-drop-rate", "x"}} {
		if _, err := parseConfig(args, func(string) string { return "" }, io.Discard); err == nil {
			t.Errorf("%v: accepted", args[1:])
		}
	}
}

func send(t *testing.T, method, url string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	status, _, v := do(t, req)
	return status, v
}

// The faults switched at run time apply to every effect call until they
// are switched back to those of the flags; lookups go on answering.
func TestFaultSwitch(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, faults{failStatus: 503})
	if status, v := send(t, http.MethodPut, srv.URL+"/faults?fail=422"); status != http.StatusOK || v["fail_rate"] != 1.0 || v["fail_status"] != 422.0 {
		t.Fatalf("PUT /faults?fail=422: %d %v", status, v)
	}
	if status, _, _ := post(t, srv.URL+"/effects", "k-1", `{}`); status != http.StatusUnprocessableEntity {
		t.Fatalf("effect while failing: %d", status)
	}
	if status, _, _ := get(t, srv.URL+"/effects/k-1"); status != http.StatusNotFound {
		t.Fatalf("lookup of an effect never applied: %d", status)
	}
	if status, v := send(t, http.MethodDelete, srv.URL+"/faults"); status != http.StatusOK || v["fail_rate"] != 0.0 {
		t.Fatalf("DELETE /faults: %d %v", status, v)
	}
	if status, _, _ := post(t, srv.URL+"/effects", "k-1", `{}`); status != http.StatusCreated {
		t.Fatalf("effect after the faults were cleared: %d", status)
	}

	// drop=1: applied, and the answer never comes.
	if status, v := send(t, http.MethodPut, srv.URL+"/faults?drop=1"); status != http.StatusOK || v["drop_rate"] != 1.0 || v["fail_rate"] != 0.0 {
		t.Fatalf("PUT /faults?drop=1: %d %v", status, v)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/effects", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k-2")
	// A fresh connection: net/http resends an Idempotency-Key request
	// whose reused connection breaks, and the resend would be a repeat.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := fresh.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a dropped answer came: %d", resp.StatusCode)
	}
	if status, _, v := get(t, srv.URL+"/effects/k-2"); status != http.StatusOK || v["key"] != "k-2" {
		t.Fatalf("the dropped call's effect: %d %v", status, v)
	}
	if c := countsOf(t, srv.URL); c["effects"] != 2.0 || c["dropped_answers"] != 1.0 || c["injected_failures"] != 1.0 {
		t.Fatalf("counts %v", c)
	}
	for _, bad := range []string{"fail=200", "drop=maybe", "fail_rate=2", "drop_rate=x", "fail_status=600"} {
		if status, _ := send(t, http.MethodPut, srv.URL+"/faults?"+bad); status != http.StatusBadRequest {
			t.Errorf("PUT /faults?%s: %d, want 400", bad, status)
		}
	}
	if _, v := send(t, http.MethodGet, srv.URL+"/faults"); v["drop_rate"] != 1.0 {
		t.Errorf("a refused PUT changed the faults: %v", v)
	}
}
