package console

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

type operationPage struct {
	Op            gate.Operation
	Card          card
	Statement     string
	TraceLink     string
	Events        []adminapi.Event
	Interventions []gate.Intervention
	// Actions are the resolutions the operation's state allows.
	CanResolve bool
	CanReplay  bool
	Done       string
	Problem    string
	// Form keeps what the operator typed when an action was refused.
	Form resolveForm
}

type resolveForm struct {
	Kind, ResultID, Reason string
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
		Events: rec.Events, Interventions: rec.Interventions,
		CanResolve: op.State == gate.StateEffectIndeterminate && op.ConflictOf == "",
		CanReplay:  op.State == gate.StateTerminalFailure && op.ConflictOf == "",
		Done:       done, Problem: problem, Form: form,
	}
	c.render(w, r, status, "operation.html", p)
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
