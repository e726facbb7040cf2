package handlers_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
)

func unwrappedRoutes(mode string) string {
	return `
  - name: orders
    broker: pubsub
    auth: none
    pubsub_mode: ` + mode + `
    fingerprint:
      attributes: [event_type]
    shape: unsafe
    effect:
      url: {{DOWN}}/effects
      evidence: status_only
  - name: byorder
    broker: pubsub
    auth: none
    pubsub_mode: ` + mode + `
    operation_key: {kind: attribute, name: order_id}
    fingerprint:
      attributes: [event_type, Region]
    shape: unsafe
    effect:
      url: {{DOWN}}/effects
      evidence: status_only
`
}

// The same message pushed wrapped to one gateway and unwrapped to another is
// the same operation: identity, fingerprint and idempotency key agree, and
// the downstream sees the same key and body.
func TestWrappedAndUnwrappedAreTheSameOperation(t *testing.T) {
	t.Parallel()
	wrapped := newEnv(t, false, unwrappedRoutes("wrapped"))
	unwrapped := newEnv(t, false, unwrappedRoutes("unwrapped"))
	m := msg{ID: "m-1", Data: `{"order":42}`, Sub: "projects/p/subscriptions/orders-push",
		Attrs: map[string]string{"event_type": "created", "order_id": "42", "Region": "eu", "note": "x"}}
	published := time.Now().UTC().Format(time.RFC3339Nano)

	for _, route := range []string{"orders", "byorder"} {
		wantStatus(t, wrapped.push(route, m), http.StatusNoContent)
		r, _ := unwrapped.post("/v1/push/pubsub/"+route, []byte(m.Data), map[string]string{
			"X-Goog-Pubsub-Subscription-Name": m.Sub,
			"X-Goog-Pubsub-Message-Id":        m.ID,
			"X-Goog-Pubsub-Publish-Time":      published,
			"event_type":                      "created", // header names lose their case
			"ORDER_ID":                        "42",
			"region":                          "eu",
			"note":                            "x",
			"Content-Type":                    "application/json",
			"User-Agent":                      "APIs-Google",
			"X-Forwarded-For":                 "10.0.0.1",
		})
		wantStatus(t, r, http.StatusNoContent)

		id := wrapped.opID(route, m)
		a, b := wrapped.record(id).Operation, unwrapped.record(id).Operation
		if a.ID != b.ID || a.ScopeKey != b.ScopeKey || a.Key != b.Key || a.Fingerprint != b.Fingerprint || a.IdempotencyKey != b.IdempotencyKey {
			t.Fatalf("%s: wrapped %+v\nunwrapped %+v", route, a, b)
		}
	}
	if w, u := wrapped.down.Keys(), unwrapped.down.Keys(); len(w) != 2 || len(u) != 2 || w[0] != u[0] || w[1] != u[1] {
		t.Fatalf("downstream keys: wrapped %v, unwrapped %v", w, u)
	}

	// A different attribute the route fingerprints makes a different intent
	// in both forms alike.
	changed := m
	changed.Attrs = map[string]string{"event_type": "cancelled", "order_id": "42", "Region": "eu"}
	want := wrapped.push("orders", changed).Status
	r, _ := unwrapped.post("/v1/push/pubsub/orders", []byte(m.Data), map[string]string{
		"X-Goog-Pubsub-Subscription-Name": m.Sub, "X-Goog-Pubsub-Message-Id": m.ID,
		"Event_Type": "cancelled", "order_id": "42", "region": "eu",
	})
	if r.Status != want || r.Status != http.StatusServiceUnavailable {
		t.Fatalf("changed payload: wrapped %d, unwrapped %d (%s); want both 503 (conflict)", want, r.Status, r.Raw)
	}
	var conflicts int
	if err := unwrapped.pool.QueryRow(context.Background(), `SELECT count(*) FROM operations WHERE state = $1`, gate.StateConflicting).Scan(&conflicts); err != nil || conflicts != 1 {
		t.Fatalf("conflict records in the unwrapped gateway: %d, %v", conflicts, err)
	}
}

func TestUnwrappedWithoutMetadataIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, unwrappedRoutes("unwrapped"))
	for _, h := range []map[string]string{
		{},
		{"X-Goog-Pubsub-Subscription-Name": "projects/p/subscriptions/s"},
		{"X-Goog-Pubsub-Message-Id": "m-1"},
		{"X-Goog-Pubsub-Subscription-Name": "projects/p/subscriptions/s", "X-Goog-Pubsub-Message-Id": "m-1", "X-Goog-Pubsub-Publish-Time": "yesterday"},
	} {
		r, _ := e.post("/v1/push/pubsub/orders", []byte("data"), h)
		wantStatus(t, r, http.StatusBadRequest)
	}
	e.nothingRecorded("unwrapped pushes without metadata")
}
