package handlers

import (
	"context"
	"errors"
	"net/http"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

// PoisonLog keeps the messages that can never be processed because they have
// no usable identity. Record answers kept false when the route's records are
// full and the message is not among them.
type PoisonLog interface {
	Record(ctx context.Context, p *gate.Poison) (kept bool, err error)
}

// PoisonStore lists poison records for the admin API; it answers
// adminapi.ErrInvalidFilter for a filter it cannot apply.
type PoisonStore interface {
	List(ctx context.Context, f adminapi.PoisonFilter) ([]adminapi.PoisonRecord, string, error)
}

// poisoned answers a message that can never be processed, refused as out
// says: it has no usable identity, so it cannot become an operation, but it
// is kept as a poison record. m is the decoded message (nil when the body
// did not decode) and messageID its id as far as it was read.
//
// Under dead_letter: gateway the record is what lets the answer be an ack,
// so the broker stops redelivering: no record, no ack. A record that cannot
// be written is then a nack, like any evidence the gateway cannot write; a
// route whose records are full keeps the refusal. Under dead_letter: broker
// the answer stays the refusal, which the subscription's own dead-letter
// policy acts on, and the record is only for operators.
func (o *IngestOptions) poisoned(ctx context.Context, route *gate.Route, m *gate.Message, body []byte, messageID string, out outcome) outcome {
	if o.Poison == nil {
		return out
	}
	p := gate.NewPoison(route, m, body, messageID, out.reason, o.Now())
	kept, err := o.Poison.Record(ctx, p)
	switch {
	case err != nil:
		o.Logger.ErrorContext(ctx, "recording a poison message failed", "route", route.Name, "err", err)
		if p.Acked {
			return outcome{decision: gate.Nack, reason: "poison record could not be kept: evidence store unavailable", malformed: out.malformed}
		}
	case !kept:
		out.reason = gate.Bound(out.reason+"; not recorded: the route's poison records are full", gate.MaxReason)
	case p.Acked:
		return outcome{decision: gate.Ack, reason: gate.Bound("dead-lettered as poison: "+out.reason, gate.MaxReason), malformed: out.malformed}
	}
	return out
}

// poisonRejection returns err's rejection when it says the message itself
// can never be processed.
func poisonRejection(err error) (*Rejection, bool) {
	var rej *Rejection
	if errors.As(err, &rej) && rej.Poison {
		return rej, true
	}
	return nil, false
}

func handleListPoison(o *AdminOptions) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		f := adminapi.PoisonFilter{Route: q.Get("route"), Cursor: q.Get("cursor")}
		var ok bool
		if f.Limit, ok = pageLimit(w, q); !ok {
			return
		}
		if msg := checkQueryText(map[string]string{"route": f.Route, "cursor": f.Cursor}); msg != "" {
			writeProblem(w, http.StatusBadRequest, msg)
			return
		}
		if o.Poison == nil {
			writeProblem(w, http.StatusServiceUnavailable, "poison records unavailable")
			return
		}
		list, next, err := o.Poison.List(r.Context(), f)
		if listFailed(w, r, o, "poison records", err) {
			return
		}
		writeJSON(w, http.StatusOK, adminapi.PoisonList{Poison: nonNil(list), NextCursor: next})
	}
}
