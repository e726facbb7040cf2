// Package handlers is the gateway's HTTP surface: broker envelopes in, status
// codes out, plus the admin API. Handlers decode, authenticate, call the gate
// and map its outcome to a status; the rules live in gate/.
package handlers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackgate/ackgate/gate"
)

// Deliverer is the gate as the ingest handlers see it.
type Deliverer interface {
	Deliver(ctx context.Context, route *gate.Route, msg *gate.Message) (*gate.Result, error)
}

// Afterward takes a result's post-response work once the response is out.
// Queue takes it without the caller when it can (gate.AfterAnswer queues
// it); Finish takes it in any case, running it under ctx when it cannot be
// queued. The handler tries Queue first so that it builds the bounded
// context Finish needs only for work that may run on its goroutine.
type Afterward interface {
	Queue(res *gate.Result, sent bool) bool
	Finish(ctx context.Context, res *gate.Result, sent bool)
}

// IngestOptions wires the ingest listener.
type IngestOptions struct {
	Gate   Deliverer
	Routes map[string]*gate.Route
	// MaxBodyBytes caps a push body; larger requests are refused before decoding.
	MaxBodyBytes int64
	// Ready reports whether the dependencies answer and the schema is current.
	Ready  func(ctx context.Context) error
	Logger *slog.Logger
	// FinishTimeout bounds post-ack bookkeeping per delivery when it runs
	// on the delivery's own goroutine.
	FinishTimeout time.Duration
	// After, when set, takes the post-ack bookkeeping off the delivery's
	// goroutine (gate.AfterAnswer); nil runs it there, after the response.
	After Afterward
	// Tracer, Propagators and Metrics are optional: the delivery's server
	// span, where its parent comes from, and the count of statuses returned.
	Tracer      trace.Tracer
	Propagators propagation.TextMapPropagator
	Metrics     ResponseRecorder
	// Auth authenticates deliveries on routes whose auth is not none (auth.go).
	Auth BrokerAuth
	// MaxClockSkew is how far a Pub/Sub publishTime may be ahead of Now; a
	// later one is malformed. Zero does not check. Now defaults to time.Now.
	MaxClockSkew time.Duration
	Now          func() time.Time
	// Poison keeps messages without a usable identity (poison.go); without
	// it they are only refused.
	Poison PoisonLog
	// MaxInFlight bounds the deliveries worked on at once and
	// MaxBodyBytesInFlight the bytes of push bodies they hold
	// (admission.go); a delivery past either waits up to AdmissionWait for
	// room, then is nacked as overloaded. Zero sets no bound.
	MaxInFlight          int
	MaxBodyBytesInFlight int64
	AdmissionWait        time.Duration

	admit *admission
	// spanNames are the delivery spans' names per route, built once.
	spanNames map[string]string
}

// NewIngest returns the ingest listener's handler. The admin API is never
// mounted here: brokers reach this listener, operators the other.
func NewIngest(o IngestOptions) http.Handler {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.FinishTimeout == 0 {
		o.FinishTimeout = 5 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.spanNames = make(map[string]string, len(o.Routes))
	for name := range o.Routes {
		o.spanNames[name] = "process " + name
	}
	o.admit = newAdmission(o.MaxInFlight, o.MaxBodyBytesInFlight, o.MaxBodyBytes, o.AdmissionWait)
	r := chi.NewRouter()
	addIngestRoutes(r, &o)
	return r
}

func handleHealthz() http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}
}

func handleReadyz(o *IngestOptions) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if o.Ready != nil {
			if err := o.Ready(ctx); err != nil {
				o.Logger.WarnContext(ctx, "not ready", "err", err)
				writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": gate.Bound(err.Error(), 200)})
				return
			}
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	}
}

