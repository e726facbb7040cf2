package brokerauth_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/internal/authtest"
)

// snsHosts is one TLS server standing in for every SNS host: the verifier
// checks the real https://sns.<region>.amazonaws.com URL, and the client's
// dialer takes every connection here. The server answers each certificate
// path with the status the test sets (200 serves the signer's certificate)
// and counts requests by host.
type snsHosts struct {
	signer *authtest.SNS
	srv    *httptest.Server

	mu      sync.Mutex
	status  map[string]int // by path; absent means 404
	hits    map[string]int // by host
	release chan struct{}  // when set, certificate answers wait for it
}

func newSNSHosts(t *testing.T) *snsHosts {
	t.Helper()
	h := &snsHosts{signer: authtest.NewSNS(t), status: map[string]int{}, hits: map[string]int{}}
	h.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.hits[r.Host]++
		code, ok := h.status[r.URL.Path]
		release := h.release
		h.mu.Unlock()
		if release != nil {
			<-release
		}
		switch {
		case !ok:
			http.NotFound(w, r)
		case code == http.StatusOK:
			_, _ = w.Write(h.signer.CertPEM)
		default:
			w.WriteHeader(code)
		}
	}))
	t.Cleanup(h.srv.Close)
	return h
}

// client dials the stand-in whatever host a URL names, and checks the
// stand-in's certificate under its own name.
func (h *snsHosts) client() *http.Client {
	tr := h.srv.Client().Transport.(*http.Transport).Clone()
	addr := h.srv.Listener.Addr().String()
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	tr.TLSClientConfig = tr.TLSClientConfig.Clone()
	tr.TLSClientConfig.ServerName = "example.com"
	tr.TLSClientConfig.MinVersion = tls.VersionTLS12
	return &http.Client{Transport: tr}
}

func (h *snsHosts) set(path string, status int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.status[path] = status
}

func (h *snsHosts) hitsOn(host string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.hits[host]
}

