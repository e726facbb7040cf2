package handlers_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/handlers"
	"github.com/ackgate/ackgate/internal/authtest"
)

const (
	ordersTopic = "arn:aws:sns:us-east-1:123456789012:orders"
	otherTopic  = "arn:aws:sns:us-east-1:123456789012:other"
)

// snsRouteYAML is an SNS route through the real config loader.
func snsRouteYAML(name, auth, extra string) string {
	return `
  - name: ` + name + `
    broker: sns
    auth: ` + auth + `
    sources: [` + ordersTopic + `]
    shape: unsafe
` + extra + `    effect:
      url: {{DOWN}}/effects
      result_id_header: X-Result-Id
`
}

func newSNSEnv(t *testing.T, sns *authtest.SNS) *env {
	t.Helper()
	return newEnvWith(t, false, snsRouteYAML("orders", "sns_signature", ""),
		map[string]string{"GATEWAY_SNS_TRUSTED_URL_PREFIXES": sns.Prefix()})
}

// A signed notification from a listed topic runs once and is acked; its
// redelivery is acked without a second effect. Both signature versions.
func TestSNSNotificationIsExecutedOnceAndAcked(t *testing.T) {
	t.Parallel()
	sns := authtest.NewSNS(t)
	e := newSNSEnv(t, sns)
	for i, version := range []string{"1", "2"} {
		m := sns.Sign(sns.Notification(ordersTopic, "n-"+version, `{"order":`+version+`}`), version)
		body := authtest.Body(m)
		r, _ := e.postSNS("orders", m, body, nil)
		wantStatus(t, r, http.StatusNoContent)
		id := e.opID("orders", msg{ID: m.MessageID, Data: m.Message, Sub: m.TopicArn})
		rec := e.waitState(id, gate.StateAcknowledged)
		if d := rec.Deliveries[0]; d.Broker != gate.BrokerSNS || d.Source != ordersTopic || d.MessageID != m.MessageID {
			t.Fatalf("delivery = %+v", d)
		}
		r, _ = e.postSNS("orders", m, body, nil)
		wantStatus(t, r, http.StatusNoContent)
		if n := e.down.effectCalls.Load(); n != int64(i+1) {
			t.Fatalf("downstream called %d times after %d messages and their redeliveries", n, i+1)
		}
	}
	// The certificate was fetched once for both messages.
	if n := sns.CertHits(); n != 1 {
		t.Errorf("certificate fetched %d times", n)
	}
}

// Every refusal to SNS is deliberate and final (4xx) or a nack (5xx), and
// none of them executes or records anything.
func TestSNSRefusals(t *testing.T) {
	t.Parallel()
	sns := authtest.NewSNS(t)
	outside := authtest.NewRecorder(t)
	e := newSNSEnv(t, sns)

	forged := sns.Notification(ordersTopic, "n-forged", "pay 100")
	sns.Sign(forged, "2")
	forged.Message = "pay 1000000"
	other := sns.Sign(sns.Notification(otherTopic, "n-other", "x"), "2")
	outsideCert := sns.Notification(ordersTopic, "n-outside", "x")
	outsideCert.SigningCertURL = outside.URL() + "/SimpleNotificationService-1.pem"
	sns.Sign(outsideCert, "2")
	good := sns.Sign(sns.Notification(ordersTopic, "n-good", "x"), "1")

	cases := []struct {
		name   string
		route  string
		m      *brokerauth.SNSMessage
		body   []byte
		header map[string]string
		want   int
	}{
		{"payload changed after signing", "orders", forged, authtest.Body(forged), nil, http.StatusUnauthorized},
		{"unsigned", "orders", good, []byte(strings.Replace(string(authtest.Body(good)), `"SignatureVersion":"1"`, `"SignatureVersion":""`, 1)), nil, http.StatusUnauthorized},
		{"topic not listed", "orders", other, authtest.Body(other), nil, http.StatusForbidden},
		{"certificate outside the allow-list", "orders", outsideCert, authtest.Body(outsideCert), nil, http.StatusForbidden},
		{"type header disagrees", "orders", good, authtest.Body(good), map[string]string{"X-Amz-Sns-Message-Type": "SubscriptionConfirmation"}, http.StatusBadRequest},
		{"type header missing", "orders", good, authtest.Body(good), map[string]string{"X-Amz-Sns-Message-Type": ""}, http.StatusBadRequest},
		{"id header disagrees", "orders", good, authtest.Body(good), map[string]string{"X-Amz-Sns-Message-Id": "other"}, http.StatusBadRequest},
		{"not an SNS message", "orders", good, []byte(`{"message":{}}`), nil, http.StatusBadRequest},
		{"raw delivery on a signature route", "orders", good, []byte("raw"), map[string]string{"X-Amz-Sns-Rawdelivery": "true"}, http.StatusServiceUnavailable},
		{"unknown route", "nope", good, authtest.Body(good), nil, http.StatusServiceUnavailable},
	}
	for _, c := range cases {
		r, _ := e.postSNS(c.route, c.m, c.body, c.header)
		if r.Status != c.want {
			t.Errorf("%s: status %d (%s), want %d", c.name, r.Status, r.Raw, c.want)
		}
		if r.Status >= 400 && r.Status < 500 && r.Body.Decision != gate.Reject {
			t.Errorf("%s: a 4xx that is not a deliberate rejection: %+v", c.name, r.Body)
		}
	}
	e.nothingRecorded("after refusals")
	if n := outside.Hits(); n != 0 {
		t.Fatalf("a certificate outside the allow-list was fetched (%d requests)", n)
	}
	// And the genuine message still goes through.
	r, _ := e.postSNS("orders", good, authtest.Body(good), nil)
	wantStatus(t, r, http.StatusNoContent)
}

