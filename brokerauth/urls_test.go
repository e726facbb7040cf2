package brokerauth_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/internal/authtest"
)

func TestURLPolicy(t *testing.T) {
	t.Parallel()
	p, err := brokerauth.NewURLPolicy([]string{"http://127.0.0.1:4100/", "https://emulator.test/sns/"})
	if err != nil {
		t.Fatal(err)
	}
	certOK := []string{
		"https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
		"https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem",
		"https://sns.us-gov-west-1.amazonaws.com/x.pem",
		"http://127.0.0.1:4100/SimpleNotificationService/1.pem",
		"https://emulator.test/sns/cert.pem",
		"https://EMULATOR.test/sns/cert.pem",
	}
	for _, u := range certOK {
		if _, err := p.CheckCertURL(u); err != nil {
			t.Errorf("CheckCertURL(%s) = %v, want accepted", u, err)
		}
	}
	certBad := []string{
		"",
		"http://sns.us-east-1.amazonaws.com/x.pem",
		"https://sns.us-east-1.amazonaws.com/x.pem?x=1",
		"https://sns.us-east-1.amazonaws.com/x.pem#f",
		"https://sns.us-east-1.amazonaws.com/x.txt",
		"https://sns.us-east-1.amazonaws.com:443/x.pem",
		"https://sns.us-east-1.amazonaws.com./x.pem",
		"https://SNS.us-east-1.amazonaws.com/x.pem",
		"https://sns.us_east.amazonaws.com/x.pem",
		"https://sns..amazonaws.com/x.pem",
		"https://sns.us-east-1.amazonaws.com.evil.test/x.pem",
		"https://evil.test/https://sns.us-east-1.amazonaws.com/x.pem",
		"https://a@sns.us-east-1.amazonaws.com/x.pem",
		"https://sns.us-east-1.amazonaws.com/../x.pem",
		"//sns.us-east-1.amazonaws.com/x.pem",
		"sns.us-east-1.amazonaws.com/x.pem",
		"http://127.0.0.1:41000/x.pem",
		"http://127.0.0.1:4100.evil.test/x.pem",
		"https://127.0.0.1:4100/x.pem",
		"https://emulator.test/snsx/cert.pem",
		"https://emulator.test/sns/../cert.pem",
		"http://localhost:4100/x.pem",
	}
	for _, u := range certBad {
		_, err := p.CheckCertURL(u)
		if k := brokerauth.KindOf(err); k != brokerauth.Forbidden && !(u == "" && k == brokerauth.Malformed) {
			t.Errorf("CheckCertURL(%q) = %v, want Forbidden", u, err)
		}
	}

	subOK := []string{
		"https://sns.us-west-2.amazonaws.com/?Action=ConfirmSubscription&TopicArn=arn:aws:sns:us-west-2:123456789012:t&Token=abc",
		"http://127.0.0.1:4100/?Action=ConfirmSubscription&TopicArn=x&Token=y",
	}
	for _, u := range subOK {
		if _, err := p.CheckSubscribeURL(u); err != nil {
			t.Errorf("CheckSubscribeURL(%s) = %v, want accepted", u, err)
		}
	}
	subBad := []string{
		"https://sns.us-west-2.amazonaws.com/?Action=Unsubscribe&SubscriptionArn=x",
		"https://sns.us-west-2.amazonaws.com/?Action=ConfirmSubscription&Action=Unsubscribe",
		"https://sns.us-west-2.amazonaws.com/",
		"https://evil.test/?Action=ConfirmSubscription&Token=y",
		"http://sns.us-west-2.amazonaws.com/?Action=ConfirmSubscription&Token=y",
	}
	for _, u := range subBad {
		if _, err := p.CheckSubscribeURL(u); brokerauth.KindOf(err) != brokerauth.Forbidden {
			t.Errorf("CheckSubscribeURL(%s) = %v, want Forbidden", u, err)
		}
	}

	// Nothing but the AWS pattern without configuration.
	var none *brokerauth.URLPolicy
	if _, err := none.CheckCertURL("http://127.0.0.1:4100/x.pem"); brokerauth.KindOf(err) != brokerauth.Forbidden {
		t.Errorf("zero policy accepted an emulator URL: %v", err)
	}
	if _, err := none.CheckCertURL(certOK[0]); err != nil {
		t.Errorf("zero policy refused SNS: %v", err)
	}
}

func TestTrustedPrefixValidation(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		"http://127.0.0.1:4100", "127.0.0.1:4100/", "ftp://x/", "http://u:p@x/", "http://x/?a=1",
		"http://x/#f", "http:///", "http://x/a/../",
	} {
		if err := brokerauth.CheckTrustedPrefix(bad); err == nil {
			t.Errorf("CheckTrustedPrefix(%q) accepted", bad)
		}
	}
	if _, err := brokerauth.NewURLPolicy([]string{"http://ok/", "bad"}); err == nil {
		t.Error("NewURLPolicy accepted a bad prefix")
	}
}

