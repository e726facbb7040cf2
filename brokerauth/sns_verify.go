package brokerauth

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// Defaults of SNSOptions. SNS waits 15 s for an answer, so the certificate
// fetch and the confirmation GET each get a third of that.
//
// A failed fetch is remembered for less time than SNS's default spacing of
// retries (20 s), so a genuine message retried after an outage is checked
// afresh. SNS signs with one certificate per region at a time, so a handful of
// fetches per host and minute is plenty for genuine traffic. A certificate
// is shared with other replicas (CertStore) until it expires, for at most a
// day, so that a replica rarely fetches at all.
const (
	DefaultCertTTL            = time.Hour
	DefaultCertShareTTL       = 24 * time.Hour
	DefaultCertFailureTTL     = 10 * time.Second
	DefaultMaxCerts           = 64
	DefaultFetchTimeout       = 5 * time.Second
	DefaultCertFetchesPerHost = 10
	DefaultCertFetchInterval  = time.Minute
	// maxCertHosts bounds the hosts one budget window tracks.
	maxCertHosts = 256
	// maxCertBytes bounds a certificate download; SNS's are about 2 KB.
	maxCertBytes = 64 << 10
	// maxConfirmBytes bounds the ConfirmSubscription answer we read.
	maxConfirmBytes = 64 << 10
)

// SNSOptions configures an SNSVerifier. The zero value is production's:
// only real SNS hosts are trusted.
type SNSOptions struct {
	// TrustedURLPrefixes are extra URL prefixes (an emulator's) accepted for
	// SigningCertURL and SubscribeURL. Empty in production.
	TrustedURLPrefixes []string
	// HTTPClient fetches certificates and confirms subscriptions. Its
	// redirect policy is replaced: redirects are never followed, since a
	// redirect could lead outside the allow-list.
	HTTPClient *http.Client
	// CertTTL is how long a fetched certificate is reused; MaxCerts bounds
	// how many are kept (the oldest goes first). CertShareTTL bounds how
	// long one is kept in the shared store (see ShareCerts).
	CertTTL      time.Duration
	CertShareTTL time.Duration
	MaxCerts     int
	// CertFailureTTL is how long a failed certificate fetch is remembered
	// (and answered from) before the URL is tried again.
	CertFailureTTL time.Duration
	// CertFetchesPerHost bounds the certificate fetches to each host in
	// each CertFetchInterval; beyond it a message whose certificate is
	// neither cached nor shared is Unavailable. There is no bound across
	// hosts: fetches for one host never use up another's.
	CertFetchesPerHost int
	CertFetchInterval  time.Duration
	// FetchTimeout bounds one certificate fetch and one confirmation GET.
	FetchTimeout time.Duration
	Now          func() time.Time
}

// SNSVerifier checks SNS message signatures (SignatureVersion 1, SHA1withRSA,
// and 2, SHA256withRSA) and confirms subscriptions. It is safe for concurrent
// use and meant to be shared by every SNS route of the process.
type SNSVerifier struct {
	policy  *URLPolicy
	client  *http.Client
	timeout time.Duration
	certs   *certCache
}