// With the certificate host down the gateway cannot tell a genuine message
// from a forged one: 503 so SNS retries, nothing recorded; the retry after the
// host is back (and after the verifier's brief memory of the failure) is
// executed.
func TestSNSCertificateServerDownThenBack(t *testing.T) {
	t.Parallel()
	sns := authtest.NewSNS(t)
	verifierClock := &clock{}
	e := newEnv(t, false, snsRouteYAML("orders", "sns_signature", ""))
	e.useAuth(handlers.BrokerAuth{SNS: snsVerifierAt(t, verifierClock.Now, sns.Prefix())})
	m := sns.Sign(sns.Notification(ordersTopic, "n-1", `{"order":1}`), "2")
	body := authtest.Body(m)

	sns.Stop()
	r, h := e.postSNS("orders", m, body, nil)
	wantStatus(t, r, http.StatusServiceUnavailable)
	if r.Body.Decision != gate.Nack || h.Get("Retry-After") == "" {
		t.Fatalf("answer %+v, Retry-After %q", r.Body, h.Get("Retry-After"))
	}
	e.nothingRecorded("with the certificate server down")

	sns.Start()
	verifierClock.Advance(brokerauth.DefaultCertFailureTTL)
	r, _ = e.postSNS("orders", m, body, nil)
	wantStatus(t, r, http.StatusNoContent)
	e.waitState(e.opID("orders", msg{ID: m.MessageID, Data: m.Message, Sub: m.TopicArn}), gate.StateAcknowledged)
	if n := e.down.effectCalls.Load(); n != 1 {
		t.Fatalf("downstream called %d times", n)
	}
}

// A message naming a certificate URL (on an allowed host) that serves no
// certificate is answered as a bad signature: 401, which SNS does not retry.
// Its replays cost no further fetch while the answer is remembered, and
// nothing is recorded.
func TestSNSCertificateURLWithoutCertificateIsRefused(t *testing.T) {
	t.Parallel()
	sns := authtest.NewSNS(t)
	var fetches atomic.Int64
	missing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		http.NotFound(w, r)
	}))
	t.Cleanup(missing.Close)
	e := newEnv(t, false, snsRouteYAML("orders", "sns_signature", ""))
	e.useAuth(handlers.BrokerAuth{SNS: snsVerifier(t, sns.Prefix(), missing.URL+"/")})
	m := sns.Notification(ordersTopic, "n-1", `{"order":1}`)
	m.SigningCertURL = missing.URL + "/SimpleNotificationService-random.pem"
	sns.Sign(m, "2")
	for range 20 {
		r, _ := e.postSNS("orders", m, authtest.Body(m), nil)
		wantStatus(t, r, http.StatusUnauthorized)
	}
	if n := fetches.Load(); n != 1 {
		t.Fatalf("20 messages fetched the certificate URL %d times, want 1", n)
	}
	e.nothingRecorded("after messages with no certificate")
}