// A message may point the gateway at any URL. Outside the allow-list none is
// ever requested, however well the message is signed.
func TestURLsOutsideTheAllowListAreNeverFetched(t *testing.T) {
	t.Parallel()
	sns := authtest.NewSNS(t)
	outside := authtest.NewRecorder(t)
	v, err := brokerauth.NewSNSVerifier(brokerauth.SNSOptions{TrustedURLPrefixes: []string{sns.Prefix()}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const topic = "arn:aws:sns:us-east-1:123456789012:orders"

	m := sns.Notification(topic, "n-1", "hello")
	m.SigningCertURL = outside.URL() + "/SimpleNotificationService-x.pem"
	sns.Sign(m, "2")
	if err := v.Verify(ctx, m); brokerauth.KindOf(err) != brokerauth.Forbidden {
		t.Errorf("Verify with a certificate outside the allow-list = %v, want Forbidden", err)
	}

	c := sns.Sign(sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, topic, "c-1"), "1")
	c.SubscribeURL = outside.URL() + "/?Action=ConfirmSubscription&TopicArn=" + topic + "&Token=x"
	sns.Sign(c, "1")
	if err := v.Verify(ctx, c); err != nil {
		t.Fatalf("the confirmation itself is genuine: %v", err)
	}
	if _, err := v.Confirm(ctx, c); brokerauth.KindOf(err) != brokerauth.Forbidden {
		t.Errorf("Confirm with a SubscribeURL outside the allow-list = %v, want Forbidden", err)
	}
	if n := outside.Hits(); n != 0 {
		t.Fatalf("the server outside the allow-list received %d requests", n)
	}
	if len(sns.Confirms()) != 0 {
		t.Fatalf("confirmations: %v", sns.Confirms())
	}
}

// Redirects are not followed, even from a trusted host: the target was never
// checked. A certificate URL that redirects serves no certificate, so the
// message does not verify.
func TestRedirectsAreNotFollowed(t *testing.T) {
	t.Parallel()
	outside := authtest.NewRecorder(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, outside.URL()+"/cert.pem", http.StatusFound)
	})
	srv := newServer(t, mux)
	v, err := brokerauth.NewSNSVerifier(brokerauth.SNSOptions{TrustedURLPrefixes: []string{srv + "/"}})
	if err != nil {
		t.Fatal(err)
	}
	sns := authtest.NewSNS(t)
	m := sns.Notification("arn:aws:sns:us-east-1:123456789012:t", "n-1", "x")
	m.SigningCertURL = srv + "/cert.pem"
	sns.Sign(m, "2")
	if err := v.Verify(context.Background(), m); brokerauth.KindOf(err) != brokerauth.Unauthenticated {
		t.Errorf("Verify through a redirect = %v, want Unauthenticated", err)
	}
	if outside.Hits() != 0 {
		t.Fatal("the redirect was followed")
	}
}

func TestConfirm(t *testing.T) {
	t.Parallel()
	sns := authtest.NewSNS(t)
	v, err := brokerauth.NewSNSVerifier(brokerauth.SNSOptions{TrustedURLPrefixes: []string{sns.Prefix()}})
	if err != nil {
		t.Fatal(err)
	}
	const topic = "arn:aws:sns:us-east-1:123456789012:orders"
	c := sns.Sign(sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, topic, "c-1"), "2")
	arn, err := v.Confirm(context.Background(), c)
	if err != nil || arn != topic+":sub-1" {
		t.Fatalf("Confirm = %q, %v", arn, err)
	}
	sns.Stop()
	if _, err := v.Confirm(context.Background(), c); brokerauth.KindOf(err) != brokerauth.Unavailable {
		t.Fatalf("Confirm with SNS down = %v, want Unavailable", err)
	}
	n := sns.Notification(topic, "n-1", "x")
	if _, err := v.Confirm(context.Background(), n); brokerauth.KindOf(err) != brokerauth.Malformed {
		t.Fatalf("Confirm of a Notification = %v, want Malformed", err)
	}
}

func newServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// A route's topics name the regions (within their partition) it fetches
// certificates for.
func TestRegionAllowed(t *testing.T) {
	t.Parallel()
	topics := []string{"arn:aws:sns:us-east-1:123456789012:orders", "arn:aws-cn:sns:cn-north-1:123456789012:orders"}
	for arn, want := range map[string]bool{
		"arn:aws:sns:us-east-1:999999999999:other":       true,
		"arn:aws-cn:sns:cn-north-1:999999999999:other":   true,
		"arn:aws:sns:eu-west-1:123456789012:orders":      false,
		"arn:aws-us-gov:sns:us-east-1:123456789012:x":    false,
		"arn:aws:sns:us-east-1:12345:orders":             false,
		"arn:aws:sqs:us-east-1:123456789012:orders":      false,
		"arn:aws:sns:us-east-1:123456789012:orders:sub1": false,
		"": false,
	} {
		if got := brokerauth.RegionAllowed(arn, topics); got != want {
			t.Errorf("RegionAllowed(%q) = %v, want %v", arn, got, want)
		}
	}
	for arn, host := range map[string]string{
		"arn:aws:sns:us-east-1:123456789012:orders":        "sns.us-east-1.amazonaws.com",
		"arn:aws-cn:sns:cn-north-1:123456789012:orders":    "sns.cn-north-1.amazonaws.com.cn",
		"arn:aws-us-gov:sns:us-gov-west-1:123456789012:ok": "sns.us-gov-west-1.amazonaws.com",
	} {
		if _, got, ok := brokerauth.TopicRegion(arn); !ok || got != host {
			t.Errorf("TopicRegion(%q) = %q, %v; want %q", arn, got, ok, host)
		}
	}
}
