package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/jsonerr"
)

// The recovery lanes as the admin API serves them: an operator's resolution
// of an operation whose effect the gateway cannot settle by itself, the
// replay of a terminal one, and the list of terminal records to pick from.
// The gate decides and writes; these handlers only decode, call and map
// the outcome to a status.

// Resolver applies an operator's resolution (gate.Gate.Resolve): the
// operation as it now is, with changed false when the same request was
// already applied and nothing has happened since.
type Resolver interface {
	Resolve(ctx context.Context, id string, r gate.Resolution) (*gate.Operation, bool, error)
}

// DeadLetterStore lists terminal records; it answers
// adminapi.ErrInvalidFilter for a filter it cannot apply.
type DeadLetterStore interface {
	DeadLetters(ctx context.Context, f adminapi.DeadLetterFilter) ([]adminapi.DeadLetterEntry, string, error)
}

// maxResolutionBody bounds a resolution's body: a reason and a result id of
// at most 300 bytes and an actor of at most 256 fit many times over.
const maxResolutionBody = 16 << 10

// ResolutionHeader says whether a 200 to a resolution wrote it
// ("applied") or found the same request already applied with nothing
// changed since ("already_applied").
const ResolutionHeader = "X-Ackgate-Resolution"

func handleResolve(o *AdminOptions) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, ok := operationID(w, r)
		if !ok {
			return
		}
		var req adminapi.ResolveRequest
		if !decodeBody(w, r, &req) {
			return
		}
		switch req.Kind {
		case gate.ResolveHappened, gate.ResolveNotHappened, gate.ResolveAbandon:
		case gate.ResolveReplay:
			writeProblem(w, http.StatusBadRequest, "kind replay has its own path: POST /v1/operations/{id}/replay")
			return
		case gate.ResolveCancel:
			writeProblem(w, http.StatusBadRequest, "kind cancel has its own path: POST /v1/outbox/{id}/cancel")
			return
		default:
			writeProblem(w, http.StatusBadRequest, fmt.Sprintf("kind must be happened, not_happened or abandon, not %q", gate.Bound(string(req.Kind), 64)))
			return
		}
		res, ok := recordedResolution(w, r, req.Actor, req.Reason, req.Note)
		if !ok {
			return
		}
		res.Kind, res.ResultID = req.Kind, req.ResultID
		o.resolve(w, r, id, res)
	}
}

func handleReplay(o *AdminOptions) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, ok := operationID(w, r)
		if !ok {
			return
		}
		var req adminapi.ReplayRequest
		if !decodeBody(w, r, &req) {
			return
		}
		res, ok := recordedResolution(w, r, req.Actor, req.Reason, req.Note)
		if !ok {
			return
		}
		res.Kind = gate.ResolveReplay
		o.resolve(w, r, id, res)
	}
}

// OutboxActions changes a handoff outbox entry's schedule; storage.Ledger is
// one. RetryOutbox answers gate.ErrNotFound when the operation has no
// undelivered entry and gate.ErrRefused when its operation is not open.
type OutboxActions interface {
	RetryOutbox(ctx context.Context, id, actor, reason string) error
}

// handleOutboxCancel takes an entry out of the relay's queue: the gate
// ends its operation terminally, under its lease, as a resolution.
func handleOutboxCancel(o *AdminOptions) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, ok := operationID(w, r)
		if !ok {
			return
		}
		var req adminapi.OutboxActionRequest
		if !decodeBody(w, r, &req) {
			return
		}
		res, ok := recordedResolution(w, r, req.Actor, req.Reason, req.Note)
		if !ok {
			return
		}
		res.Kind = gate.ResolveCancel
		o.resolve(w, r, id, res)
	}
}

