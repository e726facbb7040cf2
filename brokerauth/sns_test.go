package brokerauth_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ackgate/ackgate/brokerauth"
)

// vectorDir holds real SNS deliveries signed by AWS and the certificates
// their SigningCertURLs name (see its README).
const vectorDir = "../testdata/sns"

// certFiles serves the vectors' certificates in place of SNS's hosts: the URL
// checks run on the real URLs, and the request is answered from testdata
// instead of the network. Every request is recorded.
type certFiles struct {
	mu   sync.Mutex
	hits []string
	down bool
}

func (c *certFiles) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.hits = append(c.hits, r.URL.String())
	down := c.down
	c.mu.Unlock()
	if down {
		return nil, errors.New("connection refused")
	}
	b, err := os.ReadFile(filepath.Join(vectorDir, path.Base(r.URL.Path)))
	if err != nil {
		return &http.Response{StatusCode: http.StatusNotFound, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	}
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader(string(b))), Request: r}, nil
}

func (c *certFiles) Hits() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.hits)
}

func newVerifier(t testing.TB, rt http.RoundTripper, prefixes ...string) *brokerauth.SNSVerifier {
	t.Helper()
	v, err := brokerauth.NewSNSVerifier(brokerauth.SNSOptions{
		HTTPClient:         &http.Client{Transport: rt},
		TrustedURLPrefixes: prefixes,
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func vectors(t testing.TB) map[string][]byte {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(vectorDir, "*.json"))
	if err != nil || len(names) != 9 {
		t.Fatalf("want the nine SNS vectors in %s, found %d (%v)", vectorDir, len(names), err)
	}
	out := map[string][]byte{}
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(n)] = b
	}
	return out
}

func parse(t testing.TB, body []byte) *brokerauth.SNSMessage {
	t.Helper()
	m, err := brokerauth.ParseSNSMessage(body)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return m
}

