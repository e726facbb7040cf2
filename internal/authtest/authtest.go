// Package authtest stands in for the brokers' identity providers in tests: a
// local OIDC issuer (its own RSA key and JWKS server) that signs Pub/Sub-style
// push tokens, and a local SNS signer (its own certificate, served over HTTP,
// and a ConfirmSubscription endpoint). Every server counts the requests it
// receives, so tests can prove what was and was not fetched.
package authtest

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackgate/ackgate/brokerauth"
)

// Issuer is a local OIDC issuer. Its tokens carry Google's issuer, so the
// verifier under test runs exactly as in production, only with the JWKS URL
// pointed here.
type Issuer struct {
	Key *rsa.PrivateKey
	KID string
	// Stranger is a key the JWKS never lists.
	Stranger *rsa.PrivateKey

	srv  *httptest.Server
	hits atomic.Int64
}

// NewIssuer starts the JWKS server; it stops with the test.
func NewIssuer(t testing.TB) *Issuer {
	t.Helper()
	i := &Issuer{Key: newKey(t), Stranger: newKey(t), KID: "test-key-1"}
	i.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		i.hits.Add(1)
		pub := i.Key.PublicKey
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]string{{
			"kty": "RSA", "alg": "RS256", "use": "sig", "kid": i.KID,
			"n": b64(pub.N.Bytes()), "e": b64(big.NewInt(int64(pub.E)).Bytes()),
		}}})
	}))
	t.Cleanup(i.srv.Close)
	return i
}

// JWKSURL is where the issuer's keys are served.
func (i *Issuer) JWKSURL() string { return i.srv.URL + "/certs" }

// Hits counts key set fetches.
func (i *Issuer) Hits() int64 { return i.hits.Load() }

// Claims are a valid push token's claims for audience and service account.
func (i *Issuer) Claims(audience, serviceAccount string) map[string]any {
	now := time.Now()
	return map[string]any{
		"iss": "https://accounts.google.com", "aud": audience, "azp": "1234567890",
		"sub": "1234567890", "email": serviceAccount, "email_verified": true,
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
	}
}

// Token signs claims RS256 with the issuer's key and kid.
func (i *Issuer) Token(t testing.TB, claims map[string]any) string {
	t.Helper()
	return SignJWT(t, i.Key, map[string]any{"alg": "RS256", "typ": "JWT", "kid": i.KID}, claims)
}

// SignJWT signs a compact JWT with any header; key nil leaves the signature
// empty (for alg none).
func SignJWT(t testing.TB, key *rsa.PrivateKey, header, claims map[string]any) string {
	t.Helper()
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	c, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	signing := b64(h) + "." + b64(c)
	if key == nil {
		return signing + "."
	}
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signing + "." + b64(sig)
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func newKey(t testing.TB) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// SNS is a local stand-in for SNS's certificate and confirmation endpoints.
// It can be stopped and started again on the same address, to play a
// certificate host that is down for a while.
type SNS struct {
	Key     *rsa.PrivateKey
	CertPEM []byte

	t    testing.TB
	addr string

	mu       sync.Mutex
	srv      *httptest.Server
	certHits int
	confirms []string
}

// NewSNS starts the server; it stops with the test.
func NewSNS(t testing.TB) *SNS {
	t.Helper()
	s := &SNS{t: t, Key: newKey(t)}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sns.test.local"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &s.Key.PublicKey, s.Key)
	if err != nil {
		t.Fatal(err)
	}
	s.CertPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	s.serve(ln)
	t.Cleanup(s.Stop)
	return s
}

func (s *SNS) serve(ln net.Listener) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(s.handle))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
}

func (s *SNS) handle(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case strings.HasSuffix(r.URL.Path, ".pem"):
		s.certHits++
		_, _ = w.Write(s.CertPEM)
	case r.URL.Query().Get("Action") == "ConfirmSubscription":
		s.confirms = append(s.confirms, r.URL.Query().Get("TopicArn"))
		w.Header().Set("Content-Type", "text/xml")
		fmt.Fprintf(w, `<ConfirmSubscriptionResponse><ConfirmSubscriptionResult><SubscriptionArn>%s:sub-1</SubscriptionArn></ConfirmSubscriptionResult></ConfirmSubscriptionResponse>`, r.URL.Query().Get("TopicArn"))
	default:
		http.NotFound(w, r)
	}
}

// Stop closes the server and every connection to it.
func (s *SNS) Stop() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.CloseClientConnections()
		srv.Close()
	}
}