func handlePubSubPush(o *IngestOptions) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		arrived := time.Now()
		route, ok := o.routeFor(w, r, gate.BrokerPubSub, arrived)
		if !ok {
			return
		}
		tk, ok := o.admit.enter(r.Context())
		if !ok {
			o.refuse(w, r, gate.BrokerPubSub, route, arrived, atCapacity(gate.BrokerPubSub))
			return
		}
		defer tk.leave()
		if err := o.authenticatePubSub(r, route); err != nil {
			challenge(w, route, err)
			o.refuse(w, r, gate.BrokerPubSub, route, arrived, fromAuth(err))
			return
		}
		body, err := o.admitBody(w, r, &tk)
		if err != nil {
			o.refuse(w, r, gate.BrokerPubSub, route, arrived, bodyRefusal(gate.BrokerPubSub, err))
			return
		}
		msg, err := decodePubSubRequest(r.Header, route, body)
		if err != nil {
			o.refuseMessage(w, r, gate.BrokerPubSub, route, arrived, body, err)
			return
		}
		if out, ok := o.checkPublishTime(msg); !ok {
			o.refuse(w, r, gate.BrokerPubSub, route, arrived, out)
			return
		}
		o.accept(w, r, route, msg, arrived)
	}
}

// checkPublishTime refuses a Pub/Sub message published further ahead of this
// gateway's clock than MaxClockSkew. Pub/Sub stamps publishTime itself, so
// such a time is either forged or a clock far off; either way the message's
// age, which decides whether its evidence may have expired, is unknown. It is
// a 400, which Pub/Sub redelivers: if the clock is ours, the message passes
// once it is set right.
func (o *IngestOptions) checkPublishTime(msg *gate.Message) (outcome, bool) {
	if o.MaxClockSkew <= 0 || msg.PublishTime.IsZero() {
		return outcome{}, true
	}
	ahead := msg.PublishTime.Sub(o.Now())
	if ahead <= o.MaxClockSkew {
		return outcome{}, true
	}
	return outcome{decision: gate.Reject, status: http.StatusBadRequest, malformed: malformedPublishTime,
		reason: fmt.Sprintf("publishTime is %s ahead of the gateway's clock, beyond the allowed skew of %s", ahead.Round(time.Second), o.MaxClockSkew)}, false
}

// routeFor finds the {route} of the request among the broker's routes, or
// answers it as an unknown route.
func (o *IngestOptions) routeFor(w http.ResponseWriter, r *http.Request, b gate.Broker, arrived time.Time) (*gate.Route, bool) {
	name := chi.URLParam(r, "route")
	route, ok := o.Routes[name]
	if !ok || route.Broker != b {
		o.refuse(w, r, b, nil, arrived, unknownRoute(b, name))
		return nil, false
	}
	return route, true
}

// sourceNoun is what each broker calls the thing a route's sources list.
var sourceNoun = map[gate.Broker]string{gate.BrokerPubSub: "subscription", gate.BrokerSNS: "topic"}

// accept takes a decoded, authenticated message: it starts the delivery's
// span, holds the message to the route's allowed sources, and hands it to the
// gate.
func (o *IngestOptions) accept(w http.ResponseWriter, r *http.Request, route *gate.Route, msg *gate.Message, arrived time.Time) {
	ctx, span := o.startDelivery(r, msg.Broker, route, msg, arrived)
	if len(route.Sources) > 0 && !slices.Contains(route.Sources, msg.Source) {
		out := fromRejection(&Rejection{Status: http.StatusForbidden, Reason: sourceNoun[msg.Broker] + " is not allowed on this route"})
		_, status := o.finish(ctx, w, msg.Broker, route, out)
		endDelivery(span, out, status)
		return
	}
	o.deliver(ctx, w, span, route, msg)
}

// deliver hands a decoded, authenticated message to the gate, answers the
// broker, and then runs the gate's post-response bookkeeping.
func (o *IngestOptions) deliver(ctx context.Context, w http.ResponseWriter, span trace.Span, route *gate.Route, msg *gate.Message) {
	res, err := o.Gate.Deliver(ctx, route, msg)
	if err != nil {
		o.Logger.ErrorContext(ctx, "delivery failed", "route", route.Name, "message_id", msg.MessageID, "err", err)
	}
	out := fromGate(res, err)
	if out.malformed == malformedIdentity {
		out = o.poisoned(ctx, route, msg, nil, "", out)
	}
	sent, status := o.finish(ctx, w, msg.Broker, route, out)
	endDelivery(span, out, status)
	if res == nil || (o.After != nil && o.After.Queue(res, sent)) {
		return
	}
	// The response is out; what follows cannot change it.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.FinishTimeout)
	defer cancel()
	if o.After != nil {
		o.After.Finish(fctx, res, sent)
		return
	}
	res.Finish(fctx, o.Logger, sent)
}

