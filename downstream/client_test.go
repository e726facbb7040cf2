package downstream_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackgate/ackgate/downstream"
	"github.com/ackgate/ackgate/gate"
)

var publishTime = time.Date(2026, 3, 14, 15, 9, 26, 535897000, time.UTC)

func newClient(t *testing.T) *downstream.Client {
	t.Helper()
	c := downstream.New(downstream.Options{})
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func newRoute(url string) *gate.Route {
	return &gate.Route{
		Name: "orders",
		Effect: gate.EffectSpec{
			URL:               url,
			BodyMode:          gate.BodyRaw,
			TerminalStatuses:  []int{400, 422},
			RetryableStatuses: []int{429, 503},
		},
	}
}

func newRequest(r *gate.Route) *gate.EffectRequest {
	return &gate.EffectRequest{
		Route: r,
		Message: &gate.Message{
			Broker:      gate.BrokerPubSub,
			Source:      "projects/p/subscriptions/orders",
			MessageID:   "m-1",
			Data:        []byte(`{"order": "o-1", "qty": 2}`),
			PublishTime: publishTime,
			Envelope:    []byte(`{"message":{"messageId":"m-1"},"subscription":"projects/p/subscriptions/orders"}`),
		},
		OperationID:    "op_abc",
		IdempotencyKey: "ik_abc",
		Fence:          7,
	}
}

// counter counts requests a handler saw, so a test can tell "applied" from
// "never arrived".
type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) inc() { c.mu.Lock(); c.n++; c.mu.Unlock() }
func (c *counter) get() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func serve(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// hangingServer takes the whole request and never answers. Its handlers are
// released when the client hangs up or, failing that, when the test ends, so
// that the server can close.
func hangingServer(t *testing.T, seen *counter) *httptest.Server {
	t.Helper()
	release := make(chan struct{})
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		// Reading the body to the end is what lets the server notice a
		// client that hangs up.
		io.Copy(io.Discard, r.Body)
		seen.inc()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) }) // registered after serve's, so it runs first
	return srv
}

// refusedURL returns a URL nothing listens on: the port was just released.
func refusedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

