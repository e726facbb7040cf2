package handlers

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/textproto"
	"strings"
	"unicode/utf8"

	"github.com/ackgate/ackgate/gate"
)

// Headers of an unwrapped push with write metadata.
const (
	hdrPubSubSubscription = "X-Goog-Pubsub-Subscription-Name"
	hdrPubSubMessageID    = "X-Goog-Pubsub-Message-Id"
	hdrPubSubPublishTime  = "X-Goog-Pubsub-Publish-Time"
	hdrPubSubOrderingKey  = "X-Goog-Pubsub-Ordering-Key"
)

// decodePubSubRequest decodes a push body in the route's form.
func decodePubSubRequest(h http.Header, route *gate.Route, body []byte) (*gate.Message, error) {
	if route.PubSubMode == gate.PubSubUnwrapped {
		return decodePubSubUnwrapped(h, route, body)
	}
	return decodePubSub(body)
}

// notAttributeHeaders are request headers that transports, proxies and
// Google's push service add; they are never taken for message attributes
// unless the route names them.
var notAttributeHeaders = map[string]bool{
	"Accept": true, "Accept-Encoding": true, "Accept-Language": true, "Authorization": true,
	"Baggage": true, "Cache-Control": true, "Connection": true, "Content-Encoding": true,
	"Content-Length": true, "Content-Type": true, "Cookie": true, "Expect": true, "Forwarded": true,
	"From": true, "Host": true, "Keep-Alive": true, "Origin": true, "Pragma": true,
	"Proxy-Authorization": true, "Proxy-Connection": true, "Referer": true, "Te": true,
	"Traceparent": true, "Tracestate": true, "Trailer": true, "Transfer-Encoding": true,
	"Upgrade": true, "User-Agent": true, "Via": true, "X-Real-Ip": true, "X-Request-Id": true,
}

var notAttributePrefixes = []string{"X-Forwarded-", "X-Goog-", "X-Cloud-Trace-", "X-Envoy-", "X-Amzn-", "Sec-", "Cf-"}

// declaredAttributes are the attribute names a route's identity, fingerprint
// or privacy depend on, plus the trace context attributes. Headers matching
// them (case-insensitively, since header names are) take the route's
// spelling, so the unwrapped form identifies and fingerprints a message
// exactly as the wrapped form does.
func declaredAttributes(route *gate.Route) map[string]string {
	names := map[string]string{}
	add := func(n string) {
		if n != "" {
			names[textproto.CanonicalMIMEHeaderKey(n)] = n
		}
	}
	if route.Key.Kind == gate.KeyAttribute {
		add(route.Key.Name)
	}
	for _, a := range route.Fingerprint.Attributes {
		add(a)
	}
	for _, a := range route.Private {
		if !strings.HasPrefix(a, "/") { // a JSON pointer into the data, not an attribute
			add(a)
		}
	}
	add("googclient_traceparent")
	add("googclient_tracestate")
	return names
}

// decodePubSubUnwrapped reads an unwrapped push: the body is the message data,
// the x-goog-pubsub-* headers its metadata, and other headers its attributes.
// Attributes the route names keep the route's spelling; any other attribute
// is named in lower case, because HTTP does not keep a header name's case.
// The message's Envelope is the equivalent wrapped envelope, so envelope-mode
// downstreams see one shape whichever form the subscription uses.
func decodePubSubUnwrapped(h http.Header, route *gate.Route, body []byte) (*gate.Message, error) {
	sub, id := h.Get(hdrPubSubSubscription), h.Get(hdrPubSubMessageID)
	if sub == "" || id == "" {
		// The subscription's configuration, not the message: every message
		// would come so until write metadata is on, and none is poison.
		rej := badRequest("unwrapped push without the %s and %s headers; enable write metadata on the subscription",
			strings.ToLower(hdrPubSubSubscription), strings.ToLower(hdrPubSubMessageID))
		rej.Poison = false
		return nil, rej
	}
	msg, rej := decodeUnwrappedMessage(h, route, body, sub, id)
	if rej != nil {
		rej.MessageID = id
		return nil, rej
	}
	return msg, nil
}

// decodeUnwrappedMessage is decodePubSubUnwrapped once the subscription and
// message id are known.
func decodeUnwrappedMessage(h http.Header, route *gate.Route, body []byte, sub, id string) (*gate.Message, *Rejection) {
	if len(h.Values(hdrPubSubSubscription)) > 1 || len(h.Values(hdrPubSubMessageID)) > 1 {
		return nil, badRequest("unwrapped push repeats its subscription or message id header")
	}
	declared := declaredAttributes(route)
	var attrs map[string]string
	for key, values := range h {
		canon := textproto.CanonicalMIMEHeaderKey(key)
		name, isDeclared := declared[canon]
		if !isDeclared {
			if notAttributeHeaders[canon] || hasAnyPrefix(canon, notAttributePrefixes) {
				continue
			}
			name = strings.ToLower(key)
		}
		if len(values) != 1 {
			return nil, badRequest("attribute header %q is repeated", gate.Bound(name, 64))
		}
		if attrs == nil {
			attrs = map[string]string{}
		}
		if _, dup := attrs[name]; dup {
			return nil, badRequest("attribute %q arrives in more than one header", gate.Bound(name, 64))
		}
		attrs[name] = values[0]
	}
	if len(body) == 0 && len(attrs) == 0 {
		return nil, badRequest("message has neither data nor attributes")
	}
	// Pub/Sub's metadata and attributes are UTF-8 strings (the wrapped form
	// carries them in JSON); anything else did not come from Pub/Sub, and
	// could not mean the same as any wrapped message.
	texts := []string{sub, id, h.Get(hdrPubSubOrderingKey), h.Get(hdrPubSubPublishTime)}
	for k, v := range attrs {
		texts = append(texts, k, v)
	}
	for _, s := range texts {
		if !utf8.ValidString(s) {
			return nil, badRequest("unwrapped push metadata or attributes are not UTF-8")
		}
	}
	msg := &gate.Message{
		Broker: gate.BrokerPubSub, Source: sub, MessageID: id, Data: body, Attributes: attrs,
		OrderingKey: h.Get(hdrPubSubOrderingKey),
		TraceParent: attrs["googclient_traceparent"], TraceState: attrs["googclient_tracestate"],
	}
	publishTime := h.Get(hdrPubSubPublishTime)
	if publishTime != "" {
		t, err := parsePublishTime(publishTime)
		if err != nil {
			return nil, badRequest("%s %v", strings.ToLower(hdrPubSubPublishTime), err)
		}
		msg.PublishTime = t
	}
	env, err := json.Marshal(map[string]any{
		"message": map[string]any{
			"data": base64.StdEncoding.EncodeToString(body), "attributes": attrs,
			"messageId": id, "publishTime": publishTime, "orderingKey": msg.OrderingKey,
		},
		"subscription": sub,
	})
	if err != nil {
		return nil, badRequest("message cannot be re-enveloped")
	}
	msg.Envelope = env
	return msg, nil
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
