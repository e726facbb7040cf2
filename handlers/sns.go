package handlers

import (
	"context"
	"fmt"
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
		tk, ok := o.admit.enter(r.Context())
		if !ok {
			o.refuse(w, r, gate.BrokerSNS, route, arrived, atCapacity(gate.BrokerSNS))
			return
		}
		defer tk.leave()
		if route.Auth == gate.AuthBasic {
			if err := o.checkBasic(r, route); err != nil {
				challenge(w, route, err)
				o.refuse(w, r, gate.BrokerSNS, route, arrived, fromAuth(err))
				return
			}
		}
		body, err := o.admitBody(w, r, &tk)
		if err != nil {
			o.refuse(w, r, gate.BrokerSNS, route, arrived, bodyRefusal(gate.BrokerSNS, err))
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
		// Before any fetch: the route's topics name the regions whose SNS
		// endpoints it fetches certificates from (config requires them).
		if !brokerauth.RegionAllowed(m.TopicArn, route.Sources) {
			return &brokerauth.Error{Kind: brokerauth.Forbidden, Reason: "topic is not in a region of this route's topics; nothing was fetched for it"}
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

// subscriptionClaimLease is how long one copy of a subscription message may
// hold it before another copy takes over: the confirmation GET is bounded by
// the verifier's fetch timeout (5 s by default) and SNS waits 15 s for an
// answer, so a copy still holding it after 30 s has died.
const subscriptionClaimLease = 30 * time.Second

// snsSubscription handles the two subscription messages. Confirmations are
// made only for topics the route lists, by a GET on the SubscribeURL after
// the allow-list check, and only while the message is fresh (its signed
// Timestamp within the configured age); every one is recorded before it is
// answered, and an answer that could not be recorded is a nack so that SNS
// sends it again. Each MessageId is acted on once: a copy of a message
// already handled is answered from its record.
func (o *IngestOptions) snsSubscription(w http.ResponseWriter, r *http.Request, route *gate.Route, m *brokerauth.SNSMessage, arrived time.Time) {
	ctx, span := o.startDelivery(r, gate.BrokerSNS, route, &gate.Message{Broker: gate.BrokerSNS, Source: m.TopicArn, MessageID: m.MessageID}, arrived)
	out := o.subscriptionOutcome(ctx, route, m, arrived)
	_, status := o.finish(ctx, w, gate.BrokerSNS, route, out)
	endDelivery(span, out, status)
}

func (o *IngestOptions) subscriptionOutcome(ctx context.Context, route *gate.Route, m *brokerauth.SNSMessage, arrived time.Time) outcome {
	if o.Auth.Subscriptions == nil {
		return outcome{decision: gate.Nack, reason: "no subscription log is configured"}
	}
	sent, err := time.Parse(time.RFC3339Nano, m.Timestamp)
	if err != nil {
		return fromRejection(badRequest("SNS Timestamp is not an RFC 3339 time"))
	}
	allowed := slices.Contains(route.Sources, m.TopicArn)
	claim, err := o.Auth.Subscriptions.Claim(ctx, route.Name, m.MessageID, subscriptionClaimLease)
	if err != nil {
		o.Logger.ErrorContext(ctx, "claiming a subscription message failed", "route", route.Name, "topic", m.TopicArn, "err", err)
		return outcome{decision: gate.Nack, reason: "subscription message could not be recorded"}
	}
	if !claim.Owned {
		return copyOutcome(claim, allowed)
	}
	ev := &adminapi.SubscriptionEvent{
		Route: route.Name, TopicArn: m.TopicArn, MessageType: m.Type, MessageID: m.MessageID, ReceivedAt: arrived,
	}
	out := o.actOnSubscription(ctx, route, m, allowed, arrived.Sub(sent), ev)
	if err := o.Auth.Subscriptions.Settle(ctx, claim, ev); err != nil {
		o.Logger.ErrorContext(ctx, "recording a subscription message failed", "route", route.Name, "topic", m.TopicArn, "err", err)
		return outcome{decision: gate.Nack, reason: "subscription message could not be recorded"}
	}
	return out
}

// copyOutcome answers a copy of a subscription message that another copy
// claimed. A confirmed or recorded message is acked without a new call or
// record: it has been handled, and SNS's own retry of it (when an earlier
// answer was lost) must hear "delivered". A refused one is refused again. One
// still being handled is a nack, so that SNS would ask again later.
func copyOutcome(c adminapi.SubscriptionClaim, allowed bool) outcome {
	switch c.Outcome {
	case adminapi.SubscriptionConfirmed:
		return outcome{decision: gate.Ack, reason: "subscription already confirmed for this message id; not confirmed again"}
	case adminapi.SubscriptionRecorded:
		if !allowed {
			return fromRejection(&Rejection{Status: http.StatusForbidden, Reason: "topic is not allowed on this route"})
		}
		return outcome{decision: gate.Ack, reason: "already recorded, not acted on"}
	case adminapi.SubscriptionRefused:
		return fromRejection(&Rejection{Status: http.StatusForbidden, Reason: gate.Bound("already refused: "+c.Reason, 200)})
	}
	return outcome{decision: gate.Nack, reason: "another copy of this subscription message is being handled"}
}

// actOnSubscription decides, and for a fresh confirmation from a listed topic
// makes, the confirmation, and fills in ev's outcome.
func (o *IngestOptions) actOnSubscription(ctx context.Context, route *gate.Route, m *brokerauth.SNSMessage, allowed bool, age time.Duration, ev *adminapi.SubscriptionEvent) outcome {
	maxAge := o.Auth.ConfirmationMaxAge
	if maxAge <= 0 {
		maxAge = DefaultConfirmationMaxAge
	}
	switch {
	case m.Type == brokerauth.SNSUnsubscribeConfirmation:
		ev.Outcome, ev.Reason = adminapi.SubscriptionRecorded, "recorded, not acted on"
		if !allowed {
			return fromRejection(&Rejection{Status: http.StatusForbidden, Reason: "topic is not allowed on this route"})
		}
		return outcome{decision: gate.Ack, reason: ev.Reason}
	case !allowed:
		ev.Outcome, ev.Reason = adminapi.SubscriptionRefused, "topic is not listed in the route's sources"
		return fromRejection(&Rejection{Status: http.StatusForbidden, Reason: ev.Reason})
	case age > maxAge:
		// Genuine, since it verified, but older than any retry of SNS's:
		// a replay of a captured message.
		ev.Outcome = adminapi.SubscriptionRefused
		ev.Reason = fmt.Sprintf("confirmation is older than %s by its signed Timestamp", maxAge)
		return fromRejection(&Rejection{Status: http.StatusForbidden, Reason: ev.Reason})
	case o.Auth.SNS == nil:
		ev.Outcome, ev.Reason = adminapi.SubscriptionConfirmFailed, "no SNS verifier is configured to confirm with"
		return outcome{decision: gate.Nack, reason: ev.Reason}
	}
	arn, err := o.Auth.SNS.Confirm(ctx, m)
	switch brokerauth.KindOf(err) {
	case 0:
		ev.Outcome, ev.SubscriptionArn = adminapi.SubscriptionConfirmed, arn
		return outcome{decision: gate.Ack, reason: "subscription confirmed"}
	case brokerauth.Forbidden, brokerauth.Malformed:
		out := fromAuth(err)
		ev.Outcome, ev.Reason = adminapi.SubscriptionRefused, out.reason
		return out
	default:
		out := fromAuth(err)
		ev.Outcome, ev.Reason = adminapi.SubscriptionConfirmFailed, out.reason
		o.Logger.WarnContext(ctx, "subscription confirmation failed", "route", route.Name, "topic", m.TopicArn, "err", err)
		return out
	}
}
