package pushsim

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

func TestIsAckFollowsPubSub(t *testing.T) {
	t.Parallel()
	for code, want := range map[int]bool{
		102: true, 200: true, 201: true, 202: true, 204: true,
		203: false, 206: false, 301: false, 400: false, 404: false, 409: false, 429: false, 500: false, 503: false,
	} {
		if got := IsAck(code); got != want {
			t.Errorf("IsAck(%d) = %v, want %v", code, got, want)
		}
	}
}

func TestBackoffDoublesUpToTheCap(t *testing.T) {
	t.Parallel()
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := Backoff(100*time.Millisecond, time.Second, i+1); got != w*time.Millisecond {
			t.Errorf("Backoff(attempt %d) = %s, want %s", i+1, got, w*time.Millisecond)
		}
	}
}

// push is what one test endpoint saw.
type push struct {
	Message struct {
		Data        string            `json:"data"`
		MessageID   string            `json:"messageId"`
		MessageID2  string            `json:"message_id"`
		PublishTime string            `json:"publishTime"`
		Attributes  map[string]string `json:"attributes"`
	} `json:"message"`
	Subscription    string `json:"subscription"`
	DeliveryAttempt int    `json:"deliveryAttempt"`
}

// endpoint answers each push with the next status of a script (the last one
// repeats); status -1 holds the request until the client gives up.
type endpoint struct {
	srv    *httptest.Server
	mu     sync.Mutex
	script []int
	got    []push
}

func newEndpoint(t *testing.T, script ...int) *endpoint {
	e := &endpoint{script: script}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p push
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil || r.URL.Path != "/v1/push/pubsub/orders" {
			t.Errorf("push to %s: %v", r.URL.Path, err)
		}
		e.mu.Lock()
		e.got = append(e.got, p)
		status := e.script[min(len(e.got), len(e.script))-1]
		e.mu.Unlock()
		if status == -1 {
			select {
			case <-r.Context().Done():
			case <-time.After(time.Minute):
				t.Error("the client never gave up on a request past its deadline")
			}
			return
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *endpoint) pushes() []push {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]push(nil), e.got...)
}