// fakeClock is the verifier's clock, moved by the test.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (h *snsHosts) verifier(t *testing.T, clock *fakeClock) *brokerauth.SNSVerifier {
	t.Helper()
	v, err := brokerauth.NewSNSVerifier(brokerauth.SNSOptions{HTTPClient: h.client(), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// message is a notification signed by the stand-in's key, naming certURL,
// from a topic in the region of certURL's host (SNS signs with its own
// region's certificate).
func (h *snsHosts) message(certURL string) *brokerauth.SNSMessage {
	region := "us-east-1"
	if u, err := url.Parse(certURL); err == nil {
		if r, ok := strings.CutPrefix(strings.TrimSuffix(u.Host, ".amazonaws.com"), "sns."); ok {
			region = r
		}
	}
	return h.messageFrom("arn:aws:sns:"+region+":123456789012:orders", certURL)
}

// messageFrom is message from the topic topicArn, wherever certURL is.
func (h *snsHosts) messageFrom(topicArn, certURL string) *brokerauth.SNSMessage {
	m := h.signer.Notification(topicArn, "n-1", "hello")
	m.SigningCertURL = certURL
	return h.signer.Sign(m, "2")
}

const snsHost = "sns.us-east-1.amazonaws.com"

// A certificate URL on an SNS host that has no certificate (404, 403) cannot
// belong to a genuine message: a bad signature (401 to SNS), never "try again
// later". The answer is kept for a while, so a flood of messages naming that
// URL costs one fetch, not one per message.
func TestSNSCertURLWithoutCertificateIsABadSignature(t *testing.T) {
	t.Parallel()
	h := newSNSHosts(t)
	clock := &fakeClock{now: time.Now()}
	v := h.verifier(t, clock)
	h.set("/SimpleNotificationService-forbidden.pem", http.StatusForbidden)
	for _, path := range []string{"/SimpleNotificationService-missing.pem", "/SimpleNotificationService-forbidden.pem"} {
		before := h.hitsOn(snsHost)
		m := h.message("https://" + snsHost + path)
		for i := range 50 {
			err := v.Verify(context.Background(), m)
			if brokerauth.KindOf(err) != brokerauth.Unauthenticated {
				t.Fatalf("%s, message %d: Verify = %v, want Unauthenticated", path, i+1, err)
			}
		}
		if n := h.hitsOn(snsHost) - before; n != 1 {
			t.Errorf("%s: 50 messages fetched the certificate URL %d times, want 1", path, n)
		}
	}
}

// A certificate host that fails (5xx, or no connection) means "cannot verify
// yet": Unavailable, so SNS retries. The failure is kept briefly, so messages
// arriving meanwhile do not each fetch again, and once it has expired the
// next message fetches again and verifies.
func TestSNSCertFetchFailureIsCachedBriefly(t *testing.T) {
	t.Parallel()
	h := newSNSHosts(t)
	clock := &fakeClock{now: time.Now()}
	v := h.verifier(t, clock)
	path := "/SimpleNotificationService-flaky.pem"
	h.set(path, http.StatusServiceUnavailable)
	m := h.message("https://" + snsHost + path)
	for i := range 20 {
		if err := v.Verify(context.Background(), m); brokerauth.KindOf(err) != brokerauth.Unavailable {
			t.Fatalf("message %d with the host answering 503: Verify = %v, want Unavailable", i+1, err)
		}
	}
	if n := h.hitsOn(snsHost); n != 1 {
		t.Fatalf("20 messages during a 503 fetched the certificate %d times, want 1", n)
	}
	h.set(path, http.StatusOK)
	clock.Advance(2 * time.Minute) // past the failure's time in the cache
	if err := v.Verify(context.Background(), m); err != nil {
		t.Fatalf("Verify after the host recovered = %v", err)
	}
	if n := h.hitsOn(snsHost); n != 2 {
		t.Fatalf("certificate fetched %d times, want 2", n)
	}
}

// Messages naming ever new certificate URLs cannot make the gateway fetch
// without bound: each host gets a bounded number of fetches per interval,
// the rest are Unavailable without a request, and other hosts and cached
// certificates are not affected. After the interval, fetches resume.
func TestSNSCertFetchesPerHostAreBounded(t *testing.T) {
	t.Parallel()
	h := newSNSHosts(t)
	clock := &fakeClock{now: time.Now()}
	v := h.verifier(t, clock)
	good := "/SimpleNotificationService-good.pem"
	h.set(good, http.StatusOK)
	other := "sns.eu-west-1.amazonaws.com"
	if err := v.Verify(context.Background(), h.message("https://"+snsHost+good)); err != nil {
		t.Fatalf("genuine message: %v", err)
	}

	refused := 0
	for i := range 50 {
		err := v.Verify(context.Background(), h.message(fmt.Sprintf("https://%s/SimpleNotificationService-%d.pem", snsHost, i)))
		switch brokerauth.KindOf(err) {
		case brokerauth.Unauthenticated: // fetched: 404
		case brokerauth.Unavailable:
			refused++
		default:
			t.Fatalf("random certificate URL %d: Verify = %v", i, err)
		}
	}
	fetched := h.hitsOn(snsHost) - 1
	if fetched+refused != 50 || fetched > brokerauth.DefaultCertFetchesPerHost {
		t.Fatalf("50 random certificate URLs on one host: %d fetched, %d refused; want at most %d fetched", fetched, refused, brokerauth.DefaultCertFetchesPerHost)
	}
	// The cached certificate still verifies, and another host still fetches.
	if err := v.Verify(context.Background(), h.message("https://"+snsHost+good)); err != nil {
		t.Fatalf("genuine message during the flood: %v", err)
	}
	h.set("/SimpleNotificationService-eu.pem", http.StatusOK)
	if err := v.Verify(context.Background(), h.message("https://"+other+"/SimpleNotificationService-eu.pem")); err != nil {
		t.Fatalf("genuine message from another host during the flood: %v", err)
	}
	if n := h.hitsOn(other); n != 1 {
		t.Fatalf("other host fetched %d times", n)
	}
	// A new interval: the flooded host may be fetched from again.
	clock.Advance(2 * time.Minute)
	before := h.hitsOn(snsHost)
	err := v.Verify(context.Background(), h.message("https://"+snsHost+"/SimpleNotificationService-later.pem"))
	if brokerauth.KindOf(err) != brokerauth.Unauthenticated || h.hitsOn(snsHost) != before+1 {
		t.Fatalf("after the interval: Verify = %v, %d fetches", err, h.hitsOn(snsHost)-before)
	}
}

// Concurrent messages naming one certificate URL share one fetch.
func TestSNSConcurrentCertFetchesCollapse(t *testing.T) {
	t.Parallel()
	h := newSNSHosts(t)
	clock := &fakeClock{now: time.Now()}
	v := h.verifier(t, clock)
	path := "/SimpleNotificationService-slow.pem"
	h.set(path, http.StatusOK)
	release := make(chan struct{})
	h.mu.Lock()
	h.release = release
	h.mu.Unlock()
	m := h.message("https://" + snsHost + path)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() { errs <- v.Verify(context.Background(), m) })
	}
	// Wait until the one fetch has reached the host, then let it answer.
	deadline := time.Now().Add(10 * time.Second)
	for h.hitsOn(snsHost) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Verify = %v", err)
		}
	}
	if n := h.hitsOn(snsHost); n != 1 {
		t.Fatalf("20 concurrent messages fetched the certificate %d times, want 1", n)
	}
}