// Confirmations are made for listed topics only, always recorded; a
// SubscribeURL outside the allow-list is never requested; unsubscribe
// confirmations are recorded and nothing else.
func TestSNSSubscriptionMessages(t *testing.T) {
	t.Parallel()
	sns := authtest.NewSNS(t)
	outside := authtest.NewRecorder(t)
	e := newSNSEnv(t, sns)

	confirm := sns.Sign(sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, ordersTopic, "c-1"), "1")
	r, _ := e.postSNS("orders", confirm, authtest.Body(confirm), nil)
	wantStatus(t, r, http.StatusNoContent)
	if got := sns.Confirms(); len(got) != 1 || got[0] != ordersTopic {
		t.Fatalf("confirmations made: %v", got)
	}

	refused := sns.Sign(sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, otherTopic, "c-2"), "2")
	r, _ = e.postSNS("orders", refused, authtest.Body(refused), nil)
	wantStatus(t, r, http.StatusForbidden)

	elsewhere := sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, ordersTopic, "c-3")
	elsewhere.SubscribeURL = outside.URL() + "/?Action=ConfirmSubscription&TopicArn=" + ordersTopic + "&Token=t"
	sns.Sign(elsewhere, "2")
	r, _ = e.postSNS("orders", elsewhere, authtest.Body(elsewhere), nil)
	wantStatus(t, r, http.StatusForbidden)

	unsub := sns.Sign(sns.Confirmation(brokerauth.SNSUnsubscribeConfirmation, ordersTopic, "u-1"), "2")
	r, _ = e.postSNS("orders", unsub, authtest.Body(unsub), nil)
	wantStatus(t, r, http.StatusNoContent)

	// SNS is down while a confirmation arrives: nack, recorded; SNS resends
	// and it is confirmed.
	late := sns.Sign(sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, ordersTopic, "c-4"), "2")
	_, _ = e.postSNS("orders", late, authtest.Body(late), nil) // caches the certificate
	sns.Stop()
	again := sns.Sign(sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, ordersTopic, "c-5"), "2")
	r, _ = e.postSNS("orders", again, authtest.Body(again), nil)
	wantStatus(t, r, http.StatusServiceUnavailable)
	sns.Start()
	r, _ = e.postSNS("orders", again, authtest.Body(again), nil)
	wantStatus(t, r, http.StatusNoContent)

	if outside.Hits() != 0 {
		t.Fatal("a SubscribeURL outside the allow-list was requested")
	}
	if got := sns.Confirms(); len(got) != 3 {
		t.Fatalf("confirmations made: %v, want c-1, c-4 and c-5's", got)
	}
	type row struct{ typ, id, outcome string }
	var got []row
	for _, ev := range e.subscriptionEvents("orders") {
		got = append(got, row{ev.MessageType, ev.MessageID, ev.Outcome})
		if ev.Outcome == adminapi.SubscriptionConfirmed && ev.SubscriptionArn != ordersTopic+":sub-1" {
			t.Errorf("confirmed without the subscription ARN: %+v", ev)
		}
	}
	want := []row{
		{"SubscriptionConfirmation", "c-1", adminapi.SubscriptionConfirmed},
		{"SubscriptionConfirmation", "c-2", adminapi.SubscriptionRefused},
		{"SubscriptionConfirmation", "c-3", adminapi.SubscriptionRefused},
		{"UnsubscribeConfirmation", "u-1", adminapi.SubscriptionRecorded},
		{"SubscriptionConfirmation", "c-4", adminapi.SubscriptionConfirmed},
		{"SubscriptionConfirmation", "c-5", adminapi.SubscriptionConfirmFailed},
		{"SubscriptionConfirmation", "c-5", adminapi.SubscriptionConfirmed},
	}
	if len(got) != len(want) {
		t.Fatalf("recorded %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("recorded %v, want %v", got, want)
		}
	}
	e.nothingRecorded("subscription messages are not operations")
}