func newSim(t *testing.T, cfg Config) *Sim {
	t.Helper()
	if cfg.AckDeadline == 0 {
		cfg.AckDeadline = 10 * time.Second
	}
	cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, 4*time.Millisecond
	if cfg.MaxDeliveryAttempts == 0 {
		cfg.MaxDeliveryAttempts = 5
	}
	cfg.Concurrency = 4
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func message() Message {
	return Message{
		Route: "orders", Subscription: "projects/p/subscriptions/orders", ID: "m-1", Data: []byte(`{"n":1}`),
		Attributes:  map[string]string{"googclient_traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		PublishTime: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

func TestNackedUntilAckedWithTheEnvelope(t *testing.T) {
	t.Parallel()
	// 203 and 404 are not acks to Pub/Sub, however successful they look.
	e := newEndpoint(t, 503, 203, 404, 204)
	s := newSim(t, Config{Endpoints: []string{e.srv.URL}})
	h := s.Publish(context.Background(), message())
	s.Wait()
	out := s.Outcome(h)
	if !out.Acked || out.AckStatus != 204 || out.Attempts != 4 || out.Deliveries != 4 || out.DeadLettered {
		t.Fatalf("outcome %+v, want acked by 204 on the fourth attempt", out)
	}
	got := e.pushes()
	for i, p := range got {
		data, _ := base64.StdEncoding.DecodeString(p.Message.Data)
		if p.DeliveryAttempt != i+1 || p.Message.MessageID != "m-1" || p.Message.MessageID2 != "m-1" ||
			string(data) != `{"n":1}` || p.Subscription != "projects/p/subscriptions/orders" ||
			p.Message.PublishTime != "2025-01-02T03:04:05Z" || p.Message.Attributes["googclient_traceparent"] == "" {
			t.Errorf("push %d: %+v", i+1, p)
		}
	}
	st := s.Stats()
	if st.Deliveries != 4 || st.Statuses[503] != 1 || st.Statuses[203] != 1 || st.Statuses[404] != 1 || st.Statuses[204] != 1 || st.Acked != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestAckDeadlineIsTheRequestTimeout(t *testing.T) {
	t.Parallel()
	e := newEndpoint(t, -1, 200)
	s := newSim(t, Config{Endpoints: []string{e.srv.URL}, AckDeadline: 200 * time.Millisecond})
	h := s.Publish(context.Background(), message())
	s.Wait()
	if out := s.Outcome(h); !out.Acked || out.Attempts != 2 {
		t.Fatalf("outcome %+v, want a nack by timeout, then the ack", out)
	}
	if st := s.Stats(); st.Timeouts != 1 || st.Statuses[200] != 1 {
		t.Fatalf("stats %+v, want one timeout and one 200", st)
	}
}

func TestDeadLetterPolicyEndsTheDeliveries(t *testing.T) {
	t.Parallel()
	e := newEndpoint(t, 500)
	s := newSim(t, Config{Endpoints: []string{e.srv.URL}, MaxDeliveryAttempts: 3})
	h := s.Publish(context.Background(), message())
	s.Wait()
	if out := s.Outcome(h); out.Acked || !out.DeadLettered || out.Attempts != 3 || len(e.pushes()) != 3 {
		t.Fatalf("outcome %+v after %d pushes, want dead-lettered after 3", out, len(e.pushes()))
	}
}

func TestBrokenConnectionIsANack(t *testing.T) {
	t.Parallel()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	s := newSim(t, Config{Endpoints: []string{deadURL}, MaxDeliveryAttempts: 2})
	h := s.Publish(context.Background(), message())
	s.Wait()
	if out := s.Outcome(h); out.Acked || !out.DeadLettered {
		t.Fatalf("outcome %+v", out)
	}
	if st := s.Stats(); st.ConnectionErrors != 2 {
		t.Fatalf("stats %+v, want two connection errors", st)
	}
}

func TestDuplicateCopiesAndRedeliveryAfterAck(t *testing.T) {
	t.Parallel()
	a, b := newEndpoint(t, 204), newEndpoint(t, 204)
	s := newSim(t, Config{Endpoints: []string{a.srv.URL, b.srv.URL}, DuplicateRate: 1, RedeliverAfterAckRate: 1})
	h := s.Publish(context.Background(), message())
	s.Wait()
	out := s.Outcome(h)
	if !out.Acked || out.Deliveries != 3 || len(out.AfterAck) != 1 || out.AfterAck[0] != 204 {
		t.Fatalf("outcome %+v, want two copies acked and one delivery after the ack", out)
	}
	if na, nb := len(a.pushes()), len(b.pushes()); na+nb != 3 || na == 0 || nb == 0 {
		t.Fatalf("endpoints saw %d and %d pushes; the copies must go to both", na, nb)
	}
	if st := s.Stats(); st.Duplicates != 1 || st.RedeliveriesAfter != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCancelledRunAbandonsMessages(t *testing.T) {
	t.Parallel()
	e := newEndpoint(t, 503)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := newSim(t, Config{Endpoints: []string{e.srv.URL}})
	h := s.Publish(ctx, message())
	s.Wait()
	if out := s.Outcome(h); !out.Abandoned || out.Acked || out.DeadLettered {
		t.Fatalf("outcome %+v, want abandoned", out)
	}
}

// Settled and Unsettled answer while deliveries go on: a message nacked
// until its endpoint lets it through is unsettled until then.
func TestSettledWhileDelivering(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
			w.WriteHeader(http.StatusNoContent)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	s := newSim(t, Config{Endpoints: []string{srv.URL}, MaxDeliveryAttempts: 1000})
	h := s.Publish(context.Background(), message())
	if _, done := s.Settled(h); done || s.Unsettled() != 1 {
		t.Fatalf("settled before any ack: %v, %d unsettled", done, s.Unsettled())
	}
	close(release)
	s.Wait()
	if out, done := s.Settled(h); !done || !out.Acked || s.Unsettled() != 0 {
		t.Fatalf("after the ack: %+v, settled %v, %d unsettled", out, done, s.Unsettled())
	}
}