// refuseMessage refuses a body that does not decode into a message: as a
// poison message when the message itself is at fault (poisoned), as a plain
// refusal otherwise.
func (o *IngestOptions) refuseMessage(w http.ResponseWriter, r *http.Request, b gate.Broker, route *gate.Route, arrived time.Time, body []byte, err error) {
	ctx, span := o.startDelivery(r, b, route, nil, arrived)
	out := fromRejection(err)
	if rej, ok := poisonRejection(err); ok {
		out = o.poisoned(ctx, route, nil, body, rej.MessageID, out)
	}
	_, status := o.finish(ctx, w, b, route, out)
	endDelivery(span, out, status)
}

// refuse answers a request that never reached the gate (unknown route, a
// body that is not an envelope), under a span whose parent can only come from
// the request headers.
func (o *IngestOptions) refuse(w http.ResponseWriter, r *http.Request, b gate.Broker, route *gate.Route, arrived time.Time, out outcome) {
	ctx, span := o.startDelivery(r, b, route, nil, arrived)
	_, status := o.finish(ctx, w, b, route, out)
	endDelivery(span, out, status)
}

// finish writes the answer, counts its status and logs it without message
// content. It reports whether the answer reached the connection.
func (o *IngestOptions) finish(ctx context.Context, w http.ResponseWriter, b gate.Broker, route *gate.Route, out outcome) (sent bool, status int) {
	status, sent = writeOutcome(w, out)
	level := slog.LevelInfo
	if out.decision != gate.Ack {
		level = slog.LevelWarn
	}
	routeName := "unknown" // a name no route has is never a label or a log field
	if route != nil {
		routeName = route.Name
	}
	if o.Metrics != nil {
		o.Metrics.Response(ctx, b, routeName, status)
		if out.malformed != "" {
			o.Metrics.Malformed(ctx, b, routeName, out.malformed)
		}
	}
	// Once per delivery: skipped whole when the level is off, and written
	// from typed attributes, which box nothing.
	if o.Logger.Enabled(ctx, level) {
		o.Logger.LogAttrs(ctx, level, "delivery answered", slog.String("broker", string(b)),
			slog.String("route", routeName), slog.Int("status", status), slog.String("decision", string(out.decision)),
			slog.String("reason", out.reason), slog.String("operation_id", out.operationID),
			slog.String("state", string(out.state)), slog.Bool("sent", sent))
	}
	return sent, status
}

// errAtCapacity is admitBody's refusal when the body bytes in flight leave
// no room for another body.
var errAtCapacity = errors.New("no room for the body")

// admitBody reserves room for r's body under the admission's byte bound,
// then reads it.
func (o *IngestOptions) admitBody(w http.ResponseWriter, r *http.Request, tk *ticket) ([]byte, error) {
	if !tk.reserve(r.Context(), r) {
		return nil, errAtCapacity
	}
	body, err := readBody(w, r, o.MaxBodyBytes)
	tk.fit(len(body))
	return body, err
}

// bodyRefusal sorts admitBody's errors: no room is an overload nack, the
// rest are readBody's rejections.
func bodyRefusal(b gate.Broker, err error) outcome {
	if errors.Is(err, errAtCapacity) {
		return atCapacity(b)
	}
	return fromRejection(err)
}

// readBody reads at most limit bytes; a larger body is refused with 413
// before anything is decoded or recorded.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, limit)
	var (
		body []byte
		err  error
	)
	if n := r.ContentLength; n > 0 && n <= limit {
		// A declared length (net/http ends the body there): one buffer of
		// that size, where ReadAll would grow one from 512 bytes.
		body = make([]byte, n)
		_, err = io.ReadFull(rd, body)
	} else {
		body, err = io.ReadAll(rd)
	}
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return nil, &Rejection{Status: http.StatusRequestEntityTooLarge, Reason: "body larger than the configured limit"}
	case err != nil:
		return nil, &Rejection{Status: http.StatusBadRequest, Reason: "body could not be read"}
	}
	return body, nil
}
