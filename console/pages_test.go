package console_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/gate"
)

// section is the part of body from the element with id from up to the one
// with id to ("" when either is missing).
func section(body, from, to string) string {
	i := strings.Index(body, `id="`+from+`"`)
	j := strings.Index(body, `id="`+to+`"`)
	if i < 0 || j < i {
		return ""
	}
	return body[i:j]
}

// The operation page leads with the answer: the completion statement and
// the actions come before the evidence card; every edge of the card carries
// the time its step took; the attempts are coloured by what they showed.
func TestOperationPageLeadsWithTheAnswer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, map[string]string{"GATEWAY_CONSOLE_ALLOW_HTTP": "true"})
	c := newClient(t, e.admin.URL)
	okID := e.confirmed("lead-1")
	lost := e.indeterminate("lead-2")
	_, sess, _ := c.login(tokenOf("alice"))
	get := func(path string) string {
		t.Helper()
		r := c.do(http.MethodGet, path, nil, []*http.Cookie{sess}, nil)
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d\n%s", path, r.status, r.body)
		}
		return r.body
	}

	page := get("/console/operations/" + lost)
	st, act, card := strings.Index(page, `id="statement"`), strings.Index(page, `id="resolve"`), strings.Index(page, `id="card"`)
	if st < 0 || act < 0 || card < 0 || !(st < act && act < card) {
		t.Fatalf("statement at %d, resolve form at %d, card at %d: want them in that order", st, act, card)
	}
	// Its only attempt's outcome is unknown: amber, never green.
	attempts := regexp.MustCompile(`class="node (\w+)" data-node="attempts"`).FindStringSubmatch(page)
	if attempts == nil || attempts[1] != "warn" {
		t.Fatalf("attempts node of an operation whose only attempt is unknown: %v", attempts)
	}
	if !regexp.MustCompile(`data-edge="indeterminate">[0-9.]+(µs|ms|s)<`).MatchString(page) {
		t.Fatalf("the indeterminate branch's edge has no duration:\n%s", grep(page, "data-edge"))
	}

	page = get("/console/operations/" + okID)
	if attempts := regexp.MustCompile(`class="node (\w+)" data-node="attempts"`).FindStringSubmatch(page); attempts == nil || attempts[1] != "done" {
		t.Fatalf("attempts node of a confirmed operation: %v", attempts)
	}
	edges := regexp.MustCompile(`data-edge="(\w+)">([^<]*)<`).FindAllStringSubmatch(page, -1)
	got := map[string]string{}
	for _, m := range edges {
		got[m[1]] = m[2]
	}
	for _, k := range []string{"intent", "reservation", "attempts", "evidence", "committed", "ack"} {
		if !regexp.MustCompile(`^[0-9.]+(µs|ms|s|m[0-9.]*s?)$`).MatchString(got[k]) {
			t.Errorf("edge into %s: %q, want a duration (all: %v)", k, got[k], got)
		}
	}
	if strings.Index(page, `id="statement"`) > strings.Index(page, `id="card"`) {
		t.Errorf("the completion statement comes after the card")
	}
	if !regexp.MustCompile(`<td class="dur">\+[0-9.]+(µs|ms|s)</td>`).MatchString(get("/console/operations/" + lost)) {
		t.Errorf("the transitions table has no durations")
	}
}

