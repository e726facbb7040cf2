package handlers_test

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ackgate/ackgate/gate"
)

// adminRaw sends an admin GET with the path exactly as written (escapes and
// all) and returns the status and the problem's reason.
func (e *env) adminRaw(path string) (int, string) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.admin.URL+path, nil)
	if err != nil {
		e.t.Fatalf("admin %s: %v", path, err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("admin %s: %v", path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var p struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(raw, &p)
	return resp.StatusCode, p.Error
}

// Query parameters that Postgres text cannot hold (a NUL byte, invalid
// UTF-8), in any filter or inside a cursor, are the client's mistake: 400
// with a bounded reason, never 503 "evidence store unavailable" as if the
// ledger were down.
func TestAdminFiltersPostgresCannotHoldAreBadRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("orders", "unsafe", "broker", ""))
	wantStatus(t, e.push("orders", msg{ID: "m-1", Data: "x"}), http.StatusNoContent)
	cursor := func(raw string) string { return base64.RawURLEncoding.EncodeToString([]byte(raw)) }
	for _, path := range []string{
		"/v1/operations?key=%00",
		"/v1/operations?key=a%00b",
		"/v1/operations?message_id=%ff",
		"/v1/operations?message_id=m%00",
		"/v1/operations?route=%00",
		"/v1/operations?route=%c3%28",
		"/v1/operations?state=%00",
		"/v1/operations?state=%ff",
		"/v1/operations?cursor=" + cursor("1700000000000000:op_\x00"),
		"/v1/operations?cursor=" + cursor("1700000000000000:op_\xff"),
		"/v1/operations/op_%00",
		"/v1/operations/" + cursor("x") + "%00",
	} {
		status, reason := e.adminRaw(path)
		if status != http.StatusBadRequest || reason == "" || len(reason) > 200 || !utf8.ValidString(reason) || strings.ContainsRune(reason, 0) {
			t.Errorf("%s: %d %q, want 400 with a short reason", path, status, reason)
		}
	}
	// Storable, if odd, values are no error: the extremes of a cursor's
	// time, an id that is its own escape.
	for _, path := range []string{
		"/v1/operations?cursor=" + cursor("-9223372036854775808:op_x"),
		"/v1/operations?cursor=" + cursor("9223372036854775807:op_x"),
		"/v1/operations/op_%ff",
	} {
		if status, reason := e.adminRaw(path); status >= 500 {
			t.Errorf("%s: %d %q", path, status, reason)
		}
	}
	// The same filters, well-formed, still answer.
	if status, reason := e.adminRaw("/v1/operations?key=m-1&route=orders&state=acknowledged"); status != http.StatusOK {
		t.Errorf("a valid filter: %d %q", status, reason)
	}
}

// A deliveryAttempt larger than the ledger's integer column can hold is a
// malformed envelope, answered 400 before anything is recorded, not a write
// that fails on every redelivery.
func TestDeliveryAttemptTheLedgerCannotHoldIsMalformed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("orders", "unsafe", "broker", ""))
	for _, n := range []string{"2147483648", "9223372036854775807"} {
		body := `{"message":{"data":"eA==","messageId":"m-big"},"subscription":"projects/p/subscriptions/s","deliveryAttempt":` + n + `}`
		r := e.pushRaw("orders", []byte(body))
		wantStatus(t, r, http.StatusBadRequest)
		if r.Body.Decision != gate.Reject || !strings.Contains(r.Body.Reason, "deliveryAttempt") {
			t.Errorf("deliveryAttempt %s: answer %+v", n, r.Body)
		}
	}
	e.nothingRecorded("deliveryAttempt out of range")
	// The largest one the ledger holds is an ordinary delivery.
	wantStatus(t, e.pushRaw("orders", []byte(`{"message":{"data":"eA==","messageId":"m-max"},"subscription":"projects/p/subscriptions/s","deliveryAttempt":2147483647}`)), http.StatusNoContent)
}

// scrape reads the admin listener's Prometheus exposition.
func (e *env) scrape() string {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.admin.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("/metrics: %d %s", resp.StatusCode, b)
	}
	return string(b)
}

// A message whose identity fields Postgres text cannot hold is a bad
// message: 400 with a bounded reason, nothing recorded, and counted as
// malformed, apart from envelopes that are not Pub/Sub's at all.
func TestUnstorableIdentityIsCountedAsMalformed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("orders", "unsafe", "broker", "")+
		routeYAML("keyed", "unsafe", "broker", "    operation_key:\n      kind: attribute\n      name: order_id\n"))
	for _, c := range []struct{ route, body string }{
		{"orders", `{"message":{"data":"eA==","messageId":"1\u0000"},"subscription":"projects/p/subscriptions/s"}`},
		{"orders", `{"message":{"data":"eA==","messageId":"1"},"subscription":"projects/p/subscriptions/s\u0000"}`},
		{"keyed", `{"message":{"data":"eA==","messageId":"1","attributes":{"order_id":"7\u0000"}},"subscription":"projects/p/subscriptions/s"}`},
	} {
		r := e.pushRaw(c.route, []byte(c.body))
		wantStatus(t, r, http.StatusBadRequest)
		if r.Body.Decision != gate.Reject || !strings.Contains(r.Body.Reason, "NUL") {
			t.Errorf("%s: answer %+v", c.body, r.Body)
		}
	}
	wantStatus(t, e.pushRaw("orders", []byte(`{"message":`)), http.StatusBadRequest)
	e.nothingRecorded("unstorable identities")

	text := e.scrape()
	for _, c := range []struct {
		route, kind string
		want        float64
	}{{"orders", "identity", 2}, {"keyed", "identity", 1}, {"orders", "envelope", 1}} {
		if got := metricValue(t, text, "ackgate_malformed_total", map[string]string{"broker": "pubsub", "route": c.route, "kind": c.kind}); got != c.want {
			t.Errorf("ackgate_malformed_total{route=%q,kind=%q} = %v, want %v", c.route, c.kind, got, c.want)
		}
	}
}
