package handlers_test

import (
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Refused admin requests are counted by reason and endpoint, and logged
// without the credential they presented and at a bounded rate, so that a
// token-guessing run shows up on a dashboard without flooding the logs.
func TestAdminAuthFailuresAreLoggedAndCounted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("orders", "repeatable", "broker", ""))
	const guess = "guessed-token-0123456789abcdef"
	get := func(path, authorization string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, e.admin.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if authorization != "" {
			req.Header.Set("Authorization", authorization)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+guess))
	// Requests without a bearer token guess nothing: 401 each, never
	// limited.
	for _, c := range []struct {
		path, authorization string
		n                   int
	}{
		{"/v1/routes", "", 5},
		{"/metrics", basic, 5},
	} {
		for range c.n {
			if code, _ := get(c.path, c.authorization); code != http.StatusUnauthorized {
				t.Fatalf("GET %s: %d, want 401", c.path, code)
			}
		}
	}
	// Wrong bearer tokens: the first ten (the address's burst) are checked
	// and refused, the rest are refused unchecked with 429 and
	// Retry-After, and so is the right token from the same address.
	statuses := map[int]int{}
	for range 40 {
		code, _ := get("/v1/operations", "Bearer "+guess)
		statuses[code]++
	}
	if statuses[http.StatusUnauthorized] != 10 || statuses[http.StatusTooManyRequests] != 30 {
		t.Fatalf("40 wrong tokens answered %v, want 10 401 and 30 429", statuses)
	}
	if code, body := get("/v1/operations", "Bearer "+adminToken); code != http.StatusTooManyRequests || !strings.Contains(body, "nothing was checked") {
		t.Fatalf("the right token from a limited address: %d %s", code, body)
	}

	text := e.metricsText()
	for _, want := range []struct {
		labels map[string]string
		n      float64
	}{
		{map[string]string{"reason": "wrong_token", "endpoint": "api"}, 10},
		{map[string]string{"reason": "rate_limited", "endpoint": "api"}, 31},
		{map[string]string{"reason": "missing", "endpoint": "api"}, 5},
		{map[string]string{"reason": "not_bearer", "endpoint": "metrics"}, 5},
	} {
		if got := metricValue(t, text, "ackgate_admin_auth_failures_total", want.labels); got != want.n {
			t.Errorf("ackgate_admin_auth_failures_total%v = %v, want %v", want.labels, got, want.n)
		}
	}

	logs := e.logs.String()
	lines := strings.Count(logs, `"msg":"admin request refused"`)
	if lines == 0 || lines >= 51 {
		t.Errorf("%d log lines for 51 refused admin requests; want at least one and far fewer than one each", lines)
	}
	for _, secret := range []string{guess, base64.StdEncoding.EncodeToString([]byte("admin:" + guess))} {
		if strings.Contains(logs, secret) {
			t.Fatal("a presented credential reached the logs")
		}
	}
}

// metricsText is a scrape of the gateway's metrics taken from the handler
// itself, for tests that have spent the credential limit of their address.
func (e *env) metricsText() string {
	e.t.Helper()
	rec := httptest.NewRecorder()
	e.tel.MetricsHandler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}