// A certificate is fetched only from the SNS endpoint of the region the
// message's topic names: a SigningCertURL on another region's host is
// Forbidden before anything is fetched, whatever its path.
func TestSNSCertHostMustBeTheTopicsRegion(t *testing.T) {
	t.Parallel()
	h := newSNSHosts(t)
	v := h.verifier(t, &fakeClock{now: time.Now()})
	h.set("/SimpleNotificationService-good.pem", http.StatusOK)
	for _, tc := range []struct{ topic, certURL string }{
		{"arn:aws:sns:us-east-1:123456789012:orders", "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-good.pem"},
		{"arn:aws:sns:us-east-1:123456789012:orders", "https://sns.zz-9.amazonaws.com/SimpleNotificationService-good.pem"},
		{"arn:aws-cn:sns:cn-north-1:123456789012:orders", "https://sns.cn-north-1.amazonaws.com/SimpleNotificationService-good.pem"},
		{"not-an-arn", "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-good.pem"},
	} {
		err := v.Verify(context.Background(), h.messageFrom(tc.topic, tc.certURL))
		if brokerauth.KindOf(err) != brokerauth.Forbidden {
			t.Errorf("topic %s, certificate %s: Verify = %v, want Forbidden", tc.topic, tc.certURL, err)
		}
	}
	h.mu.Lock()
	hits := len(h.hits)
	h.mu.Unlock()
	if hits != 0 {
		t.Fatalf("certificates of other regions were fetched: %v", h.hits)
	}
	// The China partition's own endpoint is that region's host.
	if err := v.Verify(context.Background(), h.messageFrom("arn:aws-cn:sns:cn-north-1:123456789012:orders",
		"https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-good.pem")); err != nil {
		t.Fatalf("a China topic with its own endpoint: %v", err)
	}
}

// Fetches refused or spent on other hosts never starve a genuine host: 50
// messages naming certificates on 50 other SNS hosts (each signed as if
// from its region, the most a sender can do) are each fetched or refused on
// their own host's budget, and a genuine message whose certificate is not
// cached yet still fetches and verifies.
func TestSNSOtherHostsNeverStarveAGenuineHost(t *testing.T) {
	t.Parallel()
	h := newSNSHosts(t)
	v := h.verifier(t, &fakeClock{now: time.Now()})
	for i := range 50 {
		host := fmt.Sprintf("sns.zz-%d.amazonaws.com", i)
		err := v.Verify(context.Background(), h.message("https://"+host+"/bad.pem"))
		if brokerauth.KindOf(err) != brokerauth.Unauthenticated {
			t.Fatalf("bogus certificate %d: Verify = %v, want Unauthenticated (fetched, 404)", i, err)
		}
	}
	h.set("/SimpleNotificationService-good.pem", http.StatusOK)
	if err := v.Verify(context.Background(), h.message("https://"+snsHost+"/SimpleNotificationService-good.pem")); err != nil {
		t.Fatalf("genuine message after a flood on other hosts: %v", err)
	}
	if n := h.hitsOn(snsHost); n != 1 {
		t.Fatalf("genuine host fetched %d times, want 1", n)
	}
}