func TestExecuteClassifiesAnswers(t *testing.T) {
	t.Parallel()
	big := `{"id":"fx-big","pad":"` + strings.Repeat("x", 1<<20) + `"}`
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		spec    func(*gate.EffectSpec)
		want    gate.EffectResult
		reason  string // substring the reason must contain
	}{
		{
			name: "2xx with id in header",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Result-Id", "fx-1")
				w.WriteHeader(http.StatusCreated)
			},
			spec: func(s *gate.EffectSpec) { s.ResultIDHeader = "X-Result-Id" },
			want: gate.EffectResult{Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "fx-1"},
		},
		{
			name: "2xx with id at pointer",
			handler: func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, `{"data":{"charge":{"id":"ch_2"}}}`)
			},
			spec: func(s *gate.EffectSpec) { s.ResultIDPointer = "/data/charge/id" },
			want: gate.EffectResult{Outcome: gate.OutcomeConfirmed, StatusCode: 200, ResultID: "ch_2"},
		},
		{
			name: "2xx with numeric id keeps every digit",
			handler: func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, `{"id":12345678901234567890}`)
			},
			spec: func(s *gate.EffectSpec) { s.ResultIDPointer = "/id" },
			want: gate.EffectResult{Outcome: gate.OutcomeConfirmed, StatusCode: 200, ResultID: "12345678901234567890"},
		},
		{
			name: "2xx header missing falls back to pointer",
			handler: func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, `{"id":"fx-3"}`)
			},
			spec: func(s *gate.EffectSpec) { s.ResultIDHeader = "X-Result-Id"; s.ResultIDPointer = "/id" },
			want: gate.EffectResult{Outcome: gate.OutcomeConfirmed, StatusCode: 200, ResultID: "fx-3"},
		},
		{
			name:    "2xx when the route asks for no id",
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) },
			want:    gate.EffectResult{Outcome: gate.OutcomeConfirmed, StatusCode: 204},
		},
		{
			name:    "2xx without required header id",
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) },
			spec:    func(s *gate.EffectSpec) { s.ResultIDHeader = "X-Result-Id" },
			want:    gate.EffectResult{Outcome: gate.OutcomeUnknown, StatusCode: 201},
			reason:  "without evidence: no result id in header X-Result-Id",
		},
		{
			name: "2xx with pointer missing",
			handler: func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, `{"other":"SECRET-BODY"}`)
			},
			spec:   func(s *gate.EffectSpec) { s.ResultIDPointer = "/id" },
			want:   gate.EffectResult{Outcome: gate.OutcomeUnknown, StatusCode: 200},
			reason: "pointer does not resolve",
		},
		{
			name:    "2xx with a body that is not JSON",
			handler: func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "SECRET-BODY") },
			spec:    func(s *gate.EffectSpec) { s.ResultIDPointer = "/id" },
			want:    gate.EffectResult{Outcome: gate.OutcomeUnknown, StatusCode: 200},
			reason:  "body is not JSON",
		},
		{
			name:    "2xx with an empty string id",
			handler: func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"id":""}`) },
			spec:    func(s *gate.EffectSpec) { s.ResultIDPointer = "/id" },
			want:    gate.EffectResult{Outcome: gate.OutcomeUnknown, StatusCode: 200},
			reason:  "value is empty",
		},
		{
			name:    "2xx with a body over 1 MiB",
			handler: func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, big) },
			spec:    func(s *gate.EffectSpec) { s.ResultIDPointer = "/id" },
			want:    gate.EffectResult{Outcome: gate.OutcomeUnknown, StatusCode: 200},
			reason:  "body larger than",
		},
		{
			name: "terminal status",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "SECRET-BODY", http.StatusUnprocessableEntity)
			},
			want:   gate.EffectResult{Outcome: gate.OutcomeTerminal, StatusCode: 422},
			reason: "status 422 is terminal",
		},
		{
			name: "retryable status",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "SECRET-BODY", http.StatusServiceUnavailable)
			},
			want:   gate.EffectResult{Outcome: gate.OutcomeRetryable, StatusCode: 503},
			reason: "status 503 is retryable",
		},
		{
			name: "unlisted status",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "SECRET-BODY", http.StatusInternalServerError)
			},
			want:   gate.EffectResult{Outcome: gate.OutcomeUnknown, StatusCode: 500},
			reason: "status 500 is not listed",
		},
		{
			name: "redirect is not followed",
			handler: func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/moved" {
					panic("the client followed a redirect")
				}
				http.Redirect(w, r, "/moved", http.StatusTemporaryRedirect)
			},
			want:   gate.EffectResult{Outcome: gate.OutcomeUnknown, StatusCode: 307},
			reason: "status 307 is not listed",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := serve(t, tc.handler)
			r := newRoute(srv.URL + "/effects")
			if tc.spec != nil {
				tc.spec(&r.Effect)
			}
			got := newClient(t).Execute(context.Background(), newRequest(r))
			checkResult(t, got, tc.want, tc.reason)
		})
	}
}

func checkResult(t *testing.T, got, want gate.EffectResult, reason string) {
	t.Helper()
	if got.Outcome != want.Outcome || got.StatusCode != want.StatusCode || got.ResultID != want.ResultID {
		t.Fatalf("got %+v; want outcome %q status %d id %q", got, want.Outcome, want.StatusCode, want.ResultID)
	}
	if !strings.Contains(got.Reason, reason) {
		t.Errorf("reason %q does not contain %q", got.Reason, reason)
	}
	if want.Outcome != gate.OutcomeConfirmed && got.Reason == "" {
		t.Errorf("a %s result needs a reason", got.Outcome)
	}
	checkReasonBounded(t, got.Reason)
}

func checkReasonBounded(t *testing.T, reason string) {
	t.Helper()
	if len(reason) > 200 {
		t.Errorf("reason is %d bytes, over 200", len(reason))
	}
	for _, secret := range []string{"SECRET", "token="} {
		if strings.Contains(reason, secret) {
			t.Errorf("reason %q leaks %q", reason, secret)
		}
	}
}

// TestExecuteWithoutAnswer covers calls that end without a status: whether the
// request reached the provider decides between retryable and unknown.
func TestExecuteWithoutAnswer(t *testing.T) {
	t.Parallel()

	t.Run("route timeout after sending is unknown", func(t *testing.T) {
		t.Parallel()
		var seen counter
		srv := hangingServer(t, &seen)
		r := newRoute(srv.URL)
		// Long enough that even a busy machine connects within it: a call
		// cut before it had a connection is "not sent", another row.
		r.Effect.Timeout = time.Second
		got := newClient(t).Execute(context.Background(), newRequest(r))
		checkResult(t, got, gate.EffectResult{Outcome: gate.OutcomeUnknown}, "effect timeout (1s) reached")
		if seen.get() != 1 {
			t.Errorf("server saw %d requests; want 1", seen.get())
		}
	})

	t.Run("caller deadline sooner than route timeout is unknown", func(t *testing.T) {
		t.Parallel()
		var seen counter
		arrived := make(chan struct{})
		var once sync.Once
		srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			seen.inc()
			once.Do(func() { close(arrived) })
			<-r.Context().Done()
		})
		r := newRoute(srv.URL)
		r.Effect.Timeout = time.Hour
		// The caller's deadline passes once the provider has the whole
		// request, however long the machine took to get it there.
		got := newClient(t).Execute(expiresOn{Context: context.Background(), done: arrived}, newRequest(r))
		checkResult(t, got, gate.EffectResult{Outcome: gate.OutcomeUnknown}, "sent, no answer: caller deadline reached")
		if seen.get() != 1 {
			t.Errorf("server saw %d requests; want 1", seen.get())
		}
	})

	t.Run("connection dropped after applying is unknown", func(t *testing.T) {
		t.Parallel()
		var applied counter
		srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			applied.inc()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			conn.Close()
		})
		got := newClient(t).Execute(context.Background(), newRequest(newRoute(srv.URL)))
		checkResult(t, got, gate.EffectResult{Outcome: gate.OutcomeUnknown}, "the effect may have been applied")
		if applied.get() != 1 {
			t.Errorf("applied %d times; want exactly 1", applied.get())
		}
	})

	t.Run("refused connection is retryable", func(t *testing.T) {
		t.Parallel()
		r := newRoute(refusedURL(t) + "/effects?token=SECRET")
		got := newClient(t).Execute(context.Background(), newRequest(r))
		checkResult(t, got, gate.EffectResult{Outcome: gate.OutcomeRetryable}, "not sent: connection refused")
	})

	t.Run("unresolvable host is retryable", func(t *testing.T) {
		t.Parallel()
		r := newRoute("http://ackgate-no-such-host.invalid/effects")
		// No proxy: one from the environment would answer for the host.
		c := downstream.New(downstream.Options{Transport: &http.Transport{}})
		got := c.Execute(context.Background(), newRequest(r))
		checkResult(t, got, gate.EffectResult{Outcome: gate.OutcomeRetryable}, "not sent: ")
	})

	t.Run("canceled before sending is retryable", func(t *testing.T) {
		t.Parallel()
		var seen counter
		srv := serve(t, func(w http.ResponseWriter, r *http.Request) { seen.inc() })
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		got := newClient(t).Execute(ctx, newRequest(newRoute(srv.URL)))
		checkResult(t, got, gate.EffectResult{Outcome: gate.OutcomeRetryable}, "not sent: canceled")
		if seen.get() != 0 {
			t.Errorf("server saw %d requests; want none", seen.get())
		}
	})

	t.Run("invalid url is retryable and not quoted", func(t *testing.T) {
		t.Parallel()
		r := newRoute("http://[::1/effects?token=SECRET")
		got := newClient(t).Execute(context.Background(), newRequest(r))
		checkResult(t, got, gate.EffectResult{Outcome: gate.OutcomeRetryable}, "not sent: effect method or url is invalid")
	})

	t.Run("unknown body mode is retryable", func(t *testing.T) {
		t.Parallel()
		var seen counter
		srv := serve(t, func(w http.ResponseWriter, r *http.Request) { seen.inc() })
		r := newRoute(srv.URL)
		r.Effect.BodyMode = "xml"
		got := newClient(t).Execute(context.Background(), newRequest(r))
		checkResult(t, got, gate.EffectResult{Outcome: gate.OutcomeRetryable}, `unknown body mode "xml"`)
		if seen.get() != 0 {
			t.Errorf("server saw %d requests; want none", seen.get())
		}
	})
}

// captured is what a recording server saw of one request.
type captured struct {
	method string
	header http.Header
	body   []byte
	host   string
}

func recorder(t *testing.T) (*httptest.Server, func() captured) {
	t.Helper()
	var (
		mu   sync.Mutex
		last captured
		n    int
	)
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "read", http.StatusBadRequest)
			return
		}
		mu.Lock()
		last = captured{method: r.Method, header: r.Header.Clone(), body: b, host: r.Host}
		n++
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	return srv, func() captured {
		mu.Lock()
		defer mu.Unlock()
		if n != 1 {
			t.Fatalf("server saw %d requests; want 1", n)
		}
		return last
	}
}

func TestExecuteSendsHeaders(t *testing.T) {
	t.Parallel()
	srv, last := recorder(t)
	r := newRoute(srv.URL)
	r.Effect.Method = "put"
	r.Effect.Headers = map[string]string{
		"Authorization":   "Bearer t",
		"Idempotency-Key": "from-config", // must not win over the gate's key
		"Host":            "orders.internal",
	}
	got := newClient(t).Execute(context.Background(), newRequest(r))
	if got.Outcome != gate.OutcomeConfirmed {
		t.Fatalf("got %+v", got)
	}
	c := last()
	for name, want := range map[string]string{
		"Idempotency-Key":     "ik_abc",
		"X-Ackgate-Fence":     "7",
		"X-Ackgate-Operation": "op_abc",
		"Authorization":       "Bearer t",
		"Content-Type":        "application/octet-stream",
	} {
		if v := c.header.Values(name); len(v) != 1 || v[0] != want {
			t.Errorf("header %s = %q; want exactly %q", name, v, want)
		}
	}
	if c.method != http.MethodPut {
		t.Errorf("method %s; want PUT", c.method)
	}
	if c.host != "orders.internal" {
		t.Errorf("host %q; want the configured one", c.host)
	}
}

func TestExecuteBodyModes(t *testing.T) {
	t.Parallel()

	send := func(t *testing.T, mode gate.BodyMode, data []byte) captured {
		t.Helper()
		srv, last := recorder(t)
		r := newRoute(srv.URL)
		r.Effect.BodyMode = mode
		req := newRequest(r)
		if data != nil {
			req.Message.Data = data
		}
		if got := newClient(t).Execute(context.Background(), req); got.Outcome != gate.OutcomeConfirmed {
			t.Fatalf("got %+v", got)
		}
		return last()
	}

	t.Run("raw sends the message data", func(t *testing.T) {
		t.Parallel()
		c := send(t, gate.BodyRaw, nil)
		if string(c.body) != `{"order": "o-1", "qty": 2}` {
			t.Errorf("body %q", c.body)
		}
		if ct := c.header.Get("Content-Type"); ct != "application/octet-stream" {
			t.Errorf("content type %q", ct)
		}
	})

	t.Run("raw with empty data sends an empty body", func(t *testing.T) {
		t.Parallel()
		c := send(t, gate.BodyRaw, []byte{})
		if len(c.body) != 0 {
			t.Errorf("body %q; want empty", c.body)
		}
	})

	t.Run("envelope sends the request as received", func(t *testing.T) {
		t.Parallel()
		c := send(t, gate.BodyEnvelope, nil)
		if string(c.body) != `{"message":{"messageId":"m-1"},"subscription":"projects/p/subscriptions/orders"}` {
			t.Errorf("body %q", c.body)
		}
		if ct := c.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("content type %q", ct)
		}
	})

	t.Run("cloudevent with JSON data", func(t *testing.T) {
		t.Parallel()
		c := send(t, gate.BodyCloudEvent, nil)
		if ct := c.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/cloudevents+json") {
			t.Errorf("content type %q", ct)
		}
		ev := decodeEvent(t, c.body)
		checkEventContext(t, ev, "application/json")
		var data map[string]any
		if err := json.Unmarshal(ev["data"], &data); err != nil {
			t.Fatalf("data is not the message's JSON: %v", err)
		}
		if data["order"] != "o-1" || data["qty"] != float64(2) {
			t.Errorf("data %v", data)
		}
		if _, ok := ev["data_base64"]; ok {
			t.Error("JSON data must not also be sent as data_base64")
		}
	})

	t.Run("cloudevent with binary data", func(t *testing.T) {
		t.Parallel()
		raw := []byte{0xff, 0x00, 'a', 0x80}
		c := send(t, gate.BodyCloudEvent, raw)
		ev := decodeEvent(t, c.body)
		checkEventContext(t, ev, "application/octet-stream")
		var b64 string
		if err := json.Unmarshal(ev["data_base64"], &b64); err != nil {
			t.Fatal(err)
		}
		if got, err := base64.StdEncoding.DecodeString(b64); err != nil || string(got) != string(raw) {
			t.Errorf("data_base64 %q decodes to %q (%v)", b64, got, err)
		}
		if _, ok := ev["data"]; ok {
			t.Error("binary data must not be sent as data")
		}
	})
}

func decodeEvent(t *testing.T, body []byte) map[string]json.RawMessage {
	t.Helper()
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(body, &ev); err != nil {
		t.Fatalf("cloudevent body is not JSON: %v", err)
	}
	return ev
}

func checkEventContext(t *testing.T, ev map[string]json.RawMessage, contentType string) {
	t.Helper()
	for name, want := range map[string]string{
		"specversion":     "1.0",
		"id":              "m-1",
		"source":          "projects/p/subscriptions/orders",
		"type":            "ackgate.orders",
		"time":            "2026-03-14T15:09:26.535897Z",
		"datacontenttype": contentType,
	} {
		var got string
		if err := json.Unmarshal(ev[name], &got); err != nil || got != want {
			t.Errorf("%s = %s; want %q", name, ev[name], want)
		}
	}
}

func TestLookup(t *testing.T) {
	t.Parallel()

	lookupRoute := func(url string) *gate.Route {
		r := newRoute("http://unused.invalid")
		r.Effect.LookupURL = url
		r.Effect.ResultIDHeader = "X-Result-Id"
		return r
	}

	t.Run("found", func(t *testing.T) {
		t.Parallel()
		var (
			mu          sync.Mutex
			path, query string
			key         string
		)
		srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			path, query, key = r.URL.Path, r.URL.Query().Get("k"), r.Header.Get("Idempotency-Key")
			mu.Unlock()
			if r.Method != http.MethodGet {
				http.Error(w, "method", http.StatusMethodNotAllowed)
				return
			}
			w.Header().Set("X-Result-Id", "fx-9")
		})
		req := newRequest(lookupRoute(srv.URL + "/effects/{key}?k={key}"))
		req.IdempotencyKey = "ik a/b+c"
		got := newClient(t).Lookup(context.Background(), req)
		if got.Outcome != gate.OutcomeConfirmed || got.ResultID != "fx-9" || got.StatusCode != 200 {
			t.Fatalf("got %+v", got)
		}
		mu.Lock()
		defer mu.Unlock()
		if path != "/effects/ik a/b+c" || query != "ik a/b+c" || key != "ik a/b+c" {
			t.Errorf("server saw path %q query %q key %q; want the key in each", path, query, key)
		}
	})

	t.Run("found by pointer", func(t *testing.T) {
		t.Parallel()
		srv := serve(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"id":"fx-10"}`) })
		r := lookupRoute(srv.URL + "/effects/{key}")
		r.Effect.ResultIDHeader = ""
		r.Effect.ResultIDPointer = "/id"
		got := newClient(t).Lookup(context.Background(), newRequest(r))
		if got.Outcome != gate.OutcomeConfirmed || got.ResultID != "fx-10" {
			t.Fatalf("got %+v", got)
		}
	})

	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		want    gate.Outcome
		status  int
		reason  string
	}{
		{"absent", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }, gate.OutcomeAbsent, 404, ""},
		{"found without evidence", func(w http.ResponseWriter, r *http.Request) {}, gate.OutcomeUnknown, 200, "without evidence"},
		{"unavailable", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "SECRET-BODY", http.StatusServiceUnavailable)
		}, gate.OutcomeUnknown, 503, "lookup answered status 503"},
		{"other 2xx", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) }, gate.OutcomeUnknown, 202, "status 202"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := serve(t, tc.handler)
			got := newClient(t).Lookup(context.Background(), newRequest(lookupRoute(srv.URL+"/effects/{key}")))
			if got.Outcome != tc.want || got.StatusCode != tc.status || !strings.Contains(got.Reason, tc.reason) {
				t.Fatalf("got %+v; want %s %d with reason containing %q", got, tc.want, tc.status, tc.reason)
			}
			checkReasonBounded(t, got.Reason)
		})
	}

	t.Run("refused is unknown", func(t *testing.T) {
		t.Parallel()
		got := newClient(t).Lookup(context.Background(), newRequest(lookupRoute(refusedURL(t)+"/effects/{key}?token=SECRET")))
		if got.Outcome != gate.OutcomeUnknown || !strings.Contains(got.Reason, "connection refused") {
			t.Fatalf("got %+v", got)
		}
		checkReasonBounded(t, got.Reason)
	})

	t.Run("timeout is unknown", func(t *testing.T) {
		t.Parallel()
		srv := hangingServer(t, &counter{})
		r := lookupRoute(srv.URL + "/effects/{key}")
		r.Effect.Timeout = 50 * time.Millisecond
		got := newClient(t).Lookup(context.Background(), newRequest(r))
		if got.Outcome != gate.OutcomeUnknown || !strings.Contains(got.Reason, "effect timeout") {
			t.Fatalf("got %+v", got)
		}
	})

	t.Run("no lookup url is unknown", func(t *testing.T) {
		t.Parallel()
		got := newClient(t).Lookup(context.Background(), newRequest(lookupRoute("")))
		if got.Outcome != gate.OutcomeUnknown || got.Reason == "" {
			t.Fatalf("got %+v", got)
		}
	})
}