// Raw delivery has no signature: a route takes it only with basic
// credentials, which are checked before the body is read.
func TestSNSRawDeliveryWithBasicCredentials(t *testing.T) {
	t.Parallel()
	sns := authtest.NewSNS(t)
	e := newEnvWith(t, false, snsRouteYAML("raw", "basic", `    raw_delivery: true
    basic_auth:
      username_env: SNS_USER
      password_env: SNS_PASSWORD
`), map[string]string{"GATEWAY_SNS_TRUSTED_URL_PREFIXES": sns.Prefix(), "SNS_USER": "sns", "SNS_PASSWORD": "s3cret-pw"})
	raw := func(id, topic, auth string) (reply, http.Header) {
		h := map[string]string{
			"X-Amz-Sns-Message-Type": "Notification", "X-Amz-Sns-Message-Id": id,
			"X-Amz-Sns-Topic-Arn": topic, "X-Amz-Sns-Rawdelivery": "true",
		}
		if auth != "" {
			h["Authorization"] = auth
		}
		return e.post("/v1/push/sns/raw", []byte(`{"order":7}`), h)
	}
	r, h := raw("r-1", ordersTopic, "")
	wantStatus(t, r, http.StatusUnauthorized)
	if !strings.HasPrefix(h.Get("WWW-Authenticate"), "Basic") {
		t.Errorf("401 without a Basic challenge: %q", h.Get("WWW-Authenticate"))
	}
	r, _ = raw("r-1", ordersTopic, basic("sns", "wrong"))
	wantStatus(t, r, http.StatusUnauthorized)
	r, _ = raw("r-1", otherTopic, basic("sns", "s3cret-pw"))
	wantStatus(t, r, http.StatusForbidden)
	e.nothingRecorded("before valid credentials")

	r, _ = raw("r-1", ordersTopic, basic("sns", "s3cret-pw"))
	wantStatus(t, r, http.StatusNoContent)
	// The JSON form on the same route needs both the credentials and a
	// valid signature.
	m := sns.Sign(sns.Notification(ordersTopic, "n-1", "x"), "2")
	r, _ = e.postSNS("raw", m, authtest.Body(m), map[string]string{"Authorization": basic("sns", "s3cret-pw")})
	wantStatus(t, r, http.StatusNoContent)
	m.Message = "changed"
	r, _ = e.postSNS("raw", m, authtest.Body(m), map[string]string{"Authorization": basic("sns", "s3cret-pw")})
	wantStatus(t, r, http.StatusUnauthorized)
	if n := e.down.effectCalls.Load(); n != 2 {
		t.Fatalf("downstream called %d times, want 2", n)
	}
}

// A route whose authenticator this gateway lacks fails closed, with a nack.
func TestSNSWithoutVerifierFailsClosed(t *testing.T) {
	t.Parallel()
	sns := authtest.NewSNS(t)
	e := newEnv(t, false, snsRouteYAML("orders", "sns_signature", ""))
	e.useAuth(handlers.BrokerAuth{})
	m := sns.Sign(sns.Notification(ordersTopic, "n-1", "x"), "2")
	r, _ := e.postSNS("orders", m, authtest.Body(m), nil)
	wantStatus(t, r, http.StatusServiceUnavailable)
	e.nothingRecorded("without a verifier")
}

// A route fetches certificates only for the regions its topics are in: a
// signed message from a topic in another region is refused (403) before
// anything is fetched for it, so messages naming other regions cannot spend
// the route's fetches. A topic of the route's region that the route does
// not list is still verified, and refused as not allowed.
func TestSNSMessageFromAnotherRegionIsRefusedWithoutAFetch(t *testing.T) {
	t.Parallel()
	sns := authtest.NewSNS(t)
	e := newSNSEnv(t, sns)
	for _, topic := range []string{"arn:aws:sns:eu-west-1:123456789012:orders", "arn:aws:sns:zz-9:123456789012:orders", "not-an-arn"} {
		m := sns.Sign(sns.Notification(topic, "n-"+topic, `{"order":1}`), "2")
		r, _ := e.postSNS("orders", m, authtest.Body(m), nil)
		if r.Status != http.StatusForbidden || !strings.Contains(r.Body.Reason, "region") {
			t.Errorf("topic %s: %d %s, want 403 naming the region", topic, r.Status, r.Raw)
		}
	}
	if n := sns.CertHits(); n != 0 {
		t.Fatalf("certificate fetched %d times for other regions' messages", n)
	}
	m := sns.Sign(sns.Notification(otherTopic, "n-other", `{"order":1}`), "2")
	r, _ := e.postSNS("orders", m, authtest.Body(m), nil)
	if r.Status != http.StatusForbidden || sns.CertHits() != 1 {
		t.Fatalf("an unlisted topic of the route's region: %d %s, %d fetches", r.Status, r.Raw, sns.CertHits())
	}
	e.nothingRecorded("other regions")
}
