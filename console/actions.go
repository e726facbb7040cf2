package console

import (
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/ackgate/ackgate/gate"
)

// outboxAction is an operator's retry-now or cancel of a handoff outbox
// entry, from the outbox page or the operation's. Each is recorded as an
// intervention under "console:<name>" with the reason given; a cancel is a
// resolution the gate applies under the operation's lease.
func (c *Console) outboxAction(w http.ResponseWriter, r *http.Request) {
	id, action := chi.URLParam(r, "id"), chi.URLParam(r, "action")
	if !validID(id) || (action != "retry" && action != "cancel") {
		c.render(w, r, http.StatusBadRequest, "error.html", errorPage{Title: "Bad outbox action", Message: "Nothing changed."})
		return
	}
	s := sessionFrom(r.Context())
	actor, reason := "console:"+s.Name, strings.TrimSpace(r.PostForm.Get("reason"))
	var err error
	if action == "retry" {
		if c.o.Outbox == nil {
			err = errors.New("no outbox actions in this process")
		} else {
			err = c.o.Outbox.RetryOutbox(r.Context(), id, actor, reason)
		}
	} else {
		_, _, err = c.o.Resolver.Resolve(r.Context(), id, gate.Resolution{Kind: gate.ResolveCancel, Reason: reason, Actor: actor})
	}
	back := "/console/outbox?" + url.Values{"route": {r.PostForm.Get("route")}}.Encode()
	if r.PostForm.Get("from") == "operation" {
		back = "/console/operations/" + url.PathEscape(id) + "?"
	}
	var infra *gate.InfraError
	switch {
	case err == nil:
		c.o.Logger.InfoContext(r.Context(), "console outbox action", "operation_id", id, "action", action, "actor", actor)
		done := map[string]string{"retry": "retried", "cancel": "cancelled"}[action]
		http.Redirect(w, r, back+"&done="+done+"&op="+url.QueryEscape(id), http.StatusSeeOther)
		return
	case errors.Is(err, gate.ErrInvalidResolution):
		c.actionRefused(w, r, http.StatusBadRequest, "Not recorded: "+err.Error())
	case errors.Is(err, gate.ErrNotFound):
		c.actionRefused(w, r, http.StatusNotFound, "Not recorded: operation "+id+" has no undelivered outbox entry.")
	case errors.Is(err, gate.ErrRefused):
		c.actionRefused(w, r, http.StatusConflict, "Refused, nothing written: "+err.Error())
	case errors.Is(err, gate.ErrHeld):
		c.actionRefused(w, r, http.StatusConflict, "A relay pass is working on this operation right now; nothing written. Try again in a moment.")
	case errors.As(err, &infra):
		c.o.Logger.ErrorContext(r.Context(), "console: outbox action failed", "operation_id", id, "action", action, "err", err)
		c.actionRefused(w, r, http.StatusServiceUnavailable, "The ledger or Redis did not answer; the action may not be recorded. Read the operation to see.")
	default:
		c.o.Logger.ErrorContext(r.Context(), "console: outbox action failed", "operation_id", id, "action", action, "err", err)
		c.actionRefused(w, r, http.StatusServiceUnavailable, "The action failed; read the operation to see whether it was recorded.")
	}
}

func (c *Console) actionRefused(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "error.html", errorPage{Title: "Outbox action not applied", Message: msg})
}
