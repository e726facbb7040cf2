package handlers_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/handlers"
)

// useAuth replaces the env's ingest server with one that authenticates with
// auth, around the same gate and with the same options otherwise. It is for
// authenticators production never builds (none at all, say); settings and
// secrets go through newEnvWith. Subscriptions defaults to the env's own
// Postgres log.
func (e *env) useAuth(auth handlers.BrokerAuth) {
	e.t.Helper()
	if auth.Subscriptions == nil {
		auth.Subscriptions = e.gw.Subscriptions
	}
	o := e.gw.IngestOptions
	o.Auth = auth
	e.ingest.Close()
	e.ingest = httptest.NewServer(handlers.NewIngest(o))
	e.t.Cleanup(e.ingest.Close)
}

// snsVerifier trusts prefixes (the local SNS stand-in's) besides real SNS.
func snsVerifier(t *testing.T, prefixes ...string) *brokerauth.SNSVerifier {
	t.Helper()
	return snsVerifierAt(t, time.Now, prefixes...)
}

// snsVerifierAt is snsVerifier on the clock now, for tests that outwait the
// verifier's memory of a failed certificate fetch.
func snsVerifierAt(t *testing.T, now func() time.Time, prefixes ...string) *brokerauth.SNSVerifier {
	t.Helper()
	v, err := brokerauth.NewSNSVerifier(brokerauth.SNSOptions{TrustedURLPrefixes: prefixes, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// post sends body to path with headers and decodes the answer.
func (e *env) post(path string, body []byte, headers map[string]string) (reply, http.Header) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.ingest.URL+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("post: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{Status: resp.StatusCode, Raw: string(raw)}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.Body); err != nil {
			e.t.Fatalf("answer is not JSON: %q", raw)
		}
	}
	return r, resp.Header
}

// postSNS delivers an SNS message the way SNS does.
func (e *env) postSNS(route string, m *brokerauth.SNSMessage, body []byte, extra map[string]string) (reply, http.Header) {
	e.t.Helper()
	h := map[string]string{
		"Content-Type": "text/plain; charset=UTF-8", "X-Amz-Sns-Message-Type": m.Type,
		"X-Amz-Sns-Message-Id": m.MessageID, "X-Amz-Sns-Topic-Arn": m.TopicArn,
	}
	for k, v := range extra {
		h[k] = v
	}
	return e.post("/v1/push/sns/"+route, body, h)
}

// nothingRecorded fails unless the ledger has no operation and no delivery
// and the downstream was never called.
func (e *env) nothingRecorded(what string) {
	e.t.Helper()
	var ops, deliveries int
	if err := e.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM operations), (SELECT count(*) FROM deliveries)`).Scan(&ops, &deliveries); err != nil {
		e.t.Fatal(err)
	}
	if ops != 0 || deliveries != 0 || e.down.effectCalls.Load() != 0 {
		e.t.Fatalf("%s: %d operations, %d deliveries, %d downstream calls; want nothing", what, ops, deliveries, e.down.effectCalls.Load())
	}
}

// subscriptionEvents lists the route's recorded SNS subscription messages.
func (e *env) subscriptionEvents(route string) []adminapi.SubscriptionEvent {
	e.t.Helper()
	ev, err := e.gw.Subscriptions.List(context.Background(), route)
	if err != nil {
		e.t.Fatal(err)
	}
	return ev
}

func basic(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}
