package handlers

import (
	"context"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/tracecarrier"
)

// ResponseRecorder counts the statuses returned to brokers, and the
// deliveries refused as malformed by kind (envelope, identity,
// publish_time).
type ResponseRecorder interface {
	Response(ctx context.Context, b gate.Broker, route string, status int)
	Malformed(ctx context.Context, b gate.Broker, route, kind string)
}

// messagingSystem names each broker as OpenTelemetry's messaging conventions do.
var messagingSystem = map[gate.Broker]string{gate.BrokerPubSub: "gcp_pubsub", gate.BrokerSNS: "aws_sns"}

// deliveryParent picks the parent of a delivery's span, in this order:
//  1. the trace context the publisher attached to the message (Pub/Sub's
//     googclient_traceparent attribute, SNS's traceparent attribute), so the
//     trace runs from the publisher through the gateway to the downstream;
//  2. the push request's own traceparent header;
//  3. none: the delivery starts a new trace.
func (o *IngestOptions) deliveryParent(r *http.Request, msg *gate.Message) context.Context {
	ctx := r.Context()
	if o.Propagators == nil {
		return ctx
	}
	if msg != nil && msg.TraceParent != "" {
		carrier := propagation.MapCarrier{"traceparent": msg.TraceParent}
		if msg.TraceState != "" {
			carrier["tracestate"] = msg.TraceState
		}
		if pctx := o.Propagators.Extract(ctx, carrier); trace.SpanContextFromContext(pctx).IsValid() {
			return pctx
		}
	}
	return o.Propagators.Extract(ctx, tracecarrier.Header(r.Header))
}

// startDelivery starts the push request's server span. It is started once the
// message is decoded (its parent may be in the message), dated back to when
// the request arrived.
func (o *IngestOptions) startDelivery(r *http.Request, b gate.Broker, route *gate.Route, msg *gate.Message, arrived time.Time) (context.Context, trace.Span) {
	tracer := o.Tracer
	if tracer == nil {
		tracer = noop.NewTracerProvider().Tracer("")
	}
	name, spanName := "unknown", "process unknown"
	if route != nil {
		name, spanName = route.Name, o.spanNames[route.Name]
		if spanName == "" {
			spanName = "process " + name
		}
	}
	ctx, span := tracer.Start(o.deliveryParent(r, msg), spanName,
		trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(arrived))
	if !span.IsRecording() {
		// Not sampled: nothing would keep the attributes.
		return ctx, span
	}
	span.SetAttributes(
		attribute.String("messaging.system", messagingSystem[b]),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("http.request.method", r.Method),
		attribute.String("http.route", chi.RouteContext(r.Context()).RoutePattern()),
		attribute.String("ackgate.route", name),
	)
	if msg != nil {
		span.SetAttributes(
			attribute.String("messaging.destination.name", msg.Source),
			attribute.String("messaging.message.id", msg.MessageID))
		if b == gate.BrokerPubSub {
			if msg.OrderingKey != "" {
				span.SetAttributes(attribute.String("messaging.gcp_pubsub.message.ordering_key", msg.OrderingKey))
			}
			if msg.BrokerAttempt > 0 {
				span.SetAttributes(attribute.Int("messaging.gcp_pubsub.message.delivery_attempt", msg.BrokerAttempt))
			}
		}
	}
	return ctx, span
}

// endDelivery closes the span with the status the broker got.
func endDelivery(span trace.Span, out outcome, status int) {
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("http.response.status_code", status),
			attribute.String("ackgate.decision", string(out.decision)))
		if status >= 500 {
			span.SetStatus(codes.Error, out.reason)
		}
	}
	span.End()
}
