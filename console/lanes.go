package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

// lane is one tab of the lanes page.
type lane struct {
	State gate.State
	Title string
}

// lanes are the queues an operator works through, in the order shown.
var lanes = []lane{
	{gate.StateEffectIndeterminate, "Indeterminate"},
	{gate.StateTerminalFailure, "Terminal / dead letters"},
	{gate.StateConflicting, "Conflicts"},
}

func laneStates() []gate.State {
	out := make([]gate.State, len(lanes))
	for i, l := range lanes {
		out[i] = l.State
	}
	return out
}

type lanesPage struct {
	Lanes      []lane
	States     []gate.State
	Routes     []string
	Counts     []routeCounts
	State      gate.State
	Route      string
	MessageID  string
	Cursor     string
	Entries    []laneRow
	Next       string
	Problem    string
	CountCap   bool
	ShowOutbox bool
}

type routeCounts struct {
	Route string
	Cells []countCell
}

type countCell struct {
	Lane   string
	N      int64
	Capped bool
}

type laneRow struct {
	adminapi.LaneEntry
	Age         string
	InLaneSince string
}

const pageSize = 50

func (c *Console) routeNames() []string {
	out := make([]string, 0, len(c.o.Routes))
	for _, r := range c.o.Routes {
		out = append(out, r.Name)
	}
	return out
}

func (c *Console) hasHandoff() bool {
	for _, r := range c.o.Routes {
		if r.Shape == gate.ShapeHandoff {
			return true
		}
	}
	return false
}

// lanes: a lane's operations oldest first, by route and message id, a page
// at a time; above them each route's count per lane.
func (c *Console) lanes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := lanesPage{
		Lanes: lanes, States: gate.States, Routes: c.routeNames(),
		State: gate.State(q.Get("state")), Route: q.Get("route"), MessageID: q.Get("message_id"), Cursor: q.Get("cursor"),
		ShowOutbox: c.hasHandoff(),
	}
	if q.Get("state") == "" && p.MessageID == "" {
		p.State = gate.StateEffectIndeterminate
	}
	if p.State != "" && !p.State.Valid() {
		c.render(w, r, http.StatusBadRequest, "error.html", errorPage{Title: "Unknown state", Message: "Pick a state from the list."})
		return
	}
	for _, v := range []string{p.Route, p.MessageID, p.Cursor} {
		if len(v) > 1024 || gate.Unstorable(v) != "" {
			c.render(w, r, http.StatusBadRequest, "error.html", errorPage{Title: "Bad filter", Message: "A filter is too long or holds characters the ledger cannot."})
			return
		}
	}
	status := http.StatusOK
	counts, err := c.o.Ledger.LaneTotals(r.Context(), p.Routes, laneStates())
	if err != nil {
		c.o.Logger.ErrorContext(r.Context(), "console: lane totals failed", "err", err)
		p.Problem, status = "The ledger did not answer; counts and entries may be missing.", http.StatusServiceUnavailable
	}
	p.Counts = groupCounts(p.Routes, counts, p.ShowOutbox)
	for _, n := range counts {
		p.CountCap = p.CountCap || n.Capped
	}
	if p.Problem == "" {
		if p.State == "" {
			// Every state: only with a message id, which narrows the search to
			// that message's few operations.
			p.Entries, p.Next, err = c.everyState(r, p)
		} else {
			var page adminapi.LanePage
			page, err = c.o.Ledger.LanePage(r.Context(), adminapi.LaneFilter{State: p.State, Route: p.Route,
				MessageID: p.MessageID, ByMessage: c.byMessage(p), Cursor: p.Cursor, Limit: pageSize})
			p.Entries, p.Next = c.rows(page.Entries), page.Next
		}
		switch {
		case errors.Is(err, adminapi.ErrInvalidFilter):
			p.Problem, status = "That page link is not valid any more; start from the first page.", http.StatusBadRequest
		case err != nil:
			c.o.Logger.ErrorContext(r.Context(), "console: lane failed", "err", err)
			p.Problem, status = "The ledger did not answer.", http.StatusServiceUnavailable
		}
	}
	c.render(w, r, status, "lanes.html", p)
}

