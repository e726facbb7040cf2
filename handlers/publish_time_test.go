package handlers_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// envelopeAt is a wrapped push of m published at publishTime (RFC 3339).
func envelopeAt(m msg, publishTime string) []byte {
	b, _ := json.Marshal(map[string]any{
		"message": map[string]any{
			"data": base64.StdEncoding.EncodeToString([]byte(m.Data)), "attributes": m.Attrs,
			"messageId": m.ID, "publishTime": publishTime,
		},
		"subscription": "projects/p/subscriptions/s",
	})
	return b
}

// A publishTime further ahead of the gateway's clock than
// GATEWAY_MAX_CLOCK_SKEW did not come from a broker that shares our sense of
// time, and it would slip past the retention-age check: it is malformed,
// answered 400 with nothing recorded, whichever form the push takes. Within
// the skew it is an ordinary delivery.
func TestFuturePublishTimeIsMalformed(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, false, routeYAML("orders", "unsafe", "broker", "")+
		routeYAML("raw", "unsafe", "broker", "    pubsub_mode: unwrapped\n"),
		map[string]string{"GATEWAY_MAX_CLOCK_SKEW": "2m"})
	ahead := e.clock.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	for _, body := range [][]byte{
		envelopeAt(msg{ID: "m-future", Data: "x"}, ahead),
		envelopeAt(msg{ID: "m-far", Data: "x"}, "9999-12-31T23:59:59Z"),
	} {
		r := e.pushRaw("orders", body)
		wantStatus(t, r, http.StatusBadRequest)
		if r.Body.Decision != gate.Reject || !strings.Contains(r.Body.Reason, "publishTime") {
			t.Errorf("answer %+v", r.Body)
		}
	}
	r, _ := e.post("/v1/push/pubsub/raw", []byte("x"), map[string]string{
		"X-Goog-Pubsub-Subscription-Name": "projects/p/subscriptions/s",
		"X-Goog-Pubsub-Message-Id":        "m-future-raw",
		"X-Goog-Pubsub-Publish-Time":      ahead,
	})
	wantStatus(t, r, http.StatusBadRequest)
	e.nothingRecorded("publish times in the future")
	if got := metricValue(t, e.scrape(), "ackgate_malformed_total", map[string]string{"route": "orders", "kind": "publish_time"}); got != 2 {
		t.Errorf("malformed publish times counted %v, want 2", got)
	}

	// A minute ahead is clock skew, within the bound: processed as usual.
	wantStatus(t, e.pushRaw("orders", envelopeAt(msg{ID: "m-skewed", Data: "x"}, e.clock.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano))), http.StatusNoContent)
}

// The delivery record keeps both times: when the broker says it published the
// message, and when the gateway received it.
func TestDeliveryRecordKeepsThePublishTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("orders", "unsafe", "broker", ""))
	published := time.Date(2026, 3, 14, 15, 9, 26, 535897000, time.UTC)
	if now := e.clock.Now(); now.Sub(published) > 7*24*time.Hour || published.After(now) {
		published = now.Add(-90 * time.Second).Truncate(time.Microsecond).UTC()
	}
	m := msg{ID: "m-times", Data: "x"}
	wantStatus(t, e.pushRaw("orders", envelopeAt(m, published.Format(time.RFC3339Nano))), http.StatusNoContent)

	var rec struct {
		Deliveries []map[string]any `json:"deliveries"`
	}
	if code := e.adminGet("/v1/operations/"+e.opID("orders", m), &rec); code != http.StatusOK || len(rec.Deliveries) != 1 {
		t.Fatalf("evidence record: %d %+v", code, rec)
	}
	d := rec.Deliveries[0]
	got, _ := time.Parse(time.RFC3339Nano, stringOf(d["publish_time"]))
	received, _ := time.Parse(time.RFC3339Nano, stringOf(d["received_at"]))
	if !got.Equal(published) || received.IsZero() || received.Before(published) {
		t.Fatalf("delivery keeps publish_time %v and received_at %v; want %v and a later receipt", d["publish_time"], d["received_at"], published)
	}
}

func stringOf(v any) string {
	s, _ := v.(string)
	return s
}