func TestAllSNSVectorsVerify(t *testing.T) {
	t.Parallel()
	certs := &certFiles{}
	v := newVerifier(t, certs)
	for name, body := range vectors(t) {
		m := parse(t, body)
		if err := v.Verify(context.Background(), m); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Each certificate URL is fetched once and then served from the cache.
	hits := certs.Hits()
	if len(hits) != 4 || len(slices.Compact(slices.Sorted(slices.Values(hits)))) != 4 {
		t.Errorf("certificate fetches = %v, want one per distinct URL (4)", hits)
	}
	for name, body := range vectors(t) {
		if err := v.Verify(context.Background(), parse(t, body)); err != nil {
			t.Errorf("%s from the cache: %v", name, err)
		}
	}
	if n := len(certs.Hits()); n != 4 {
		t.Errorf("verifying again fetched certificates again: %d fetches", n)
	}
}

// Each signed field, the version and the certificate host are load-bearing:
// change any one of them by one byte and the message must not verify.
func TestSNSVectorsFailWhenAnythingSignedChanges(t *testing.T) {
	t.Parallel()
	certs := &certFiles{}
	v := newVerifier(t, certs)
	for name, body := range vectors(t) {
		var fields map[string]any
		if err := json.Unmarshal(body, &fields); err != nil {
			t.Fatal(err)
		}
		signed := []string{"Message", "MessageId", "Timestamp", "TopicArn", "Type"}
		if _, ok := fields["Subject"]; ok {
			signed = append(signed, "Subject")
		}
		if fields["Type"] == brokerauth.SNSSubscriptionConfirmation {
			signed = append(signed, "SubscribeURL", "Token")
		}
		mutants := map[string]map[string]any{}
		for _, f := range signed {
			for _, at := range []string{"first", "last"} {
				m := clone(fields)
				m[f] = flipByte(m[f].(string), at == "last")
				mutants[f+" "+at+" byte"] = m
			}
		}
		swapped := clone(fields)
		if fields["SignatureVersion"] == "1" {
			swapped["SignatureVersion"] = "2"
		} else {
			swapped["SignatureVersion"] = "1"
		}
		mutants["SignatureVersion swapped"] = swapped
		sig := clone(fields)
		sig["Signature"] = flipBase64(sig["Signature"].(string))
		mutants["Signature changed"] = sig
		if fields["Type"] == brokerauth.SNSNotification {
			// A confirmation's string to sign has no Subject at all.
			subject := clone(fields)
			if _, ok := subject["Subject"]; ok {
				delete(subject, "Subject")
			} else {
				subject["Subject"] = "x"
			}
			mutants["Subject added or removed"] = subject
		}

		for what, fields := range mutants {
			b, _ := json.Marshal(fields)
			m, err := brokerauth.ParseSNSMessage(b)
			if err != nil {
				// A mutation the parser already refuses (an emptied or
				// renamed Type) also never verifies.
				if brokerauth.KindOf(err) != brokerauth.Malformed {
					t.Errorf("%s, %s: parse error %v is not Malformed", name, what, err)
				}
				continue
			}
			err = v.Verify(context.Background(), m)
			// A TopicArn that no longer names the certificate's region is
			// refused before the signature is even checked.
			if k := brokerauth.KindOf(err); k != brokerauth.Unauthenticated && !(strings.HasPrefix(what, "TopicArn") && k == brokerauth.Forbidden) {
				t.Errorf("%s, %s: Verify = %v, want Unauthenticated", name, what, err)
			}
		}

		// A certificate URL on any host but SNS's is refused before it is
		// fetched.
		before := len(certs.Hits())
		for _, u := range []string{
			"https://sns.us-east-1.amazonaws.com.evil.example/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem",
			"https://evil.example/sns.us-east-1.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem",
			"http://sns.us-east-1.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem",
			"https://sns.us-east-1.amazonaws.com:8443/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem",
			"https://xsns.us-east-1.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem",
			"https://sns.us-east-1.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.txt",
			"https://user@sns.us-east-1.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem",
		} {
			m := parse(t, body)
			m.SigningCertURL = u
			if err := v.Verify(context.Background(), m); brokerauth.KindOf(err) != brokerauth.Forbidden {
				t.Errorf("%s with SigningCertURL %s: Verify = %v, want Forbidden", name, u, err)
			}
		}
		if after := certs.Hits(); len(after) != before {
			t.Errorf("%s: a refused certificate URL was fetched: %v", name, after[before:])
		}
	}
}

func clone(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// flipByte changes one byte of s (its first or last) to another printable
// byte.
func flipByte(s string, last bool) string {
	b := []byte(s)
	i := 0
	if last {
		i = len(b) - 1
	}
	if b[i] == 'x' {
		b[i] = 'y'
	} else {
		b[i] = 'x'
	}
	return string(b)
}

// flipBase64 changes one character inside the signature, keeping it base64.
func flipBase64(s string) string {
	b := []byte(s)
	i := len(b) / 2
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}

func TestSNSCertificateUnavailableIsNotAForgery(t *testing.T) {
	t.Parallel()
	certs := &certFiles{down: true}
	clock := &fakeClock{now: time.Now()}
	v, err := brokerauth.NewSNSVerifier(brokerauth.SNSOptions{HTTPClient: &http.Client{Transport: certs}, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	m := parse(t, vectors(t)["notification-v2.json"])
	err = v.Verify(context.Background(), m)
	if brokerauth.KindOf(err) != brokerauth.Unavailable {
		t.Fatalf("Verify with the certificate host down = %v, want Unavailable", err)
	}
	// The failure is remembered briefly; once that has passed and the host
	// answers, it verifies.
	certs.mu.Lock()
	certs.down = false
	certs.mu.Unlock()
	clock.Advance(brokerauth.DefaultCertFailureTTL)
	if err := v.Verify(context.Background(), m); err != nil {
		t.Fatalf("Verify after the host came back = %v", err)
	}
	// A certificate URL on an SNS host that has no such file cannot be where
	// a genuine message's certificate is: the signature does not verify.
	m.SigningCertURL = "https://sns.us-east-2.amazonaws.com/SimpleNotificationService-0000.pem"
	if err := v.Verify(context.Background(), m); brokerauth.KindOf(err) != brokerauth.Unauthenticated {
		t.Fatalf("Verify with a missing certificate = %v, want Unauthenticated", err)
	}
}

func TestSNSUnsignedOrUnknownVersion(t *testing.T) {
	t.Parallel()
	v := newVerifier(t, &certFiles{})
	for _, mutate := range []func(m *brokerauth.SNSMessage){
		func(m *brokerauth.SNSMessage) { m.SignatureVersion = "" },
		func(m *brokerauth.SNSMessage) { m.SignatureVersion = "3" },
		func(m *brokerauth.SNSMessage) { m.Signature = "" },
		func(m *brokerauth.SNSMessage) { m.Signature = "not base64!" },
	} {
		m := parse(t, vectors(t)["notification-v1.json"])
		mutate(m)
		if err := v.Verify(context.Background(), m); brokerauth.KindOf(err) != brokerauth.Unauthenticated {
			t.Errorf("Verify = %v, want Unauthenticated", err)
		}
	}
}

func TestParseSNSMessageRequiresSignedFields(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		``, `[]`, `{}`, `{"Type":"Notification"}`, `{"Type":"Other","MessageId":"1"}`,
		`{"Type":"Notification","MessageId":"1","TopicArn":"a","Timestamp":"t"}`,
		`{"Type":"SubscriptionConfirmation","MessageId":"1","TopicArn":"a","Timestamp":"t","Message":"m","Token":"x"}`,
		`{"Type":"Notification","MessageId":"1","TopicArn":"a","Timestamp":"t","Message":"m"} {}`,
		`{"Type":"Notification","MessageId":1,"TopicArn":"a","Timestamp":"t","Message":"m"}`,
	} {
		if _, err := brokerauth.ParseSNSMessage([]byte(body)); brokerauth.KindOf(err) != brokerauth.Malformed {
			t.Errorf("ParseSNSMessage(%q) = %v, want Malformed", body, err)
		}
	}
	m, err := brokerauth.ParseSNSMessage([]byte(`{"Type":"Notification","MessageId":"1","TopicArn":"a","Timestamp":"t","Message":""}`))
	if err != nil || m.Subject != nil {
		t.Fatalf("empty Message, no Subject: %+v, %v", m, err)
	}
	if got, want := m.StringToSign(), "Message\n\nMessageId\n1\nTimestamp\nt\nTopicArn\na\nType\nNotification\n"; got != want {
		t.Errorf("StringToSign = %q, want %q", got, want)
	}
}

func TestStringToSignOrder(t *testing.T) {
	t.Parallel()
	m := parse(t, vectors(t)["subscription-confirmation-v1.json"])
	want := "Message\n" + m.Message + "\nMessageId\n" + m.MessageID + "\nSubscribeURL\n" + m.SubscribeURL +
		"\nTimestamp\n" + m.Timestamp + "\nToken\n" + m.Token + "\nTopicArn\n" + m.TopicArn +
		"\nType\nSubscriptionConfirmation\n"
	if got := m.StringToSign(); got != want {
		t.Errorf("StringToSign =\n%q\nwant\n%q", got, want)
	}
	n := parse(t, vectors(t)["notification-subject-v1.json"])
	want = "Message\n" + n.Message + "\nMessageId\n" + n.MessageID + "\nSubject\n" + *n.Subject +
		"\nTimestamp\n" + n.Timestamp + "\nTopicArn\n" + n.TopicArn + "\nType\nNotification\n"
	if got := n.StringToSign(); got != want {
		t.Errorf("StringToSign =\n%q\nwant\n%q", got, want)
	}
}