// handleOutboxRetry makes an entry due for the relay's next pass.
func handleOutboxRetry(o *AdminOptions) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, ok := operationID(w, r)
		if !ok {
			return
		}
		var req adminapi.OutboxActionRequest
		if !decodeBody(w, r, &req) {
			return
		}
		res, ok := recordedResolution(w, r, req.Actor, req.Reason, req.Note)
		if !ok {
			return
		}
		if o.Outbox == nil {
			writeProblem(w, http.StatusServiceUnavailable, "outbox actions are not available in this process")
			return
		}
		ctx := r.Context()
		err := o.Outbox.RetryOutbox(ctx, id, res.Actor, res.Reason)
		switch {
		case errors.Is(err, gate.ErrInvalidResolution):
			writeProblem(w, http.StatusBadRequest, err.Error())
			return
		case errors.Is(err, gate.ErrNotFound):
			writeProblem(w, http.StatusNotFound, "no undelivered outbox entry for "+strconv.Quote(id))
			return
		case errors.Is(err, gate.ErrRefused):
			writeProblem(w, http.StatusConflict, err.Error())
			return
		case err != nil:
			o.Logger.ErrorContext(ctx, "outbox retry failed", "operation_id", id, "err", err)
			writeProblem(w, http.StatusServiceUnavailable, "evidence store unavailable; nothing was recorded unless a read of the operation shows it")
			return
		}
		o.Logger.InfoContext(ctx, "outbox entry made due by an operator", "operation_id", id, "actor", res.Actor)
		rec, err := o.Evidence.Get(ctx, id)
		if err != nil {
			o.Logger.ErrorContext(ctx, "reading an operation failed", "operation_id", id, "err", err)
			writeProblem(w, http.StatusServiceUnavailable, "the entry is due now, but its record could not be read back; read the operation")
			return
		}
		w.Header().Set(ResolutionHeader, "applied")
		writeJSON(w, http.StatusOK, buildRecord(rec, o.Routes))
	}
}

// MaxNote bounds a resolution's note.
const MaxNote = 200

// ActorPrefix starts the actor of every resolution made through the admin
// API: "api:" and the name of the credential the request carried.
const ActorPrefix = "api:"

// recordedResolution is the actor and reason a resolution is recorded with.
// The actor is the authenticated credential's, never the caller's choice:
// a request's actor field is accepted only when it names that credential
// (older clients sent their own name), and refused otherwise. The note is
// kept after the reason, as "REASON (note: NOTE)".
func recordedResolution(w http.ResponseWriter, r *http.Request, actor, reason, note string) (gate.Resolution, bool) {
	name := Caller(r.Context())
	if name == "" {
		// The route is behind requireCredential; without a name something
		// is miswired, and nothing may be recorded under no one.
		writeProblem(w, http.StatusInternalServerError, "no authenticated credential")
		return gate.Resolution{}, false
	}
	if actor != "" && actor != name && actor != ActorPrefix+name {
		writeProblem(w, http.StatusBadRequest, "actor is the credential the request carries ("+ActorPrefix+name+") and cannot be chosen; put free text in note")
		return gate.Resolution{}, false
	}
	if note != "" {
		switch {
		case len(note) > MaxNote:
			writeProblem(w, http.StatusBadRequest, fmt.Sprintf("note is longer than %d bytes", MaxNote))
			return gate.Resolution{}, false
		case gate.Unstorable(note) != "":
			writeProblem(w, http.StatusBadRequest, "note "+gate.Unstorable(note))
			return gate.Resolution{}, false
		case strings.TrimSpace(reason) == "":
			writeProblem(w, http.StatusBadRequest, "invalid resolution: reason is required")
			return gate.Resolution{}, false
		}
		reason += " (note: " + note + ")"
		if len(reason) > gate.MaxReason {
			writeProblem(w, http.StatusBadRequest, fmt.Sprintf("reason and note together are longer than %d bytes", gate.MaxReason-len(" (note: )")))
			return gate.Resolution{}, false
		}
	}
	return gate.Resolution{Reason: reason, Actor: ActorPrefix + name}, true
}

