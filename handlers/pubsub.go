package handlers

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/jsonerr"
)

// pushEnvelope is Pub/Sub's wrapped push body. Both spellings of the id and
// publish time are sent by Google; either may be the only one present.
type pushEnvelope struct {
	Message *struct {
		Data         *string           `json:"data"`
		Attributes   map[string]string `json:"attributes"`
		MessageID    string            `json:"messageId"`
		MessageIDAlt string            `json:"message_id"`
		PublishTime  string            `json:"publishTime"`
		PublishAlt   string            `json:"publish_time"`
		OrderingKey  string            `json:"orderingKey"`
	} `json:"message"`
	Subscription    string `json:"subscription"`
	DeliveryAttempt *int   `json:"deliveryAttempt"`
}

// decodePubSub turns a wrapped push body into a broker-neutral message. Every
// failure is a *Rejection with a bounded reason: a body we cannot read never
// becomes an operation (only a poison record) and is never acked as done.
func decodePubSub(body []byte) (*gate.Message, error) {
	// Checked before decoding, which would replace what it cannot read
	// with U+FFFD and make two message ids, sources or attribute keys one.
	// Pub/Sub writes its envelopes as UTF-8 JSON; no genuine one fails.
	if why := gate.ExactJSON(body); why != "" {
		return nil, badRequest("body %s, so its ids and attributes cannot be read exactly", why)
	}
	var env pushEnvelope
	if rej := decodeEnvelope(body, &env); rej != nil {
		return nil, rej
	}
	m := env.Message
	if m == nil {
		return nil, badRequest("envelope has no message")
	}
	if env.Subscription == "" {
		return nil, badRequest("envelope has no subscription")
	}
	id := m.MessageID
	if id == "" {
		id = m.MessageIDAlt
	} else if m.MessageIDAlt != "" && m.MessageIDAlt != id {
		return nil, badRequest("messageId and message_id disagree")
	}
	if id == "" {
		return nil, badRequest("message has no messageId")
	}
	msg, rej := decodePubSubMessage(&env, id, body)
	if rej != nil {
		rej.MessageID = id
		return nil, rej
	}
	return msg, nil
}

// decodeEnvelope decodes body, which must be one JSON value and nothing
// after it, into env. It reads the body in place (json.Unmarshal): a
// streaming decoder would first copy it into a buffer of its own, grown from
// 512 bytes. Unmarshal reports a value followed by more data as a syntax
// error at the first byte after the value; that case is told apart from a
// broken envelope by decoding the value before it, so the answers are those
// of a decoder that reads one value and then looks for the end.
func decodeEnvelope(body []byte, env *pushEnvelope) *Rejection {
	err := json.Unmarshal(body, env)
	if err == nil {
		return nil
	}
	var syn *json.SyntaxError
	if errors.As(err, &syn) && syn.Error() == "unexpected end of JSON input" {
		// The body ended inside the value, or held none.
		err = io.ErrUnexpectedEOF
	} else if errors.As(err, &syn) && syn.Offset > 0 && syn.Offset <= int64(len(body)) {
		if value := body[:syn.Offset-1]; len(bytes.TrimSpace(value)) > 0 && json.Valid(value) {
			*env = pushEnvelope{}
			if err := json.Unmarshal(value, env); err != nil {
				return badRequest("body is not a Pub/Sub push envelope: %s", jsonerr.Describe(err))
			}
			return badRequest("body has data after the envelope")
		}
	}
	return badRequest("body is not a Pub/Sub push envelope: %s", jsonerr.Describe(err))
}

// decodePubSubMessage is decodePubSub once the message id is known.
func decodePubSubMessage(env *pushEnvelope, id string, body []byte) (*gate.Message, *Rejection) {
	m := env.Message
	var data []byte
	if m.Data != nil {
		var err error
		if data, err = base64.StdEncoding.DecodeString(*m.Data); err != nil {
			return nil, badRequest("message.data is not base64")
		}
	}
	if len(data) == 0 && len(m.Attributes) == 0 {
		return nil, badRequest("message has neither data nor attributes")
	}
	msg := &gate.Message{
		Broker: gate.BrokerPubSub, Source: env.Subscription, MessageID: id,
		Data: data, Attributes: m.Attributes, OrderingKey: m.OrderingKey, Envelope: body,
		TraceParent: m.Attributes["googclient_traceparent"], TraceState: m.Attributes["googclient_tracestate"],
	}
	if pt := firstNonEmpty(m.PublishTime, m.PublishAlt); pt != "" {
		t, err := parsePublishTime(pt)
		if err != nil {
			return nil, badRequest("message.publishTime %v", err)
		}
		msg.PublishTime = t
	}
	if env.DeliveryAttempt != nil {
		if *env.DeliveryAttempt < 0 {
			return nil, badRequest("deliveryAttempt is negative")
		}
		if *env.DeliveryAttempt > math.MaxInt32 {
			// Pub/Sub counts up to its dead-letter limit of 100; the ledger
			// keeps the count as a 32-bit integer.
			return nil, badRequest("deliveryAttempt is larger than %d", math.MaxInt32)
		}
		msg.BrokerAttempt = *env.DeliveryAttempt
	}
	return msg, nil
}

// earliestPublishTime is older than any broker: a publish time before it is
// not a broker's, and the ledger need not hold it (Postgres has no year 0).
var earliestPublishTime = time.Unix(0, 0)

// parsePublishTime reads a broker's RFC 3339 publish time, which the ledger
// keeps beside the time the delivery arrived.
func parsePublishTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, errors.New("is not an RFC 3339 time")
	}
	if t.Before(earliestPublishTime) {
		return time.Time{}, errors.New("is before 1970")
	}
	return t, nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// badRequest refuses a message that is malformed in itself: a poison
// message, which no redelivery can mend.
func badRequest(format string, args ...any) *Rejection {
	return &Rejection{Status: http.StatusBadRequest, Reason: fmt.Sprintf(format, args...), Poison: true}
}
