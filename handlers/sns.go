package handlers

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/gate"
)

// SNS request headers.
const (
	hdrSNSType      = "X-Amz-Sns-Message-Type"
	hdrSNSMessageID = "X-Amz-Sns-Message-Id"
	hdrSNSTopic     = "X-Amz-Sns-Topic-Arn"
	hdrSNSRaw       = "X-Amz-Sns-Rawdelivery"
)

// handleSNSPush takes SNS HTTP/S deliveries: notifications go through the
// gate like Pub/Sub pushes; subscription confirmations are confirmed (for
// listed topics) or refused, and recorded; unsubscribe confirmations are
// recorded only. Every nack is a 5xx: SNS counts anything from 200 to 499 as
// delivered.
func handleSNSPush(o *IngestOptions) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		arrived := time.Now()
		route, ok := o.routeFor(w, r, gate.BrokerSNS, arrived)
		if !ok {
			return
		}
		if route.Auth == gate.AuthBasic {
			if err := o.checkBasic(r, route); err != nil {
				challenge(w, route, err)
				o.refuse(w, r, gate.BrokerSNS, route, arrived, fromAuth(err))
				return
			}
		}
		body, err := readBody(w, r, o.MaxBodyBytes)
		if err != nil {
			o.refuse(w, r, gate.BrokerSNS, route, arrived, fromRejection(err))
			return
		}

		if strings.EqualFold(r.Header.Get(hdrSNSRaw), "true") {
			o.snsRaw(w, r, route, body, arrived)
			return
		}
		m, err := brokerauth.ParseSNSMessage(body)
		if err == nil {
			err = checkSNSHeaders(r.Header, m)
		}
		if err == nil {
			err = o.verifySNS(r.Context(), route, m)
		}
		if err != nil {
			o.refuse(w, r, gate.BrokerSNS, route, arrived, fromAuth(err))
			return
		}
		switch m.Type {
		case brokerauth.SNSSubscriptionConfirmation, brokerauth.SNSUnsubscribeConfirmation:
			o.snsSubscription(w, r, route, m, arrived)
			return
		}
		msg, err := snsToMessage(m, body)
		if err != nil {
			o.refuseMessage(w, r, gate.BrokerSNS, route, arrived, body, err)
			return
		}
		o.accept(w, r, route, msg, arrived)
	}
}

// verifySNS runs the route's authenticator on a JSON SNS message. Basic routes
// check the signature as well: the JSON form always carries one.
func (o *IngestOptions) verifySNS(ctx context.Context, route *gate.Route, m *brokerauth.SNSMessage) error {
	switch route.Auth {
	case gate.AuthNone:
		return nil
	case gate.AuthSNSSignature, gate.AuthBasic:
		if o.Auth.SNS == nil {
			return notConfigured("the SNS verifier")
		}
		return o.Auth.SNS.Verify(ctx, m)
	}
	return notConfigured("authenticator " + string(route.Auth) + " for sns")
}

// checkSNSHeaders requires the message type header to agree with the body, and
// the id and topic headers, when present, too.
func checkSNSHeaders(h http.Header, m *brokerauth.SNSMessage) error {
	malformed := func(reason string) error {
		return &brokerauth.Error{Kind: brokerauth.Malformed, Reason: reason}
	}
	switch typ := h.Get(hdrSNSType); {
	case typ == "":
		return malformed("x-amz-sns-message-type header is missing")
	case typ != m.Type:
		return malformed("x-amz-sns-message-type header disagrees with the body's Type")
	}
	if id := h.Get(hdrSNSMessageID); id != "" && id != m.MessageID {
		return malformed("x-amz-sns-message-id header disagrees with the body's MessageId")
	}
	if topic := h.Get(hdrSNSTopic); topic != "" && topic != m.TopicArn {
		return malformed("x-amz-sns-topic-arn header disagrees with the body's TopicArn")
	}
	return nil
}

// snsToMessage turns a verified notification into a broker-neutral message:
// the topic is the source, MessageId the message id, Message the data, the
// message attributes the attributes (binary values as SNS's base64), and the
// traceparent attribute the publisher's trace context.
func snsToMessage(m *brokerauth.SNSMessage, body []byte) (*gate.Message, error) {
	published, err := parsePublishTime(m.Timestamp)
	if err != nil {
		rej := badRequest("SNS Timestamp %v", err)
		rej.MessageID = m.MessageID
		return nil, rej
	}
	msg := &gate.Message{
		Broker: gate.BrokerSNS, Source: m.TopicArn, MessageID: m.MessageID,
		Data: []byte(m.Message), PublishTime: published, Envelope: body,
	}
	if len(m.MessageAttributes) > 0 {
		msg.Attributes = make(map[string]string, len(m.MessageAttributes))
		for k, a := range m.MessageAttributes {
			msg.Attributes[k] = a.Value
		}
		msg.TraceParent = msg.Attributes["traceparent"]
		msg.TraceState = msg.Attributes["tracestate"]
	}
	return msg, nil
}

