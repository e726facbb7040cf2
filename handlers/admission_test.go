package handlers_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
)

// A delivery past GATEWAY_MAX_IN_FLIGHT is nacked (503 with Retry-After)
// before anything is read or recorded, and the same message is taken once a
// slot is free again.
func TestAdmissionBoundNacksPastTheLimit(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, true, routeYAML("orders", "idempotent", "broker", ""),
		map[string]string{"GATEWAY_MAX_IN_FLIGHT": "1", "GATEWAY_ADMISSION_WAIT": "0s"})
	release := make(chan struct{})
	e.down.set(func(w http.ResponseWriter, r *http.Request, apply func() string) {
		<-release
		answer(w, apply())
	})

	first := msg{ID: "admit-1", Data: "a"}
	firstDone := make(chan reply, 1)
	go func() {
		body := envelope(first)
		resp, err := http.Post(e.ingest.URL+"/v1/push/pubsub/orders", "application/json", bytes.NewReader(body))
		if err != nil {
			firstDone <- reply{Status: -1, Raw: err.Error()}
			return
		}
		resp.Body.Close()
		firstDone <- reply{Status: resp.StatusCode}
	}()
	// The first delivery holds the only slot while its effect call waits.
	testenv.Eventually(t, 10*time.Second, func() bool { return e.down.effectCalls.Load() == 1 },
		func() string { return "the first delivery never reached the downstream" })

	second := msg{ID: "admit-2", Data: "b"}
	resp, err := http.Post(e.ingest.URL+"/v1/push/pubsub/orders", "application/json", bytes.NewReader(envelope(second)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("past the limit: status %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if _, err := e.ledger.Get(context.Background(), e.opID("orders", second)); err == nil {
		t.Fatal("a delivery refused at admission left an operation behind")
	}

	close(release)
	if r := <-firstDone; r.Status != http.StatusNoContent {
		t.Fatalf("first delivery: %d %s, want 204", r.Status, r.Raw)
	}
	// The slot is free once the first delivery's handler has returned.
	testenv.Eventually(t, 10*time.Second, func() bool {
		return e.push("orders", second).Status == http.StatusNoContent
	}, func() string { return "the refused message was never taken after the slot freed" })
	e.waitState(e.opID("orders", second), gate.StateAcknowledged)
	if n := e.down.Applied(); n != 2 {
		t.Fatalf("effects applied = %d, want 2 (one per message)", n)
	}
}