// NewSNSVerifier fails only on an invalid trusted prefix.
func NewSNSVerifier(o SNSOptions) (*SNSVerifier, error) {
	policy, err := NewURLPolicy(o.TrustedURLPrefixes)
	if err != nil {
		return nil, err
	}
	if o.FetchTimeout <= 0 {
		o.FetchTimeout = DefaultFetchTimeout
	}
	if o.CertTTL <= 0 {
		o.CertTTL = DefaultCertTTL
	}
	if o.CertShareTTL <= 0 {
		o.CertShareTTL = DefaultCertShareTTL
	}
	if o.MaxCerts <= 0 {
		o.MaxCerts = DefaultMaxCerts
	}
	if o.CertFailureTTL <= 0 {
		o.CertFailureTTL = DefaultCertFailureTTL
	}
	if o.CertFetchesPerHost <= 0 {
		o.CertFetchesPerHost = DefaultCertFetchesPerHost
	}
	if o.CertFetchInterval <= 0 {
		o.CertFetchInterval = DefaultCertFetchInterval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &SNSVerifier{
		policy:  policy,
		client:  noRedirectClient(o.HTTPClient, o.FetchTimeout),
		timeout: o.FetchTimeout,
		certs: newCertCache(certCacheOptions{
			ttl: o.CertTTL, failTTL: o.CertFailureTTL, shareTTL: o.CertShareTTL, max: o.MaxCerts, now: o.Now,
			perHost: o.CertFetchesPerHost, maxHosts: maxCertHosts, interval: o.CertFetchInterval,
		}),
	}, nil
}

// Policy is the URL allow-list the verifier applies.
func (v *SNSVerifier) Policy() *URLPolicy { return v.policy }

// ShareCerts makes the verifier look certificates up in s before it
// fetches, and put those it fetched there, so that replicas share them.
// Call it before the verifier is first used.
func (v *SNSVerifier) ShareCerts(s CertStore) { v.certs.store = s }

// Verify checks m's signature against the certificate its SigningCertURL
// names. The URL is checked before anything is fetched: on an SNS host it
// must be the endpoint of the region m's TopicArn names, since SNS signs
// with its own region's certificate. A certificate that cannot be had right
// now (no connection, a 5xx, the host's fetch budget spent) is Unavailable;
// a signature that does not verify, or a URL that serves no certificate, is
// Unauthenticated; a URL outside the allow-list or another region's host is
// Forbidden.
func (v *SNSVerifier) Verify(ctx context.Context, m *SNSMessage) error {
	var hash crypto.Hash
	switch m.SignatureVersion {
	case "1":
		hash = crypto.SHA1
	case "2":
		hash = crypto.SHA256
	case "":
		return fail(Unauthenticated, nil, "SNS message has no SignatureVersion")
	default:
		return fail(Unauthenticated, nil, "SignatureVersion %q is not 1 or 2", gate.Bound(m.SignatureVersion, 8))
	}
	if m.Signature == "" {
		return fail(Unauthenticated, nil, "SNS message has no Signature")
	}
	sig, err := base64.StdEncoding.DecodeString(m.Signature)
	if err != nil || len(sig) == 0 || len(sig) > 1024 {
		return fail(Unauthenticated, nil, "Signature is not base64 of an RSA signature")
	}
	certURL, err := v.policy.CheckCertURL(m.SigningCertURL)
	if err != nil {
		return err
	}
	if err := checkRegionHost(certURL, m.TopicArn, "SigningCertURL"); err != nil {
		return err
	}
	key, err := v.certs.get(ctx, certURL.String(), certURL.Host, v.fetchCert)
	if err != nil {
		return err
	}
	if verifySum(key, hash, m.stringToSign(m.Subject != nil), sig) {
		return nil
	}
	// Some publishers (emulators among them) write "Subject": "" and sign
	// as if it were absent; both spell the same message.
	if m.Type == SNSNotification && m.Subject != nil && *m.Subject == "" && verifySum(key, hash, m.stringToSign(false), sig) {
		return nil
	}
	return fail(Unauthenticated, nil, "SNS signature does not verify")
}

func verifySum(key *rsa.PublicKey, hash crypto.Hash, s string, sig []byte) bool {
	var sum []byte
	switch hash {
	case crypto.SHA1:
		h := sha1.Sum([]byte(s))
		sum = h[:]
	case crypto.SHA256:
		h := sha256.Sum256([]byte(s))
		sum = h[:]
	default:
		return false
	}
	return rsa.VerifyPKCS1v15(key, hash, sum, sig) == nil
}

// fetchCert downloads and parses one signing certificate. Only a failure that
// may pass is Unavailable: no connection, a timeout, a 5xx (and 408 or 429,
// which say "later" too). A URL on an allowed host that answers anything else,
// or serves something that is not a certificate, cannot be where a genuine
// message's certificate lives: the message's signature is as good as wrong.
func (v *SNSVerifier) fetchCert(ctx context.Context, certURL string) (*fetched, error) {
	ctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, certURL, nil)
	if err != nil {
		return nil, fail(Unavailable, err, "signing certificate request could not be built")
	}
	resp, err := v.client.Do(req)
	if err != nil {
		return nil, fail(Unavailable, err, "signing certificate cannot be fetched now")
	}
	defer resp.Body.Close()
	switch code := resp.StatusCode; {
	case code == http.StatusOK:
	case code >= 500, code == http.StatusRequestTimeout, code == http.StatusTooManyRequests:
		return nil, fail(Unavailable, nil, "signing certificate cannot be fetched now: HTTP %d", code)
	default:
		return nil, fail(Unauthenticated, nil, "SigningCertURL serves no certificate (HTTP %d)", code)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxCertBytes+1))
	if err != nil {
		return nil, fail(Unavailable, err, "signing certificate cannot be fetched now")
	}
	if len(body) > maxCertBytes {
		return nil, fail(Unauthenticated, nil, "SigningCertURL serves more than %d bytes, not a certificate", maxCertBytes)
	}
	cert, err := parseCert(body)
	if err != nil {
		return nil, fail(Unauthenticated, err, "SigningCertURL serves no usable certificate")
	}
	return cert, nil
}

