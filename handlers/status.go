package handlers

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/gate"
)

// Rejection is a deliberate refusal made before the gate runs: a body we cannot
// read, a source the route does not allow, a request that is too large.
type Rejection struct {
	Status int
	Reason string
	// Poison says the message itself can never be processed (not the
	// request's transport, nor the route's configuration); MessageID is its
	// id as far as it was read. Such a message is kept as a poison record.
	Poison    bool
	MessageID string
}

func (r *Rejection) Error() string { return r.Reason }

// retryAfterSeconds is advisory: Pub/Sub applies its own backoff and SNS its
// retry policy, but a human with curl reads it too.
const retryAfterSeconds = 5

var retryAfter = strconv.Itoa(retryAfterSeconds)

// outcome is everything that decides a response, whichever step produced it.
type outcome struct {
	decision    gate.Decision
	status      int // set for rejections and unknown routes
	reason      string
	operationID string
	state       gate.State
	// malformed names the kind of a delivery refused as malformed, for the
	// malformed counter; "" for every other answer.
	malformed string
}

// Kinds of malformed delivery, the kind label of the malformed counter.
const (
	// malformedEnvelope: not the broker's message format.
	malformedEnvelope = "envelope"
	// malformedIdentity: no usable identity (a missing key, an identity field
	// Postgres text cannot hold).
	malformedIdentity = "identity"
	// malformedPublishTime: published further in the future than the clock
	// skew allows.
	malformedPublishTime = "publish_time"
)

// ackStatus is 204 for both brokers: Pub/Sub acks 102/200/201/202/204 and
// SNS treats any 2xx as delivered.
const ackStatus = http.StatusNoContent

// statusFor is the one table from a gate decision to an HTTP status. A nack is
// always 5xx: Pub/Sub would redeliver a 4xx too, but SNS drops every status
// below 500, and a nack must never lose a message.
func statusFor(o outcome) int {
	switch o.decision {
	case gate.Ack:
		return ackStatus
	case gate.Reject:
		if o.status != 0 {
			return o.status
		}
		return http.StatusBadRequest
	}
	if o.status != 0 {
		return o.status
	}
	return http.StatusServiceUnavailable
}

// unknownRoute answers a route name this gateway does not have. It is often a
// config rollout still on its way, so it must come back: for Pub/Sub a 404 is
// a nack, for SNS only a 5xx is.
func unknownRoute(b gate.Broker, name string) outcome {
	o := outcome{decision: gate.Nack, reason: "unknown route " + strconv.Quote(gate.Bound(name, 64))}
	if b == gate.BrokerPubSub {
		o.status = http.StatusNotFound
	} else {
		o.status = http.StatusServiceUnavailable
	}
	return o
}

// fromGate sorts what the gate returned into an outcome.
func fromGate(res *gate.Result, err error) outcome {
	if err != nil || res == nil {
		reason := "evidence store unavailable"
		if res != nil && res.Reason != "" {
			reason = res.Reason
		}
		return outcome{decision: gate.Nack, reason: reason}
	}
	out := outcome{decision: res.Decision, reason: res.Reason, operationID: res.OperationID, state: res.State}
	if res.Decision == gate.Reject {
		// The gate rejects only a message it cannot identify.
		out.malformed = malformedIdentity
	}
	return out
}

func fromRejection(err error) outcome {
	var rej *Rejection
	if errors.As(err, &rej) {
		out := outcome{decision: gate.Reject, status: rej.Status, reason: rej.Reason}
		if rej.Status == http.StatusBadRequest {
			out.malformed = malformedEnvelope
		}
		return out
	}
	return outcome{decision: gate.Nack, reason: "internal error"}
}

// fromAuth sorts a failed broker authentication; nothing was executed or
// recorded. A credential that cannot be checked right now (a certificate or
// key set that cannot be fetched, an authenticator not configured) is a nack,
// 503, because SNS drops a message on any 4xx. The rest are deliberate
// rejections: 401 for a credential that is missing or does not verify, 403
// for one that verifies but is not accepted on this route (audience, service
// account, unverified email, a URL outside the allow-list), 400 for a body
// that is not the broker's message format.
func fromAuth(err error) outcome {
	var e *brokerauth.Error
	if !errors.As(err, &e) {
		return outcome{decision: gate.Nack, reason: "internal error"}
	}
	switch e.Kind {
	case brokerauth.Unauthenticated:
		return outcome{decision: gate.Reject, status: http.StatusUnauthorized, reason: e.Reason}
	case brokerauth.Forbidden:
		return outcome{decision: gate.Reject, status: http.StatusForbidden, reason: e.Reason}
	case brokerauth.Malformed:
		return outcome{decision: gate.Reject, status: http.StatusBadRequest, reason: e.Reason, malformed: malformedEnvelope}
	}
	return outcome{decision: gate.Nack, reason: e.Reason}
}

// AnswerBody is the JSON body of every non-ack answer to a broker.
type AnswerBody struct {
	Decision    gate.Decision `json:"decision"`
	Reason      string        `json:"reason,omitempty"`
	OperationID string        `json:"operation_id,omitempty"`
	State       gate.State    `json:"state,omitempty"`
}

// writeOutcome writes the broker's answer. An ack has no body. The response is
// flushed so that work done after it (post-ack bookkeeping) cannot delay it;
// sent reports whether it reached the connection.
func writeOutcome(w http.ResponseWriter, o outcome) (status int, sent bool) {
	status = statusFor(o)
	if status == ackStatus {
		w.WriteHeader(status)
	} else {
		if status >= 500 || status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", retryAfter)
		}
		writeJSON(w, status, AnswerBody{Decision: o.decision, Reason: gate.Bound(o.reason, gate.MaxReason), OperationID: o.operationID, State: o.state})
	}
	return status, flush(w) == nil
}

// flush sends what was written now. net/http's own writer has FlushError;
// asking it directly saves the ResponseController that finding it through
// wrappers allocates on every answer.
func flush(w http.ResponseWriter) error {
	if f, ok := w.(interface{ FlushError() error }); ok {
		return f.FlushError()
	}
	return http.NewResponseController(w).Flush()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		slog.Debug("writing response failed", "err", err)
	}
}
