package handlers_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/authtest"
	"github.com/ackgate/ackgate/internal/testenv"
)

// holdFirst makes the downstream keep every effect call until release is
// closed, and pushes body to path in the background; it returns once that
// delivery is inside its effect call, holding its admission.
func holdFirst(t *testing.T, e *env, path string, body []byte, header http.Header) (release func(), done <-chan int) {
	t.Helper()
	gateCh := make(chan struct{})
	e.down.set(func(w http.ResponseWriter, r *http.Request, apply func() string) {
		<-gateCh
		answer(w, apply())
	})
	out := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, e.ingest.URL+path, bytes.NewReader(body))
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- -1
			return
		}
		resp.Body.Close()
		out <- resp.StatusCode
	}()
	testenv.Eventually(t, 10*time.Second, func() bool { return e.down.effectCalls.Load() == 1 },
		func() string { return "the first delivery never reached the downstream" })
	var once bool
	return func() {
		if !once {
			once = true
			close(gateCh)
		}
	}, out
}

// Past GATEWAY_MAX_IN_FLIGHT every delivery is refused before anything is
// read or recorded: Pub/Sub with 429 and SNS with 503 (SNS would drop a
// 429), both with Retry-After. Once the slot is free the same messages are
// taken. Each answer is counted.
func TestAdmissionBoundNacksPastTheLimit(t *testing.T) {
	t.Parallel()
	routes := routeYAML("orders", "idempotent", "broker", "") + snsRouteYAML("notes", "none", "")
	e := newEnvWith(t, true, routes, map[string]string{"GATEWAY_MAX_IN_FLIGHT": "1", "GATEWAY_ADMISSION_WAIT": "0s"})
	release, firstDone := holdFirst(t, e, "/v1/push/pubsub/orders", envelope(msg{ID: "admit-0", Data: "a"}),
		http.Header{"Content-Type": {"application/json"}})
	t.Cleanup(release)

	const refused = 5
	counts := map[int]int{}
	sns := authtest.NewSNS(t)
	for i := range refused {
		id := "admit-" + string(rune('1'+i))
		r, h := e.post("/v1/push/pubsub/orders", envelope(msg{ID: id, Data: "b"}), map[string]string{"Content-Type": "application/json"})
		if r.Body.Decision != gate.Nack || h.Get("Retry-After") == "" {
			t.Errorf("pubsub %s: decision %q, Retry-After %q; want a nack with Retry-After", id, r.Body.Decision, h.Get("Retry-After"))
		}
		counts[r.Status]++
		m := sns.Notification(ordersTopic, "sns-"+id, "c")
		sr, h := e.postSNS("notes", m, authtest.Body(m), nil)
		if sr.Body.Decision != gate.Nack || h.Get("Retry-After") == "" {
			t.Errorf("sns %s: decision %q, Retry-After %q; want a nack with Retry-After", id, sr.Body.Decision, h.Get("Retry-After"))
		}
		counts[1000+sr.Status]++
	}
	if counts[http.StatusTooManyRequests] != refused || counts[1000+http.StatusServiceUnavailable] != refused || len(counts) != 2 {
		t.Fatalf("answers past the limit: %v; want %d Pub/Sub 429 and %d SNS 503 (keys of SNS answers are 1000+status)", counts, refused, refused)
	}
	var ops int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM operations`).Scan(&ops); err != nil {
		t.Fatal(err)
	}
	if ops != 1 {
		t.Fatalf("%d operations after the refusals, want the held delivery's only", ops)
	}
	if got := e.down.effectCalls.Load(); got != 1 {
		t.Fatalf("%d downstream calls, want 1", got)
	}

	release()
	if code := <-firstDone; code != http.StatusNoContent {
		t.Fatalf("held delivery: %d, want 204", code)
	}
	e.down.set(nil)
	// The slot is free once the held delivery's handler has returned.
	testenv.Eventually(t, 10*time.Second, func() bool {
		return e.push("orders", msg{ID: "admit-1", Data: "b"}).Status == http.StatusNoContent
	}, func() string { return "a refused message was never taken after the slot freed" })
	m := sns.Notification(ordersTopic, "sns-admit-1", "c")
	if r, _ := e.postSNS("notes", m, authtest.Body(m), nil); r.Status != http.StatusNoContent {
		t.Fatalf("sns after the slot freed: %d %s", r.Status, r.Raw)
	}
	if n := e.down.Applied(); n != 3 {
		t.Fatalf("effects applied = %d, want 3 (one per message taken)", n)
	}
}

// GATEWAY_MAX_BODY_BYTES_IN_FLIGHT bounds the bytes of bodies held: while a
// large body is held, another large one is refused (and nothing of it
// recorded), and a small one that fits beside it is taken.
func TestAdmissionBoundsBodyBytes(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, true, routeYAML("orders", "idempotent", "broker", ""), map[string]string{
		"GATEWAY_MAX_BODY_BYTES": "4096", "GATEWAY_MAX_BODY_BYTES_IN_FLIGHT": "6KiB", "GATEWAY_ADMISSION_WAIT": "0s",
	})
	big := strings.Repeat("x", 2500) // about 3.4 KB once base64 in its envelope
	release, firstDone := holdFirst(t, e, "/v1/push/pubsub/orders", envelope(msg{ID: "big-0", Data: big}),
		http.Header{"Content-Type": {"application/json"}})
	t.Cleanup(release)

	counts := map[int]int{}
	for _, id := range []string{"big-1", "big-2", "big-3"} {
		counts[e.push("orders", msg{ID: id, Data: big}).Status]++
	}
	// A small body fits beside the held one; it is held at the downstream
	// too, so it is pushed in the background and counted when it is in.
	small := make(chan int, 1)
	go func() {
		resp, err := http.Post(e.ingest.URL+"/v1/push/pubsub/orders", "application/json",
			bytes.NewReader(envelope(msg{ID: "small-1", Data: "s"})))
		if err != nil {
			small <- -1
			return
		}
		resp.Body.Close()
		small <- resp.StatusCode
	}()
	testenv.Eventually(t, 10*time.Second, func() bool { return e.down.effectCalls.Load() == 2 },
		func() string { return "the small delivery never reached the downstream beside the held one" })
	if counts[http.StatusTooManyRequests] != 3 || len(counts) != 1 {
		t.Fatalf("large bodies past the byte bound: %v, want three 429", counts)
	}
	release()
	if a, b := <-firstDone, <-small; a != http.StatusNoContent || b != http.StatusNoContent {
		t.Fatalf("held deliveries: %d and %d, want 204", a, b)
	}
	if n := e.down.Applied(); n != 2 {
		t.Fatalf("effects applied = %d, want 2 (the held large body and the small one)", n)
	}
}