// byMessage is the ids p's message id names on the routes keyed on it.
func (c *Console) byMessage(p lanesPage) []string {
	if p.MessageID == "" {
		return nil
	}
	return adminapi.ByMessage(c.o.Routes, p.Route, p.MessageID)
}

// everyState finds a message id's operations whatever their state.
func (c *Console) everyState(r *http.Request, p lanesPage) ([]laneRow, string, error) {
	var all []adminapi.LaneEntry
	for _, s := range gate.States {
		page, err := c.o.Ledger.LanePage(r.Context(), adminapi.LaneFilter{State: s, Route: p.Route, MessageID: p.MessageID,
			ByMessage: c.byMessage(p), Limit: pageSize})
		if err != nil {
			return nil, "", err
		}
		all = append(all, page.Entries...)
	}
	slices.SortFunc(all, func(a, b adminapi.LaneEntry) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return c.rows(all), "", nil
}

func (c *Console) rows(entries []adminapi.LaneEntry) []laneRow {
	now := c.o.Now()
	out := make([]laneRow, len(entries))
	for i, e := range entries {
		out[i] = laneRow{LaneEntry: e, Age: age(now, e.CreatedAt), InLaneSince: age(now, e.UpdatedAt)}
	}
	return out
}

func groupCounts(routes []string, counts []adminapi.LaneCount, outbox bool) []routeCounts {
	out := make([]routeCounts, 0, len(routes))
	for _, route := range routes {
		rc := routeCounts{Route: route}
		for _, l := range lanes {
			rc.Cells = append(rc.Cells, cell(counts, route, string(l.State)))
		}
		if outbox {
			rc.Cells = append(rc.Cells, cell(counts, route, adminapi.LaneOutbox))
		}
		out = append(out, rc)
	}
	return out
}

func cell(counts []adminapi.LaneCount, route, lane string) countCell {
	for _, n := range counts {
		if n.Route == route && n.Lane == lane {
			return countCell{Lane: lane, N: n.N, Capped: n.Capped}
		}
	}
	return countCell{Lane: lane}
}

type outboxPage struct {
	Routes  []string
	Route   string
	Cursor  string
	Entries []outboxRow
	Next    string
	Problem string
	Done    string
}

type outboxRow struct {
	adminapi.OutboxRow
	Age string
	// Open: the relay still takes the entry up, so it may be made due now
	// or cancelled; otherwise its operation waits in a lane.
	Open bool
}

// outbox: a handoff route's entries that the relay has not delivered yet,
// the soonest due first. Ids and schedule only: never the message.
func (c *Console) outbox(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := outboxPage{Routes: c.routeNames(), Route: q.Get("route"), Cursor: q.Get("cursor")}
	switch q.Get("done") {
	case "retried":
		p.Done = "Recorded: the entry of " + gate.Bound(q.Get("op"), 64) + " is due now; the relay's next pass takes it up."
	case "cancelled":
		p.Done = "Recorded: the entry of " + gate.Bound(q.Get("op"), 64) + " is out of the relay's queue; its operation is in the terminal lane, where a replay hands it back."
	}
	for _, v := range []string{p.Route, p.Cursor} {
		if len(v) > 1024 || gate.Unstorable(v) != "" {
			c.render(w, r, http.StatusBadRequest, "error.html", errorPage{Title: "Bad filter", Message: "A filter is too long or holds characters the ledger cannot."})
			return
		}
	}
	status := http.StatusOK
	page, err := c.o.Ledger.OutboxPage(r.Context(), adminapi.OutboxFilter{Route: p.Route, Cursor: p.Cursor, Limit: pageSize})
	switch {
	case errors.Is(err, adminapi.ErrInvalidFilter):
		p.Problem, status = "That page link is not valid any more; start from the first page.", http.StatusBadRequest
	case err != nil:
		c.o.Logger.ErrorContext(r.Context(), "console: outbox failed", "err", err)
		p.Problem, status = "The ledger did not answer.", http.StatusServiceUnavailable
	}
	now := c.o.Now()
	for _, e := range page.Entries {
		p.Entries = append(p.Entries, outboxRow{OutboxRow: e, Age: age(now, e.CreatedAt), Open: open(e.State)})
	}
	p.Next = page.Next
	c.render(w, r, status, "outbox.html", p)
}

type routesPage struct {
	Routes []routeHead
	Rows   []contractRow
}

type routeHead struct {
	Name  string
	Shape gate.Shape
}

// contractRow is one field of the contracts, with each route's value in
// the order of Routes.
type contractRow struct {
	Name  string
	Cells []contractCell
}

type contractCell struct {
	Route string
	Value string
	// Unused: the field has a value but this route's shape does not apply it.
	Unused bool
}

type contractField struct {
	Name  string
	Value string
}

// routesPage: every route's contract as GET /v1/routes shows it, in one
// table, a field per row and a route per column, so routes compare at a
// glance: nested fields flattened ("effect · timeout"), values as the
// routes file spells them (durations as Go durations, lists joined), the
// effect's header values hidden since they often carry the downstream's
// credentials.
func (c *Console) routesPage(w http.ResponseWriter, r *http.Request) {
	var p routesPage
	values := map[string]map[string]string{} // field → route → value
	for _, rt := range c.o.Routes {
		v := *rt
		if len(rt.Effect.Headers) > 0 {
			v.Effect.Headers = make(map[string]string, len(rt.Effect.Headers))
			for k := range rt.Effect.Headers {
				v.Effect.Headers[k] = "(redacted)"
			}
		}
		raw, err := json.Marshal(v)
		var doc map[string]any
		if err == nil {
			// Numbers as written: a float64 would print a large limit as 1e+06.
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.UseNumber()
			err = dec.Decode(&doc)
		}
		if err != nil {
			c.o.Logger.ErrorContext(r.Context(), "console: route contract", "route", rt.Name, "err", err)
			continue
		}
		p.Routes = append(p.Routes, routeHead{Name: rt.Name, Shape: rt.Shape})
		var fields []contractField
		flatten(&fields, "", doc)
		for _, f := range fields {
			if f.Name == "name" {
				continue // the column's heading
			}
			if values[f.Name] == nil {
				values[f.Name] = map[string]string{}
			}
			values[f.Name][rt.Name] = f.Value
		}
	}
	for _, name := range sortedKeys(values) {
		row := contractRow{Name: name}
		for _, rt := range p.Routes {
			v, ok := values[name][rt.Name]
			if !ok {
				v = "—"
			}
			// The provider's dedupe window is what an idempotent shape relies
			// on; on any other shape a zero there means nothing.
			unused := name == "dedupe_window" && rt.Shape != gate.ShapeIdempotent
			row.Cells = append(row.Cells, contractCell{Route: rt.Name, Value: v, Unused: unused})
		}
		p.Rows = append(p.Rows, row)
	}
	c.render(w, r, http.StatusOK, "routes.html", p)
}

// flatten appends v's leaves as rows, objects by their keys in order.
func flatten(out *[]contractField, name string, v any) {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 0 {
			*out = append(*out, contractField{Name: name, Value: "—"})
		}
		for _, k := range sortedKeys(x) {
			n := k
			if name != "" {
				n = name + " · " + k
			}
			flatten(out, n, x[k])
		}
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = scalar(e)
		}
		*out = append(*out, contractField{Name: name, Value: strings.Join(parts, ", ")})
	default:
		*out = append(*out, contractField{Name: name, Value: scalar(x)})
	}
}

// scalar spells a JSON value for a person: strings without quotes.
func scalar(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case nil:
		return "—"
	case map[string]any, []any:
		b, _ := json.Marshal(x)
		return string(b)
	}
	return fmt.Sprint(v)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