// snsRaw takes a raw message delivery: the body is the message itself and
// the headers carry its id and topic. It has no signature, so only routes that
// opted in, with their own authenticator (checked before the body was read),
// accept it. Elsewhere it is a nack: the route may be about to opt in, and a
// 4xx would make SNS drop the message.
func (o *IngestOptions) snsRaw(w http.ResponseWriter, r *http.Request, route *gate.Route, body []byte, arrived time.Time) {
	if !route.RawDelivery || route.Auth != gate.AuthBasic {
		o.refuse(w, r, gate.BrokerSNS, route, arrived, outcome{decision: gate.Nack, reason: "raw message delivery is not enabled on this route"})
		return
	}
	msg, err := decodeSNSRaw(r.Header, body)
	if err != nil {
		o.refuseMessage(w, r, gate.BrokerSNS, route, arrived, body, err)
		return
	}
	// Raw routes authenticate with basic credentials, which config only
	// allows together with a non-empty list of topics.
	o.accept(w, r, route, msg, arrived)
}

// decodeSNSRaw reads a raw delivery's identity from its headers.
func decodeSNSRaw(h http.Header, body []byte) (*gate.Message, error) {
	if typ := h.Get(hdrSNSType); typ != brokerauth.SNSNotification {
		return nil, badRequest("raw delivery must be a Notification")
	}
	id, topic := h.Get(hdrSNSMessageID), h.Get(hdrSNSTopic)
	if id == "" || topic == "" {
		return nil, badRequest("raw delivery needs the x-amz-sns-message-id and x-amz-sns-topic-arn headers")
	}
	if len(id) > 256 || len(topic) > 512 {
		rej := badRequest("x-amz-sns-message-id or x-amz-sns-topic-arn is too long")
		rej.MessageID = id
		return nil, rej
	}
	return &gate.Message{Broker: gate.BrokerSNS, Source: topic, MessageID: id, Data: body, Envelope: body}, nil
}

// snsSubscription handles the two subscription messages. Confirmations are
// made only for topics the route lists, by a GET on the SubscribeURL after
// the allow-list check; every one is recorded before it is answered, and an
// answer that could not be recorded is a nack so that SNS sends it again.
func (o *IngestOptions) snsSubscription(w http.ResponseWriter, r *http.Request, route *gate.Route, m *brokerauth.SNSMessage, arrived time.Time) {
	ctx, span := o.startDelivery(r, gate.BrokerSNS, route, &gate.Message{Broker: gate.BrokerSNS, Source: m.TopicArn, MessageID: m.MessageID}, arrived)
	ev := &adminapi.SubscriptionEvent{
		Route: route.Name, TopicArn: m.TopicArn, MessageType: m.Type, MessageID: m.MessageID, ReceivedAt: arrived,
	}
	allowed := slices.Contains(route.Sources, m.TopicArn)
	var out outcome
	switch {
	case m.Type == brokerauth.SNSUnsubscribeConfirmation:
		ev.Outcome, ev.Reason = adminapi.SubscriptionRecorded, "recorded, not acted on"
		out = outcome{decision: gate.Ack, reason: ev.Reason}
		if !allowed {
			out = fromRejection(&Rejection{Status: http.StatusForbidden, Reason: "topic is not allowed on this route"})
		}
	case !allowed:
		ev.Outcome, ev.Reason = adminapi.SubscriptionRefused, "topic is not listed in the route's sources"
		out = fromRejection(&Rejection{Status: http.StatusForbidden, Reason: ev.Reason})
	case o.Auth.SNS == nil:
		ev.Outcome, ev.Reason = adminapi.SubscriptionConfirmFailed, "no SNS verifier is configured to confirm with"
		out = outcome{decision: gate.Nack, reason: ev.Reason}
	default:
		arn, err := o.Auth.SNS.Confirm(ctx, m)
		switch brokerauth.KindOf(err) {
		case 0:
			ev.Outcome, ev.SubscriptionArn = adminapi.SubscriptionConfirmed, arn
			out = outcome{decision: gate.Ack, reason: "subscription confirmed"}
		case brokerauth.Forbidden, brokerauth.Malformed:
			ev.Outcome = adminapi.SubscriptionRefused
			out = fromAuth(err)
			ev.Reason = out.reason
		default:
			ev.Outcome = adminapi.SubscriptionConfirmFailed
			out = fromAuth(err)
			ev.Reason = out.reason
			o.Logger.WarnContext(ctx, "subscription confirmation failed", "route", route.Name, "topic", m.TopicArn, "err", err)
		}
	}
	if o.Auth.Subscriptions == nil {
		out = outcome{decision: gate.Nack, reason: "no subscription log is configured"}
	} else if err := o.Auth.Subscriptions.Record(ctx, ev); err != nil {
		o.Logger.ErrorContext(ctx, "recording a subscription message failed", "route", route.Name, "topic", m.TopicArn, "err", err)
		out = outcome{decision: gate.Nack, reason: "subscription message could not be recorded"}
	}
	_, status := o.finish(ctx, w, gate.BrokerSNS, route, out)
	endDelivery(span, out, status)
}