// Start serves again on the address it had.
func (s *SNS) Start() {
	s.t.Helper()
	var ln net.Listener
	var err error
	for range 50 { // the port may take a moment to be free again
		if ln, err = net.Listen("tcp", s.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatalf("authtest: listen again on %s: %v", s.addr, err)
	}
	s.serve(ln)
}

// Prefix is the URL prefix to trust for this server (the emulator setting).
func (s *SNS) Prefix() string { return "http://" + s.addr + "/" }

// CertURL is the SigningCertURL of messages signed here.
func (s *SNS) CertURL() string { return s.Prefix() + "SimpleNotificationService-test.pem" }

// SubscribeURL is a confirmation URL for topic.
func (s *SNS) SubscribeURL(topic, token string) string {
	return s.Prefix() + "?Action=ConfirmSubscription&TopicArn=" + topic + "&Token=" + token
}

// CertHits counts certificate downloads.
func (s *SNS) CertHits() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.certHits
}

// Confirms lists the topics whose subscriptions were confirmed here.
func (s *SNS) Confirms() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.confirms...)
}

// Notification is a Notification for topic with a fresh id, not yet signed.
func (s *SNS) Notification(topic, id, message string) *brokerauth.SNSMessage {
	return &brokerauth.SNSMessage{
		Type: brokerauth.SNSNotification, MessageID: id, TopicArn: topic, Message: message,
		Timestamp: time.Now().UTC().Format("2006-01-02T15:04:05.000Z"), SigningCertURL: s.CertURL(),
	}
}

// Confirmation is a SubscriptionConfirmation for topic, not yet signed.
func (s *SNS) Confirmation(typ, topic, id string) *brokerauth.SNSMessage {
	return &brokerauth.SNSMessage{
		Type: typ, MessageID: id, TopicArn: topic, Token: "tok-" + id,
		Message:      "You have chosen to subscribe to the topic " + topic + ".\nTo confirm the subscription, visit the SubscribeURL included in this message.",
		SubscribeURL: s.SubscribeURL(topic, "tok-"+id), SigningCertURL: s.CertURL(),
		Timestamp: time.Now().UTC().Format("2006-01-02T15:04:05.000Z"),
	}
}

// Sign signs m with SignatureVersion version ("1" or "2").
func (s *SNS) Sign(m *brokerauth.SNSMessage, version string) *brokerauth.SNSMessage {
	s.t.Helper()
	m.SignatureVersion = version
	str := m.StringToSign()
	var sig []byte
	var err error
	switch version {
	case "1":
		sum := sha1.Sum([]byte(str))
		sig, err = rsa.SignPKCS1v15(rand.Reader, s.Key, crypto.SHA1, sum[:])
	default:
		sum := sha256.Sum256([]byte(str))
		sig, err = rsa.SignPKCS1v15(rand.Reader, s.Key, crypto.SHA256, sum[:])
	}
	if err != nil {
		s.t.Fatal(err)
	}
	m.Signature = base64.StdEncoding.EncodeToString(sig)
	return m
}

// Body encodes m the way SNS writes a delivery body.
func Body(m *brokerauth.SNSMessage) []byte {
	out := map[string]any{
		"Type": m.Type, "MessageId": m.MessageID, "TopicArn": m.TopicArn, "Message": m.Message,
		"Timestamp": m.Timestamp, "SignatureVersion": m.SignatureVersion, "Signature": m.Signature,
		"SigningCertURL": m.SigningCertURL,
	}
	if m.Subject != nil {
		out["Subject"] = *m.Subject
	}
	if m.Type != brokerauth.SNSNotification {
		out["SubscribeURL"], out["Token"] = m.SubscribeURL, m.Token
	}
	if m.UnsubscribeURL != "" {
		out["UnsubscribeURL"] = m.UnsubscribeURL
	}
	if len(m.MessageAttributes) > 0 {
		out["MessageAttributes"] = m.MessageAttributes
	}
	b, _ := json.Marshal(out)
	return b
}

// Recorder is a server that must never be contacted: it counts every request.
type Recorder struct {
	srv  *httptest.Server
	hits atomic.Int64
}

// NewRecorder starts it; it stops with the test.
func NewRecorder(t testing.TB) *Recorder {
	r := &Recorder{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		r.hits.Add(1)
		_, _ = w.Write([]byte("nothing here"))
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// URL is the server's base URL.
func (r *Recorder) URL() string { return r.srv.URL }

// Hits counts requests received.
func (r *Recorder) Hits() int64 { return r.hits.Load() }