// Search finds an operation by the key the route drew from the message,
// typed in clear even where the ledger keeps only its keyed hash, and by
// any delivery's message id; the poison page lists what never became an
// operation; the route contracts are tables of plain values.
func TestSearchPoisonAndRoutePages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, map[string]string{"GATEWAY_CONSOLE_ALLOW_HTTP": "true"})
	c := newClient(t, e.admin.URL)
	const email = "jo@example.com"
	refund, status := e.push("refunds", "refund-1", `{"amount": 5}`, map[string]string{"customer_email": email})
	if status != http.StatusNoContent {
		t.Fatalf("refund: %d", status)
	}
	// The same refund again under another message id: a redelivery of the
	// same operation, its message id kept with the further deliveries.
	if again, status := e.push("refunds", "refund-1-again", `{"amount": 5}`, map[string]string{"customer_email": email}); again != refund || status != http.StatusNoContent {
		t.Fatalf("redelivery: %s %d", again, status)
	}
	if rec := e.record(refund); strings.Contains(rec.Operation.Key, email) || !strings.HasPrefix(rec.Operation.Key, gate.HashedKeyPrefix) {
		t.Fatalf("the ledger keeps the key %q", rec.Operation.Key)
	}
	order := e.confirmed("order-77")
	// No customer_email: no usable identity, kept as poison.
	e.pushPoison("refunds", "refund-bad")
	_, sess, _ := c.login(tokenOf("bob"))
	get := func(path string) string {
		t.Helper()
		r := c.do(http.MethodGet, path, nil, []*http.Cookie{sess}, nil)
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d\n%s", path, r.status, r.body)
		}
		return r.body
	}
	found := func(path string) string {
		t.Helper()
		body := get(path)
		i := strings.Index(body, `id="results"`)
		if i < 0 {
			t.Fatalf("%s: no results table", path)
		}
		return body[i:]
	}
	if r := found("/console/search?by=key&q=" + url.QueryEscape(email)); !strings.Contains(r, refund) {
		t.Fatalf("search by a private key in clear did not find %s:\n%s", refund, r)
	}
	if r := found("/console/search?by=key&route=orders&q=" + url.QueryEscape(email)); strings.Contains(r, refund) {
		t.Fatalf("search on another route found %s", refund)
	}
	if r := found("/console/search?by=key&q=order-77"); !strings.Contains(r, order) {
		t.Fatalf("search by a message-id key did not find %s", order)
	}
	if r := found("/console/search?by=message_id&q=refund-1-again"); !strings.Contains(r, refund) {
		t.Fatalf("search by a further delivery's message id did not find %s", refund)
	}
	if r := found("/console/search?by=message_id&q=refund-1"); !strings.Contains(r, refund) {
		t.Fatalf("search by the first delivery's message id did not find %s", refund)
	}
	if r := found("/console/search?by=message_id&q=nobody-sent-this"); !strings.Contains(r, "No operation has that message id") {
		t.Fatalf("an unknown message id:\n%s", r)
	}

	poison := get("/console/poison")
	if i := strings.Index(poison, `id="entries"`); i < 0 || !strings.Contains(poison[i:], "refund-bad") || !strings.Contains(poison[i:], "refunds") {
		t.Fatalf("poison page lacks the refund without a key:\n%s", poison)
	}

	routes := get("/console/routes")
	if strings.Contains(routes, "&#34;") || strings.Contains(routes, `"0s"`) {
		t.Fatalf("the route contracts show quoted JSON values:\n%s", grep(routes, "0s"))
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`<td class="mono unused" data-route="payments" data-field="dedupe_window">0s <span class="hint">\(not used by this shape\)`),
		regexp.MustCompile(`<td class="mono" data-route="orders" data-field="dedupe_window">1h0m0s</td>`),
		regexp.MustCompile(`<td class="mono" data-route="orders" data-field="effect · timeout">\d+s</td>`),
		regexp.MustCompile(`<td class="mono" data-route="shipments" data-field="handoff · retry_max">1m0s</td>`),
		regexp.MustCompile(`<td class="mono" data-route="orders" data-field="handoff · retry_max">—</td>`),
		regexp.MustCompile(`<td class="mono" data-route="payments" data-field="effect · headers · Authorization">\(redacted\)</td>`),
	} {
		if !want.MatchString(routes) {
			t.Errorf("route contracts lack %s:\n%s", want, grep(routes, "data-field"))
		}
	}
}

