package brokerauth_test

import (
	"context"
	"testing"

	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/gate"
)

// FuzzSNSVerify feeds the verifier SNS bodies derived from the nine real
// vectors. Nothing may panic, every failure must be one of the package's
// kinds, and nothing the fuzzer makes may verify unless it signs exactly what
// one of the vectors signed: a changed signed field can never pass. What
// verifies is storable: its identity fields are text Postgres can hold.
func FuzzSNSVerify(f *testing.F) {
	certs := &certFiles{}
	v := newVerifier(f, certs)
	signed := map[string]bool{}
	for _, body := range vectors(f) {
		f.Add(body)
		m := parse(f, body)
		signed[m.StringToSign()] = true
	}
	f.Add([]byte(`{"Type":"Notification","MessageId":"1","TopicArn":"a","Timestamp":"t","Message":"m","SignatureVersion":"1","Signature":"AAAA","SigningCertURL":"https://sns.us-east-1.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem"}`))
	// Identity fields Postgres text cannot hold: a NUL byte, invalid UTF-8.
	f.Add([]byte(`{"Type":"Notification","MessageId":"1\u0000","TopicArn":"a","Timestamp":"2026-01-01T00:00:00Z","Message":"m","SignatureVersion":"1","Signature":"AAAA","SigningCertURL":"https://sns.us-east-1.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem"}`))
	f.Add([]byte("{\"Type\":\"Notification\",\"MessageId\":\"1\",\"TopicArn\":\"a\xff\",\"Timestamp\":\"2026-01-01T00:00:00Z\",\"Message\":\"m\",\"SignatureVersion\":\"2\",\"Signature\":\"AAAA\",\"SigningCertURL\":\"https://sns.us-east-1.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem\"}"))
	f.Add([]byte(`{"Type":"Notification","MessageId":"1","TopicArn":"arn:aws:sns:us-east-1:1:t\u0000","Timestamp":"2026-01-01T00:00:00Z","Message":"m","SignatureVersion":"1","Signature":"AAAA","SigningCertURL":"https://sns.us-east-1.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem"}`))
	// What decoding would replace with U+FFFD, and NUL: in MessageId,
	// TopicArn, the Message a key pointer reads, and an (unsigned)
	// attribute value.
	for _, field := range []string{`"MessageId":"c1-\udcff"`, "\"MessageId\":\"c1-ff-\xfe\"", `"TopicArn":"arn:aws:sns:us-east-1:1:\ud800"`,
		`"MessageId":"1","Message":"{\"order\":{\"id\":\"\udcfe\"}}"`, "\"MessageId\":\"1\",\"Message\":\"\xff\"",
		`"MessageId":"1","MessageAttributes":{"k":{"Type":"String","Value":"\udbff"}}`,
		`"MessageId":"1","MessageAttributes":{"k":{"Type":"String","Value":"\u0000"}}`,
		`"MessageId":"1","Message":"{\"order\":{\"id\":\"\\u0000\"}}"`,
		"\"MessageId\":\"1\",\"MessageAttributes\":{\"k\":{\"Type\":\"String\",\"Value\":\"\xfe\"}}"} {
		f.Add([]byte(`{"Type":"Notification",` + field + `,"TopicArn":"a","Timestamp":"2026-01-01T00:00:00Z","Message":"m","SignatureVersion":"1","Signature":"AAAA","SigningCertURL":"https://sns.us-east-1.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem"}`))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := brokerauth.ParseSNSMessage(body)
		if err != nil {
			if brokerauth.KindOf(err) != brokerauth.Malformed {
				t.Fatalf("parse error of kind %v: %v", brokerauth.KindOf(err), err)
			}
			return
		}
		// Parsed strings are the body's, byte for byte: nothing replaced.
		if why := gate.ExactJSON(body); why != "" {
			t.Fatalf("parsed a body that %s", why)
		}
		err = v.Verify(context.Background(), m)
		if err != nil {
			if brokerauth.KindOf(err) == 0 {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		s := m.StringToSign()
		if !signed[s] && !(m.Subject != nil && *m.Subject == "") {
			t.Fatalf("a message no vector signed verified: %q", s)
		}
		for name, v := range map[string]string{"MessageId": m.MessageID, "TopicArn": m.TopicArn, "Timestamp": m.Timestamp} {
			if why := gate.Unstorable(v); why != "" {
				t.Fatalf("verified, but its %s %s: %q", name, why, v)
			}
		}
	})
}