// TestExecuteSpeaksHTTP1OverTLS pins the protocol: the no-replay proof covers
// HTTP/1.1's retry rules only, so the client must not negotiate HTTP/2 even
// with a server that offers it.
func TestExecuteSpeaksHTTP1OverTLS(t *testing.T) {
	t.Parallel()
	var (
		mu     sync.Mutex
		protos []int
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		protos = append(protos, r.ProtoMajor)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)

	// Control, before and after: the transport the Client is built from
	// gets HTTP/2, and New leaves it so.
	control := func() {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	control()
	c := downstream.New(downstream.Options{Transport: srv.Client().Transport.(*http.Transport)})
	t.Cleanup(c.CloseIdleConnections)
	if got := c.Execute(context.Background(), newRequest(newRoute(srv.URL))); got.Outcome != gate.OutcomeConfirmed {
		t.Fatalf("got %+v", got)
	}
	srv.Client().CloseIdleConnections() // a new handshake, with the base's ALPN offer
	control()
	mu.Lock()
	defer mu.Unlock()
	if len(protos) != 3 || protos[0] != 2 || protos[1] != 1 || protos[2] != 2 {
		t.Fatalf("protocol majors %v; want [2 1 2]: HTTP/2 offered, HTTP/1.1 used, base untouched", protos)
	}
}

// An unsafe effect never rides a reused connection, where a server's idle
// close would look like a lost answer; other shapes keep the pool.
func TestUnsafeEffectsUseFreshConnections(t *testing.T) {
	t.Parallel()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Result-Id", "r")
		w.WriteHeader(http.StatusCreated)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	client := downstream.New(downstream.Options{})
	t.Cleanup(client.CloseIdleConnections)
	for _, tc := range []struct {
		shape gate.Shape
		want  int64
	}{{gate.ShapeIdempotent, 1}, {gate.ShapeUnsafe, 3}} {
		conns.Store(0)
		client.CloseIdleConnections()
		r := &gate.Route{Name: "r", Shape: tc.shape, Effect: gate.EffectSpec{URL: srv.URL, ResultIDHeader: "X-Result-Id"}}
		for i := range 3 {
			res := client.Execute(context.Background(), &gate.EffectRequest{
				Route: r, Message: &gate.Message{Data: []byte("x")}, OperationID: "op", IdempotencyKey: fmt.Sprint(i), Fence: 1,
			})
			if res.Outcome != gate.OutcomeConfirmed {
				t.Fatalf("%s call %d: %+v", tc.shape, i, res)
			}
		}
		if got := conns.Load(); got != tc.want {
			t.Errorf("%s: 3 calls used %d connections, want %d", tc.shape, got, tc.want)
		}
	}
}

// Calls that run side by side reuse their connections afterwards: rounds of
// eight concurrent calls to one downstream open about eight connections in
// all, not a new one for nearly every call (the standard library keeps two
// idle per host by default).
func TestConcurrentCallsReuseConnections(t *testing.T) {
	t.Parallel()
	var opened atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Result-Id", "r")
		w.WriteHeader(http.StatusCreated)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c := newClient(t)
	route := newRoute(srv.URL)
	route.Shape = gate.ShapeIdempotent
	route.Effect.ResultIDHeader = "X-Result-Id"
	const rounds, width = 5, 8
	for range rounds {
		var wg sync.WaitGroup
		for range width {
			wg.Go(func() {
				if res := c.Execute(context.Background(), newRequest(route)); res.Outcome != gate.OutcomeConfirmed {
					t.Errorf("outcome %s (%s), want confirmed", res.Outcome, res.Reason)
				}
			})
		}
		wg.Wait()
	}
	// Every round after the first could find its connections idle; a
	// little slack covers a connection not yet back in the pool.
	if n := opened.Load(); n > 2*width {
		t.Fatalf("%d connections opened for %d calls in rounds of %d; want at most %d", n, rounds*width, width, 2*width)
	}
}

// expiresOn is a caller's context whose deadline passes when done closes,
// so a test can place the deadline after an event instead of after a
// guessed duration.
type expiresOn struct {
	context.Context
	done <-chan struct{}
}

func (c expiresOn) Done() <-chan struct{} { return c.done }

func (c expiresOn) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// The connections' buffers are small (2 KiB); a body and a header line many
// times that size still cross whole, both ways, on a kept-alive connection.
func TestLargeBodyAndHeadersPassTheSmallBuffers(t *testing.T) {
	t.Parallel()
	body := bytes.Repeat([]byte("0123456789abcdef"), 8<<10) // 128 KiB
	padding := strings.Repeat("p", 6<<10)
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil || !bytes.Equal(b, body) {
			t.Errorf("downstream read %d bytes (%v), want the %d sent", len(b), err, len(body))
		}
		got.Add(1)
		w.Header().Set("X-Padding", padding)
		w.Header().Set("X-Result-Id", "r-large")
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	c := newClient(t)
	route := newRoute(srv.URL)
	route.Shape = gate.ShapeIdempotent
	route.Effect.ResultIDHeader = "X-Result-Id"
	for range 2 {
		req := newRequest(route)
		req.Message.Data = body
		if res := c.Execute(context.Background(), req); res.Outcome != gate.OutcomeConfirmed || res.ResultID != "r-large" {
			t.Fatalf("outcome %s, result %q (%s); want confirmed with r-large", res.Outcome, res.ResultID, res.Reason)
		}
	}
	if got.Load() != 2 {
		t.Fatalf("downstream saw %d calls, want 2", got.Load())
	}
}

// writeCounter counts the writes made on the connections it dialed.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCounter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// An effect request that fits the connection's buffer leaves in one write,
// its header and body together: a body type net/http does not know to be in
// memory has the header flushed ahead of it, a second write syscall on every
// call (and a second segment for the downstream to read).
func TestEffectRequestGoesOutInOneWrite(t *testing.T) {
	t.Parallel()
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Result-Id", "r")
		w.WriteHeader(http.StatusCreated)
	})
	var writes atomic.Int64
	var d net.Dialer
	c := downstream.New(downstream.Options{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return writeCounter{Conn: conn, writes: &writes}, nil
		},
	}})
	t.Cleanup(c.CloseIdleConnections)
	route := newRoute(srv.URL)
	route.Effect.ResultIDHeader = "X-Result-Id"
	for _, shape := range []gate.Shape{gate.ShapeIdempotent, gate.ShapeUnsafe} {
		route.Shape = shape
		writes.Store(0)
		if res := c.Execute(context.Background(), newRequest(route)); res.Outcome != gate.OutcomeConfirmed {
			t.Fatalf("%s: outcome %s (%s), want confirmed", shape, res.Outcome, res.Reason)
		}
		if n := writes.Load(); n != 1 {
			t.Errorf("%s: the request took %d writes, want 1", shape, n)
		}
	}
}
