package brokerauth

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/jsonerr"
)

// SNS message types.
const (
	SNSNotification             = "Notification"
	SNSSubscriptionConfirmation = "SubscriptionConfirmation"
	SNSUnsubscribeConfirmation  = "UnsubscribeConfirmation"
)

// SNSMessage is an SNS HTTP/S delivery body as it was signed. Subject is a
// pointer because a Notification's string to sign includes it only when the
// key is present.
type SNSMessage struct {
	Type              string
	MessageID         string
	TopicArn          string
	Subject           *string
	Message           string
	Timestamp         string
	SignatureVersion  string
	Signature         string
	SigningCertURL    string
	SubscribeURL      string
	Token             string
	UnsubscribeURL    string
	MessageAttributes map[string]SNSAttribute
}

// SNSAttribute is one message attribute as SNS writes it into the JSON body.
// Binary values arrive base64-encoded in Value.
type SNSAttribute struct {
	Type  string `json:"Type"`
	Value string `json:"Value"`
}

// snsWire is the body as decoded: pointers tell an absent key from an empty
// value, which the string to sign depends on.
type snsWire struct {
	Type              *string                 `json:"Type"`
	MessageID         *string                 `json:"MessageId"`
	TopicArn          *string                 `json:"TopicArn"`
	Subject           *string                 `json:"Subject"`
	Message           *string                 `json:"Message"`
	Timestamp         *string                 `json:"Timestamp"`
	SignatureVersion  *string                 `json:"SignatureVersion"`
	Signature         *string                 `json:"Signature"`
	SigningCertURL    *string                 `json:"SigningCertURL"`
	SubscribeURL      *string                 `json:"SubscribeURL"`
	Token             *string                 `json:"Token"`
	UnsubscribeURL    *string                 `json:"UnsubscribeURL"`
	MessageAttributes map[string]SNSAttribute `json:"MessageAttributes"`
}

// ParseSNSMessage decodes an SNS HTTP/S body and checks that every field its
// type signs is there. It does not verify anything; see SNSVerifier.Verify.
// Failures are *Error of kind Malformed.
func ParseSNSMessage(body []byte) (*SNSMessage, error) {
	// Checked before decoding, which would replace what it cannot read with
	// U+FFFD: two different ids or attribute values would decode as one, and
	// MessageAttributes are not signed. SNS writes UTF-8 JSON.
	if why := gate.ExactJSON(body); why != "" {
		return nil, fail(Malformed, nil, "body %s, so its fields cannot be read exactly", why)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var w snsWire
	if err := dec.Decode(&w); err != nil {
		return nil, fail(Malformed, err, "body is not an SNS message: %s", jsonerr.Describe(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fail(Malformed, nil, "body has data after the SNS message")
	}
	m := &SNSMessage{
		Type: deref(w.Type), MessageID: deref(w.MessageID), TopicArn: deref(w.TopicArn),
		Subject: w.Subject, Message: deref(w.Message), Timestamp: deref(w.Timestamp),
		SignatureVersion: deref(w.SignatureVersion), Signature: deref(w.Signature),
		SigningCertURL: deref(w.SigningCertURL), SubscribeURL: deref(w.SubscribeURL),
		Token: deref(w.Token), UnsubscribeURL: deref(w.UnsubscribeURL),
		MessageAttributes: w.MessageAttributes,
	}
	required := map[string]*string{
		"Type": w.Type, "MessageId": w.MessageID, "TopicArn": w.TopicArn, "Message": w.Message,
		"Timestamp": w.Timestamp,
	}
	switch m.Type {
	case SNSNotification:
	case SNSSubscriptionConfirmation, SNSUnsubscribeConfirmation:
		required["SubscribeURL"], required["Token"] = w.SubscribeURL, w.Token
	case "":
		return nil, fail(Malformed, nil, "SNS message has no Type")
	default:
		return nil, fail(Malformed, nil, "SNS message Type %q is not Notification, SubscriptionConfirmation or UnsubscribeConfirmation", gate.Bound(m.Type, 40))
	}
	for _, name := range []string{"Type", "MessageId", "TopicArn", "Message", "Timestamp", "SubscribeURL", "Token"} {
		v, needed := required[name]
		if !needed {
			continue
		}
		if v == nil {
			return nil, fail(Malformed, nil, "SNS %s has no %s", m.Type, name)
		}
		if *v == "" && name != "Message" {
			return nil, fail(Malformed, nil, "SNS %s has an empty %s", m.Type, name)
		}
	}
	return m, nil
}

// StringToSign is what SNS signs for m: "Name\nvalue\n" for each signed field
// in the fixed order of its type. A Notification's Subject is included only
// when present.
func (m *SNSMessage) StringToSign() string {
	return m.stringToSign(m.Subject != nil)
}

func (m *SNSMessage) stringToSign(withSubject bool) string {
	var b strings.Builder
	field := func(name, value string) {
		b.WriteString(name)
		b.WriteByte('\n')
		b.WriteString(value)
		b.WriteByte('\n')
	}
	field("Message", m.Message)
	field("MessageId", m.MessageID)
	if m.Type == SNSNotification {
		if withSubject && m.Subject != nil {
			field("Subject", *m.Subject)
		}
	} else {
		field("SubscribeURL", m.SubscribeURL)
	}
	field("Timestamp", m.Timestamp)
	if m.Type != SNSNotification {
		field("Token", m.Token)
	}
	field("TopicArn", m.TopicArn)
	field("Type", m.Type)
	return b.String()
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
