package console

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

type operationPage struct {
	Op            gate.Operation
	Card          card
	Statement     string
	TraceLink     string
	Events        []transitionRow
	Interventions []gate.Intervention
	// Actions are the resolutions the operation's state allows.
	CanResolve bool
	CanReplay  bool
	// InOutbox: a handed-off operation the relay still works on, whose
	// entry an operator may make due now or cancel.
	InOutbox bool
	// Why says, beside the statement, since when and why an operation waits
	// in a lane: what its branch of the card says, without scrolling to it.
	Why     string
	Done    string
	Problem string
	// Form keeps what the operator typed when an action was refused.
	Form resolveForm
}

type resolveForm struct {
	Kind, ResultID, Reason string
}

// transitionRow is a logged step and how long after the one before it
// came (after the operation's creation, for the first).
type transitionRow struct {
	adminapi.Event
	After string
}

func transitionRows(rec *adminapi.Record) []transitionRow {
	out := make([]transitionRow, len(rec.Events))
	prev := rec.Operation.CreatedAt
	for i, e := range rec.Events {
		out[i] = transitionRow{Event: e, After: duration(e.At.Sub(prev))}
		prev = e.At
	}
	return out
}

// openStates are those in which the relay still takes an outbox entry up.
func open(s gate.State) bool {
	return s == gate.StateReceived || s == gate.StateReserved || s == gate.StatePendingEffect
}

// validID mirrors the admin API's check of an operation id.
func validID(id string) bool {
	return id != "" && len(id) <= 64 && gate.Unstorable(id) == ""
}

func (c *Console) operation(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	var done string
	switch r.URL.Query().Get("done") {
	case "changed":
		done = "Recorded. The operation's record below includes your intervention."
	case "unchanged":
		done = "The same resolution was already recorded; nothing new was written."
	case "retried":
		done = "Recorded. The outbox entry is due now; the relay's next pass takes it up."
	case "cancelled":
		done = "Recorded. The outbox entry is out of the relay's queue and the operation is in the terminal lane; replay hands it back."
	}
	c.showOperation(w, r, id, http.StatusOK, done, "", resolveForm{})
}

func (c *Console) showOperation(w http.ResponseWriter, r *http.Request, id string, status int, done, problem string, form resolveForm) {
	if !validID(id) {
		c.render(w, r, http.StatusBadRequest, "error.html", errorPage{Title: "Bad operation id", Message: "Operation ids are 1 to 64 characters the ledger can hold."})
		return
	}
	rec, err := c.o.Ledger.Get(r.Context(), id)
	if errors.Is(err, gate.ErrNotFound) {
		c.render(w, r, http.StatusNotFound, "error.html", errorPage{Title: "No such operation", Message: "The ledger has no operation " + strconv.Quote(id) + "."})
		return
	}
	if err != nil {
		c.o.Logger.ErrorContext(r.Context(), "console: reading evidence failed", "operation_id", id, "err", err)
		c.render(w, r, http.StatusServiceUnavailable, "error.html", errorPage{Title: "Evidence store unavailable", Message: "The ledger did not answer; try again."})
		return
	}
	op := rec.Operation
	p := operationPage{
		Op: op, Card: c.buildCard(rec), Statement: gate.Statement(&op), TraceLink: c.traceLink(op.TraceID),
		Events: transitionRows(rec), Interventions: rec.Interventions,
		CanResolve: op.State == gate.StateEffectIndeterminate && op.ConflictOf == "",
		CanReplay:  op.State == gate.StateTerminalFailure && op.ConflictOf == "",
		InOutbox:   op.HandedOffAt != nil && open(op.State) && op.ConflictOf == "",
		Done:       done, Problem: problem, Form: form,
	}
	p.Why = c.why(&op, p.Card)
	c.render(w, r, status, "operation.html", p)
}

func (c *Console) why(op *gate.Operation, cd card) string {
	var what string
	var since *time.Time
	switch op.State {
	case gate.StateEffectIndeterminate:
		what = "Indeterminate"
		if cd.Indeterminate != nil {
			since = cd.Indeterminate.Time
		}
	case gate.StateTerminalFailure:
		what = "Terminal"
		if cd.Terminal != nil {
			since = cd.Terminal.Time
		}
	default:
		return ""
	}
	if since == nil {
		since = &op.UpdatedAt
	}
	out := what + " since " + stamp(since) + " (" + age(c.o.Now(), *since) + " ago)"
	if op.Reason != "" {
		out += ": " + op.Reason
	}
	if op.State == gate.StateEffectIndeterminate && op.NextCheckAt != nil {
		out += ". Next reconciling lookup " + stamp(op.NextCheckAt)
	}
	return out
}

// resolve applies a resolution through the gate, as whoever is logged in:
// the same rules, the same required reason, recorded as a manual
// intervention under the actor "console:<name>".
func (c *Console) resolve(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	if !validID(id) {
		c.render(w, r, http.StatusBadRequest, "error.html", errorPage{Title: "Bad operation id", Message: "Nothing changed."})
		return
	}
	s := sessionFrom(r.Context())
	form := resolveForm{
		Kind:     r.PostForm.Get("kind"),
		ResultID: strings.TrimSpace(r.PostForm.Get("result_id")),
		Reason:   strings.TrimSpace(r.PostForm.Get("reason")),
	}
	res := gate.Resolution{Kind: gate.ResolutionKind(form.Kind), ResultID: form.ResultID, Reason: form.Reason, Actor: "console:" + s.Name}
	_, changed, err := c.o.Resolver.Resolve(r.Context(), id, res)
	var infra *gate.InfraError
	switch {
	case err == nil:
		done := "unchanged"
		if changed {
			done = "changed"
		}
		c.o.Logger.InfoContext(r.Context(), "console resolution", "operation_id", id, "kind", form.Kind, "actor", res.Actor, "changed", changed)
		http.Redirect(w, r, "/console/operations/"+url.PathEscape(id)+"?done="+done, http.StatusSeeOther)
	case errors.Is(err, gate.ErrInvalidResolution):
		c.showOperation(w, r, id, http.StatusBadRequest, "", "Not recorded: "+err.Error(), form)
	case errors.Is(err, gate.ErrNotFound):
		c.render(w, r, http.StatusNotFound, "error.html", errorPage{Title: "No such operation", Message: "Nothing changed."})
	case errors.Is(err, gate.ErrRefused):
		c.showOperation(w, r, id, http.StatusConflict, "", "Refused, nothing written: "+err.Error(), form)
	case errors.Is(err, gate.ErrHeld):
		c.showOperation(w, r, id, http.StatusConflict, "", "A delivery or the reconciler is working on this operation right now; nothing written. Try again in a moment.", form)
	case errors.As(err, &infra):
		c.o.Logger.ErrorContext(r.Context(), "console: resolution failed", "operation_id", id, "err", err)
		c.showOperation(w, r, id, http.StatusServiceUnavailable, "", "The ledger or Redis did not answer; the resolution may not be recorded. Reload to see.", form)
	default:
		c.o.Logger.ErrorContext(r.Context(), "console: resolution failed", "operation_id", id, "err", err)
		c.showOperation(w, r, id, http.StatusInternalServerError, "", "The resolution failed; reload to see whether it was recorded.", form)
	}
}