// parseCert returns the RSA key of the first certificate in a PEM file, with
// that certificate alone re-encoded as PEM (what a store keeps) and its end
// of validity. The validity period is not checked: the URL's host is what
// vouches for it, as in AWS's own validators, and archived messages (the test
// vectors) carry certificates that have since expired.
func parseCert(pemBytes []byte) (*fetched, error) {
	for {
		var block *pem.Block
		block, pemBytes = pem.Decode(pemBytes)
		if block == nil {
			return nil, errors.New("no CERTIFICATE block")
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		key, ok := cert.PublicKey.(*rsa.PublicKey)
		if !ok {
			return nil, fmt.Errorf("certificate key is %T, not RSA", cert.PublicKey)
		}
		return &fetched{key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: block.Bytes}), notAfter: cert.NotAfter}, nil
	}
}

// Confirm confirms the subscription of a SubscriptionConfirmation by a GET on
// its SubscribeURL, after the same allow-list check as certificates. It
// returns the subscription ARN when the answer names one. A URL outside the
// allow-list is Forbidden and never requested; any failure of the request
// itself is Unavailable, so that SNS sends the confirmation again.
func (v *SNSVerifier) Confirm(ctx context.Context, m *SNSMessage) (string, error) {
	if m.Type != SNSSubscriptionConfirmation {
		return "", fail(Malformed, nil, "only a SubscriptionConfirmation can be confirmed, not %s", gate.Bound(m.Type, 40))
	}
	u, err := v.policy.CheckSubscribeURL(m.SubscribeURL)
	if err != nil {
		return "", err
	}
	if err := checkRegionHost(u, m.TopicArn, "SubscribeURL"); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", fail(Unavailable, err, "confirmation request could not be built")
	}
	resp, err := v.client.Do(req)
	if err != nil {
		return "", fail(Unavailable, redactURLError(err), "subscription cannot be confirmed now")
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxConfirmBytes))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return "", fail(Unavailable, nil, "subscription confirmation answered HTTP %d", resp.StatusCode)
	}
	var answer struct {
		ARN string `xml:"ConfirmSubscriptionResult>SubscriptionArn"`
	}
	if xml.Unmarshal(body, &answer) != nil {
		return "", nil
	}
	return gate.Bound(answer.ARN, 512), nil
}

// redactURLError drops the URL from a client error: a SubscribeURL carries the
// confirmation token, which is not for logs.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}

// noRedirectClient copies c (or builds a client with timeouts) and makes it
// stop at the first redirect.
func noRedirectClient(c *http.Client, timeout time.Duration) *http.Client {
	var out http.Client
	if c != nil {
		out = *c
	} else {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSHandshakeTimeout = timeout
		t.ResponseHeaderTimeout = timeout
		t.MaxIdleConnsPerHost = 2
		out = http.Client{Transport: t}
	}
	if out.Timeout == 0 || out.Timeout > timeout {
		out.Timeout = timeout
	}
	out.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &out
}
