package console

import (
	"errors"
	"net/http"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

type searchPage struct {
	Routes []string
	Route  string
	// By is "key" or "message_id".
	By      string
	Q       string
	Cursor  string
	Results []gate.Operation
	Next    string
	// Hashed names the routes on which a typed key was looked up by its
	// keyed hash, since they keep no key in clear.
	Hashed   []string
	Problem  string
	Searched bool
}

// search finds operations by the key the route drew from the message or by
// a broker message id, in any state. A key typed on a route that keeps its
// keys hashed (a private field) is hashed the way the gate hashed it, so an
// operator types what the publisher sent and the ledger still never holds it.
func (c *Console) search(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := searchPage{Routes: c.routeNames(), Route: q.Get("route"), By: q.Get("by"), Q: q.Get("q"), Cursor: q.Get("cursor")}
	if p.By != "message_id" {
		p.By = "key"
	}
	for _, v := range []string{p.Route, p.Q, p.Cursor} {
		if len(v) > 1024 || gate.Unstorable(v) != "" {
			c.render(w, r, http.StatusBadRequest, "error.html", errorPage{Title: "Bad search", Message: "A value is too long or holds characters the ledger cannot."})
			return
		}
	}
	if p.Q == "" {
		c.render(w, r, http.StatusOK, "search.html", p)
		return
	}
	p.Searched = true
	f := adminapi.ListFilter{Route: p.Route, Cursor: p.Cursor, Limit: pageSize}
	if p.By == "key" {
		f.Key, f.ByKey = p.Q, adminapi.ByKey(c.o.Routes, p.Route, p.Q)
		for _, rt := range c.o.Routes {
			if (p.Route == "" || rt.Name == p.Route) && rt.Key.Hashed {
				p.Hashed = append(p.Hashed, rt.Name)
			}
		}
	} else {
		f.MessageID, f.ByMessage = p.Q, adminapi.ByMessage(c.o.Routes, p.Route, p.Q)
	}
	status := http.StatusOK
	ops, next, err := c.o.Ledger.List(r.Context(), f)
	switch {
	case errors.Is(err, adminapi.ErrInvalidFilter):
		p.Problem, status = "That page link is not valid any more; search again.", http.StatusBadRequest
	case err != nil:
		c.o.Logger.ErrorContext(r.Context(), "console: search failed", "err", err)
		p.Problem, status = "The ledger did not answer.", http.StatusServiceUnavailable
	}
	p.Results, p.Next = ops, next
	c.render(w, r, status, "search.html", p)
}

type poisonPage struct {
	Routes  []string
	Route   string
	Cursor  string
	Entries []adminapi.PoisonRecord
	Next    string
	Problem string
}

// poison lists the messages that could never become operations (no usable
// identity), the most recently first seen first: their fingerprints, ids and
// reasons, never their bodies, which the ledger does not keep.
func (c *Console) poison(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := poisonPage{Routes: c.routeNames(), Route: q.Get("route"), Cursor: q.Get("cursor")}
	for _, v := range []string{p.Route, p.Cursor} {
		if len(v) > 1024 || gate.Unstorable(v) != "" {
			c.render(w, r, http.StatusBadRequest, "error.html", errorPage{Title: "Bad filter", Message: "A filter is too long or holds characters the ledger cannot."})
			return
		}
	}
	status := http.StatusOK
	if c.o.Poison == nil {
		p.Problem, status = "This gateway keeps no poison records.", http.StatusServiceUnavailable
		c.render(w, r, status, "poison.html", p)
		return
	}
	list, next, err := c.o.Poison.List(r.Context(), adminapi.PoisonFilter{Route: p.Route, Cursor: p.Cursor, Limit: pageSize})
	switch {
	case errors.Is(err, adminapi.ErrInvalidFilter):
		p.Problem, status = "That page link is not valid any more; start from the first page.", http.StatusBadRequest
	case err != nil:
		c.o.Logger.ErrorContext(r.Context(), "console: poison list failed", "err", err)
		p.Problem, status = "The ledger did not answer.", http.StatusServiceUnavailable
	}
	p.Entries, p.Next = list, next
	c.render(w, r, status, "poison.html", p)
}
