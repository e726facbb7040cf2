package downstream_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/ackgate/ackgate/downstream"
	"github.com/ackgate/ackgate/gate"
)

// dropServer is a raw HTTP/1.1 server that answers the first request on each
// connection normally and, on every later request of a kept-alive connection,
// reads the request, counts it as applied, and hangs up without a word. That
// is the moment net/http's Transport resends a replayable request on a new
// connection. It is written on net.Listener because httptest's server gives no
// control over when, on which connection, a response is withheld.
type dropServer struct {
	ln  net.Listener
	url string

	mu      sync.Mutex
	applied map[string]int // idempotency key -> times applied
	conns   int
	open    map[net.Conn]struct{}
	wg      sync.WaitGroup
}

func newDropServer(t *testing.T) *dropServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dropServer{
		ln:      ln,
		url:     "http://" + ln.Addr().String() + "/effects",
		applied: map[string]int{},
		open:    map[net.Conn]struct{}{},
	}
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for c := range s.open {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *dropServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns++
		s.open[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.open, c)
				s.mu.Unlock()
				c.Close()
			}()
			s.handle(c)
		}()
	}
}

func (s *dropServer) handle(c net.Conn) {
	br := bufio.NewReader(c)
	for n := 1; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return
		}
		key := req.Header.Get(downstream.HeaderIdempotencyKey)
		s.mu.Lock()
		s.applied[key]++
		s.mu.Unlock()
		if n > 1 {
			return // applied on a reused connection, then gone without a response
		}
		body := fmt.Sprintf(`{"id":"fx-%s"}`, key)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
}

func (s *dropServer) stats(key string) (applied, conns int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied[key], s.conns
}

// TestStockClientReplaysOnReusedConnection is the control: it shows the drop
// server provokes the replay the gate must never suffer, so that the test
// below, where the replay does not happen, means something.
func TestStockClientReplaysOnReusedConnection(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		body func() io.Reader
	}{
		{"bytes body", func() io.Reader { return bytes.NewReader([]byte(`{"order":"o-1"}`)) }},
		{"no body", func() io.Reader { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newDropServer(t)
			tr := http.DefaultTransport.(*http.Transport).Clone()
			t.Cleanup(tr.CloseIdleConnections)
			client := &http.Client{Transport: tr}

			post := func(key string) (*http.Response, error) {
				req, err := http.NewRequest(http.MethodPost, srv.url, tc.body())
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Idempotency-Key", key)
				return client.Do(req)
			}
			warm, err := post("warm")
			if err != nil {
				t.Fatalf("warm-up: %v", err)
			}
			// Reading to EOF returns the connection to the pool before
			// ReadAll returns, so the next request reuses it.
			if _, err := io.ReadAll(warm.Body); err != nil {
				t.Fatal(err)
			}
			warm.Body.Close()

			resp, err := post("k-1")
			if err != nil {
				t.Fatalf("stock client did not replay (error %v); the control no longer demonstrates the trap", err)
			}
			resp.Body.Close()
			applied, conns := srv.stats("k-1")
			if applied != 2 || conns != 2 {
				t.Fatalf("stock client: applied %d times over %d connections; want 2 over 2 (a silent replay)", applied, conns)
			}
		})
	}
}

// TestExecuteNeverReplays proves the Client's requests are not resent by the
// Transport: on the same server that made the stock client apply an effect
// twice, each Execute is applied exactly once, on the one connection, and
// the lost answer is reported as unknown.
func TestExecuteNeverReplays(t *testing.T) {
	t.Parallel()
	type tcase struct {
		name   string
		method string
		data   []byte
		opts   downstream.Options
	}
	var cases []tcase
	// With tracing on, otelhttp wraps the transport and the body: the request
	// must stay non-replayable through that wrapper too.
	traced := downstream.Options{TracerProvider: sdktrace.NewTracerProvider(), Propagators: propagation.TraceContext{}}
	for _, o := range []struct {
		suffix string
		opts   downstream.Options
	}{{"", downstream.Options{}}, {", traced", traced}} {
		cases = append(cases,
			tcase{"post with body" + o.suffix, http.MethodPost, []byte(`{"order":"o-1"}`), o.opts},
			tcase{"post empty body" + o.suffix, http.MethodPost, nil, o.opts},
			tcase{"put with body" + o.suffix, http.MethodPut, []byte("opaque"), o.opts},
			tcase{"delete empty body" + o.suffix, http.MethodDelete, nil, o.opts},
		)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newDropServer(t)
			client := downstream.New(tc.opts)
			t.Cleanup(client.CloseIdleConnections)

			r := &gate.Route{Name: "orders", Effect: gate.EffectSpec{
				Method:          tc.method,
				URL:             srv.url,
				BodyMode:        gate.BodyRaw,
				ResultIDPointer: "/id",
			}}
			execute := func(key string) gate.EffectResult {
				return client.Execute(context.Background(), &gate.EffectRequest{
					Route:          r,
					Message:        &gate.Message{MessageID: "m-" + key, Data: tc.data},
					OperationID:    "op_" + key,
					IdempotencyKey: key,
					Fence:          1,
				})
			}

			warm := execute("warm")
			if warm.Outcome != gate.OutcomeConfirmed || warm.ResultID != "fx-warm" {
				t.Fatalf("warm-up: %+v", warm)
			}
			got := execute("k-1")
			if got.Outcome != gate.OutcomeUnknown {
				t.Fatalf("outcome %q (%s); want unknown after the connection dropped", got.Outcome, got.Reason)
			}
			if !strings.HasPrefix(got.Reason, "sent, no answer") {
				t.Errorf("reason %q; want it to say the request was sent", got.Reason)
			}
			applied, conns := srv.stats("k-1")
			if applied != 1 || conns != 1 {
				t.Fatalf("applied %d times over %d connections; want exactly once over the one reused connection", applied, conns)
			}
		})
	}
}
