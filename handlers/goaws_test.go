package handlers_test

import (
	"encoding/xml"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	goaws "github.com/Admiral-Piett/goaws/app"
	goawsrouter "github.com/Admiral-Piett/goaws/app/router"
	"github.com/sirupsen/logrus"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/handlers"
)

// startGoaws runs goaws, a third-party SNS implementation, in this process on
// a free loopback port. goaws keeps its topics and its identity in package
// variables, so only one test (this file's) may use it.
func startGoaws(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	// goaws writes these into the ARNs and the SigningCertURL/SubscribeURL
	// of the messages it sends.
	goaws.CurrentEnvironment.Host = "127.0.0.1"
	goaws.CurrentEnvironment.Port = port
	goaws.CurrentEnvironment.Region = "us-east-1"
	goaws.CurrentEnvironment.AccountID = "123456789012"
	logrus.SetLevel(logrus.WarnLevel)
	logrus.SetOutput(io.Discard)
	srv := httptest.NewUnstartedServer(goawsrouter.New())
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// snsAction calls goaws's SNS query API.
func snsAction(t *testing.T, base string, form url.Values) string {
	t.Helper()
	resp, err := http.PostForm(base+"/", form)
	if err != nil {
		t.Fatalf("%s: %v", form.Get("Action"), err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: HTTP %d: %s", form.Get("Action"), resp.StatusCode, body)
	}
	return string(body)
}

// End to end with goaws: an HTTP subscription to the gateway is confirmed,
// and a published message reaches the downstream and is acked. goaws signs
// with its own certificate, served from its own http://127.0.0.1 URL, which
// the gateway trusts only because this test configures the emulator prefix;
// a gateway without that setting refuses the same subscription.
func TestGoawsSubscribePublishEndToEnd(t *testing.T) {
	sns := startGoaws(t)
	e := newEnvWith(t, false, snsRouteYAML("orders", "sns_signature", "")+snsRouteYAML("strict", "sns_signature", ""),
		map[string]string{"GATEWAY_SNS_TRUSTED_URL_PREFIXES": sns + "/"})
	// A second gateway on the same ledger with the default allow-list only.
	strictSNS, err := brokerauth.NewSNSVerifier(brokerauth.SNSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o := e.gw.IngestOptions
	o.Auth = handlers.BrokerAuth{SNS: strictSNS, Subscriptions: e.gw.Subscriptions}
	strict := httptest.NewServer(handlers.NewIngest(o))
	t.Cleanup(strict.Close)

	arn := struct {
		TopicArn string `xml:"CreateTopicResult>TopicArn"`
	}{}
	if err := xml.Unmarshal([]byte(snsAction(t, sns, url.Values{"Action": {"CreateTopic"}, "Name": {"orders"}})), &arn); err != nil || arn.TopicArn != ordersTopic {
		t.Fatalf("CreateTopic: %q, %v", arn.TopicArn, err)
	}
	subscribe := func(endpoint string) {
		snsAction(t, sns, url.Values{
			"Action": {"Subscribe"}, "TopicArn": {ordersTopic}, "Protocol": {"http"}, "Endpoint": {endpoint},
		})
	}

	// goaws delivers the SubscriptionConfirmation before Subscribe returns.
	subscribe(strict.URL + "/v1/push/sns/strict")
	if ev := e.subscriptionEvents("strict"); len(ev) != 0 {
		t.Fatalf("the gateway without the emulator setting acted on goaws's confirmation: %+v", ev)
	}
	subscribe(e.ingest.URL + "/v1/push/sns/orders")
	var confirmed []adminapi.SubscriptionEvent
	waitFor(t, func() bool { confirmed = e.subscriptionEvents("orders"); return len(confirmed) == 1 })
	if c := confirmed[0]; c.Outcome != adminapi.SubscriptionConfirmed || c.TopicArn != ordersTopic ||
		c.MessageType != "SubscriptionConfirmation" || !strings.HasPrefix(c.SubscriptionArn, ordersTopic+":") {
		t.Fatalf("subscription event = %+v", c)
	}

	// goaws delivers to every subscription before Publish returns.
	snsAction(t, sns, url.Values{
		"Action": {"Publish"}, "TopicArn": {ordersTopic}, "Message": {`{"order":42}`},
		"MessageAttributes.entry.1.Name":              {"traceparent"},
		"MessageAttributes.entry.1.Value.DataType":    {"String"},
		"MessageAttributes.entry.1.Value.StringValue": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	})
	waitFor(t, func() bool { return e.down.effectCalls.Load() == 1 })
	var opID string
	waitFor(t, func() bool {
		var n int
		err := e.pool.QueryRow(t.Context(), `SELECT count(*), coalesce(max(id), '') FROM operations WHERE broker = 'sns' AND d1_decision = 'ack'`).Scan(&n, &opID)
		return err == nil && n == 1
	})
	rec := e.waitState(opID, gate.StateAcknowledged)
	if rec.Operation.Route != "orders" || rec.Deliveries[0].Source != ordersTopic {
		t.Fatalf("record = %+v", rec.Operation)
	}
	// The traceparent message attribute made the delivery part of the
	// publisher's trace.
	if rec.Operation.TraceID != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("operation trace id %q, want the publisher's", rec.Operation.TraceID)
	}
	// The strict gateway refused the publish too (goaws sent it there as
	// well): nothing of it was recorded or executed.
	var strictOps int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM operations WHERE route = 'strict'`).Scan(&strictOps); err != nil || strictOps != 0 {
		t.Fatalf("operations on the strict route: %d, %v", strictOps, err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