// Retry-now and cancel of an outbox entry, from the outbox page: each needs
// the session's CSRF token and a reason, is recorded under the operator's
// name, and cancel leaves the operation in the terminal lane, never done.
func TestOutboxActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, map[string]string{"GATEWAY_CONSOLE_ALLOW_HTTP": "true"})
	c := newClient(t, e.admin.URL)
	id := e.handedOff("ship-1")
	other := e.handedOff("ship-2")
	_, sess, csrf := c.login(tokenOf("alice"))
	ck := []*http.Cookie{sess}
	page := c.do(http.MethodGet, "/console/outbox", nil, ck, nil)
	if page.status != http.StatusOK || !strings.Contains(page.body, `action="/console/outbox/`+id+`/retry"`) ||
		!strings.Contains(page.body, `formaction="/console/outbox/`+id+`/cancel"`) {
		t.Fatalf("outbox page has no actions for %s:\n%s", id, page.body)
	}
	post := func(path string, form url.Values) resp {
		t.Helper()
		return c.do(http.MethodPost, path, form, ck, nil)
	}

	// Refused before anything is written: no CSRF token, a wrong one, no reason.
	for _, f := range []url.Values{{"reason": {"r"}}, {"csrf": {"x" + csrf}, "reason": {"r"}}} {
		if r := post("/console/outbox/"+id+"/retry", f); r.status != http.StatusForbidden {
			t.Fatalf("retry without the CSRF token: %d", r.status)
		}
		if r := post("/console/outbox/"+id+"/cancel", f); r.status != http.StatusForbidden {
			t.Fatalf("cancel without the CSRF token: %d", r.status)
		}
	}
	if r := post("/console/outbox/"+id+"/cancel", url.Values{"csrf": {csrf}, "reason": {" "}}); r.status != http.StatusBadRequest {
		t.Fatalf("cancel without a reason: %d", r.status)
	}
	if n := e.interventions(id); n != 0 {
		t.Fatalf("refused actions left %d interventions", n)
	}

	r := post("/console/outbox/"+id+"/retry", url.Values{"csrf": {csrf}, "reason": {"carrier API is back"}, "route": {"shipments"}})
	if r.status != http.StatusSeeOther || !strings.Contains(r.header.Get("Location"), "done=retried") {
		t.Fatalf("retry: %d %s\n%s", r.status, r.header.Get("Location"), r.body)
	}
	rec := e.record(id)
	if len(rec.Interventions) != 1 || rec.Interventions[0].Kind != gate.OutboxRetryNow || rec.Interventions[0].Actor != "console:alice" ||
		rec.Interventions[0].Reason != "carrier API is back" || rec.Operation.State != gate.StatePendingEffect {
		t.Fatalf("after retry: %s %+v", rec.Operation.State, rec.Interventions)
	}
	if done := c.do(http.MethodGet, r.header.Get("Location"), nil, ck, nil); !strings.Contains(done.body, `id="done"`) {
		t.Fatalf("the outbox page does not confirm the retry")
	}

	r = post("/console/outbox/"+id+"/cancel", url.Values{"csrf": {csrf}, "reason": {"parcel recalled"}})
	if r.status != http.StatusSeeOther {
		t.Fatalf("cancel: %d\n%s", r.status, r.body)
	}
	rec = e.record(id)
	last := rec.Interventions[len(rec.Interventions)-1]
	if rec.Operation.State != gate.StateTerminalFailure || last.Kind != gate.ResolveCancel || last.Actor != "console:alice" ||
		last.Reason != "parcel recalled" || len(rec.DeadLetters) != 1 {
		t.Fatalf("after cancel: %s %+v %+v", rec.Operation.State, last, rec.DeadLetters)
	}
	// The cancelled entry is listed with its state and no actions; the
	// operation is in the terminal lane with its replay.
	page = c.do(http.MethodGet, "/console/outbox", nil, ck, nil)
	row := section(page.body+`id="end"`, "entries", "end")
	if !strings.Contains(row, `action="/console/outbox/`+other+`/retry"`) || strings.Contains(row, `action="/console/outbox/`+id+`/retry"`) ||
		!strings.Contains(row, "terminal failure") {
		t.Fatalf("outbox page after cancel:\n%s", row)
	}
	if lane := c.do(http.MethodGet, "/console/lanes?state=terminal_failure", nil, ck, nil); !strings.Contains(lane.body, id) {
		t.Fatalf("the cancelled operation is not in the terminal lane")
	}
	if op := c.do(http.MethodGet, "/console/operations/"+id, nil, ck, nil); !strings.Contains(op.body, `id="replay"`) || strings.Contains(op.body, `id="outbox-action"`) {
		t.Fatalf("the cancelled operation's page offers no replay, or still the outbox actions")
	}
	// Once more: refused, nothing written.
	if r := post("/console/outbox/"+id+"/retry", url.Values{"csrf": {csrf}, "reason": {"again"}}); r.status != http.StatusConflict {
		t.Fatalf("retry of a cancelled entry: %d", r.status)
	}
	if n := e.interventions(id); n != 2 {
		t.Fatalf("%d interventions, want 2", n)
	}

	// From the operation's own page.
	if op := c.do(http.MethodGet, "/console/operations/"+other, nil, ck, nil); !strings.Contains(op.body, `id="outbox-action"`) {
		t.Fatalf("a handed-off operation's page offers no outbox actions")
	}
	r = post("/console/outbox/"+other+"/retry", url.Values{"csrf": {csrf}, "reason": {"now"}, "from": {"operation"}})
	if r.status != http.StatusSeeOther || !strings.HasPrefix(r.header.Get("Location"), "/console/operations/"+other) {
		t.Fatalf("retry from the operation page: %d %s", r.status, r.header.Get("Location"))
	}
	if rec := e.record(other); len(rec.Interventions) != 1 || rec.Interventions[0].Kind != gate.OutboxRetryNow {
		t.Fatalf("retry from the operation page: %+v", rec.Interventions)
	}
}