// resolve applies res and answers the evidence record as it now is.
func (o *AdminOptions) resolve(w http.ResponseWriter, r *http.Request, id string, res gate.Resolution) {
	ctx := r.Context()
	if o.Resolver == nil {
		writeProblem(w, http.StatusServiceUnavailable, "resolutions are not available in this process")
		return
	}
	_, changed, err := o.Resolver.Resolve(ctx, id, res)
	var infra *gate.InfraError
	switch {
	case errors.As(err, &infra):
		o.Logger.ErrorContext(ctx, "resolution failed", "operation_id", id, "kind", res.Kind, "err", err)
		writeProblem(w, http.StatusServiceUnavailable, "evidence store unavailable; nothing was recorded unless a read of the operation shows it")
		return
	case errors.Is(err, gate.ErrInvalidResolution):
		writeProblem(w, http.StatusBadRequest, err.Error())
		return
	case errors.Is(err, gate.ErrNotFound):
		writeProblem(w, http.StatusNotFound, "no operation "+strconv.Quote(id))
		return
	case errors.Is(err, gate.ErrRefused):
		writeProblem(w, http.StatusConflict, err.Error())
		return
	case errors.Is(err, gate.ErrHeld):
		// A delivery (or the reconciler) holds the operation's lease now;
		// once it lets go the request may be decided differently, so it is
		// the client's to send again, not ours to queue.
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds))
		writeProblem(w, http.StatusServiceUnavailable, err.Error())
		return
	case err != nil:
		o.Logger.ErrorContext(ctx, "resolution failed", "operation_id", id, "kind", res.Kind, "err", err)
		writeProblem(w, http.StatusServiceUnavailable, "resolution failed: "+gate.Bound(err.Error(), gate.MaxReason))
		return
	}
	if changed {
		o.Logger.InfoContext(ctx, "operator resolution recorded", "operation_id", id, "kind", res.Kind, "actor", res.Actor)
	}
	rec, err := o.Evidence.Get(ctx, id)
	if err != nil {
		o.Logger.ErrorContext(ctx, "reading a resolved operation failed", "operation_id", id, "err", err)
		// Sending the same request again is safe: it answers the record
		// without writing a second intervention.
		writeProblem(w, http.StatusServiceUnavailable, "the resolution is recorded, but its record could not be read back; send the same request again or read the operation")
		return
	}
	if changed {
		w.Header().Set(ResolutionHeader, "applied")
	} else {
		w.Header().Set(ResolutionHeader, "already_applied")
	}
	writeJSON(w, http.StatusOK, buildRecord(rec, o.Routes))
}

// operationID reads and checks the {id} of the path, answering 400 itself
// when it is not one the ledger could hold.
func operationID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := chi.URLParam(r, "id")
	if id == "" || len(id) > 64 {
		writeProblem(w, http.StatusBadRequest, "operation id must be 1 to 64 characters")
		return "", false
	}
	if why := gate.Unstorable(id); why != "" {
		writeProblem(w, http.StatusBadRequest, "operation id "+why)
		return "", false
	}
	return id, true
}

var errTrailing = errors.New("trailing data")

// decodeBody reads one JSON object into v, refusing a body over the limit
// (413), unknown fields, trailing data and anything that is not JSON (400).
// Its answers name fields and positions, never the body's values.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	var tooBig *http.MaxBytesError
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxResolutionBody))
	if err == nil {
		// An operator's reason or note is kept as written: decoding would
		// replace bytes that are not UTF-8 with U+FFFD without a word.
		if why := gate.ExactJSON(body); why != "" {
			writeProblem(w, http.StatusBadRequest, "body "+why)
			return false
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err == nil {
		err = dec.Decode(v)
	}
	if err == nil {
		if _, after := dec.Token(); after != io.EOF {
			err = errTrailing
			if errors.As(after, &tooBig) {
				err = after
			}
		}
	}
	switch {
	case err == nil:
		return true
	case errors.As(err, &tooBig):
		writeProblem(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body is larger than %d bytes", maxResolutionBody))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.TrimPrefix(err.Error(), "json: unknown field ")
		writeProblem(w, http.StatusBadRequest, "body has an unknown field "+gate.Bound(field, 66))
	case errors.Is(err, errTrailing):
		writeProblem(w, http.StatusBadRequest, "body must be one JSON object and nothing after it")
	default:
		writeProblem(w, http.StatusBadRequest, "body is not the expected JSON object: "+jsonerr.Describe(err))
	}
	return false
}

func handleListDeadLetters(o *AdminOptions) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		f := adminapi.DeadLetterFilter{Route: q.Get("route"), Cursor: q.Get("cursor")}
		var ok bool
		if f.Limit, ok = pageLimit(w, q); !ok {
			return
		}
		if msg := checkQueryText(map[string]string{"route": f.Route, "cursor": f.Cursor}); msg != "" {
			writeProblem(w, http.StatusBadRequest, msg)
			return
		}
		if o.DeadLetters == nil {
			writeProblem(w, http.StatusServiceUnavailable, "dead letters unavailable")
			return
		}
		list, next, err := o.DeadLetters.DeadLetters(r.Context(), f)
		if listFailed(w, r, o, "dead letters", err) {
			return
		}
		now := time.Now()
		for i := range list {
			list[i].AgeSeconds = max(0, int64(now.Sub(list[i].Since)/time.Second))
		}
		writeJSON(w, http.StatusOK, adminapi.DeadLetterList{DeadLetters: nonNil(list), NextCursor: next})
	}
}
