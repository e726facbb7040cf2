package console_test

import (
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/console"
	"github.com/ackgate/ackgate/gate"
)

// client talks to the console like a browser without script would, with
// cookies handled by hand so a test decides exactly what each request
// carries.
type client struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newClient(t *testing.T, base string) *client {
	return &client{t: t, base: base, hc: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

type resp struct {
	status  int
	header  http.Header
	body    string
	cookies []*http.Cookie
}

func (c *client) do(method, path string, form url.Values, cookies []*http.Cookie, header map[string]string) resp {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	for _, ck := range cookies {
		req.AddCookie(&http.Cookie{Name: ck.Name, Value: ck.Value})
	}
	r, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return resp{status: r.StatusCode, header: r.Header, body: string(b), cookies: r.Cookies()}
}

func cookie(cs []*http.Cookie, name string) *http.Cookie {
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	return nil
}

var (
	loginNonceRE = regexp.MustCompile(`name="login_csrf" value="([^"]+)"`)
	csrfRE       = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
)

// loginForm fetches the login form: its nonce, and the cookie that
// carries it.
func (c *client) loginForm() (string, *http.Cookie) {
	c.t.Helper()
	form := c.do(http.MethodGet, "/console/login", nil, nil, nil)
	m := loginNonceRE.FindStringSubmatch(form.body)
	if form.status != http.StatusOK || m == nil || cookie(form.cookies, "ackgate_console_login") == nil {
		c.t.Fatalf("login form: %d %v\n%s", form.status, form.cookies, form.body)
	}
	return m[1], cookie(form.cookies, "ackgate_console_login")
}

// login goes through the form as a browser would and returns the session
// cookie and the page's CSRF token.
func (c *client) login(token string) (resp, *http.Cookie, string) {
	c.t.Helper()
	nonce, ck := c.loginForm()
	r := c.do(http.MethodPost, "/console/login", url.Values{"login_csrf": {nonce}, "token": {token}}, []*http.Cookie{ck}, nil)
	s := cookie(r.cookies, "ackgate_console")
	if s == nil || s.Value == "" {
		return r, nil, ""
	}
	page := c.do(http.MethodGet, "/console/lanes", nil, []*http.Cookie{s}, nil)
	cm := csrfRE.FindStringSubmatch(page.body)
	if page.status != http.StatusOK || cm == nil {
		c.t.Fatalf("lanes after login: %d\n%s", page.status, page.body)
	}
	return r, s, cm[1]
}

func (e *env) interventions(id string) int {
	return len(e.record(id).Interventions)
}

// A request without the session cookie, or with a missing or wrong CSRF
// token, changes nothing; the metrics token opens nothing; refusals are
// counted like the admin API's.
func TestSessionAndCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil) // the default: Secure cookies
	c := newClient(t, e.admin.URL)
	id := e.indeterminate("sec-1")
	resolvePath := "/console/operations/" + id + "/resolve"
	valid := url.Values{"kind": {"not_happened"}, "reason": {"checked with the provider"}}

	unchanged := func(what string) {
		t.Helper()
		rec := e.record(id)
		if rec.Operation.State != gate.StateEffectIndeterminate || len(rec.Interventions) != 0 {
			t.Fatalf("%s changed the ledger: %s, %d interventions", what, rec.Operation.State, len(rec.Interventions))
		}
	}

	// No session: pages send to the login form, a POST is refused.
	if r := c.do(http.MethodGet, "/console/lanes", nil, nil, nil); r.status != http.StatusSeeOther || r.header.Get("Location") != "/console/login" {
		t.Fatalf("lanes without a session: %d %s", r.status, r.header.Get("Location"))
	}
	if r := c.do(http.MethodPost, resolvePath, valid, nil, nil); r.status != http.StatusForbidden {
		t.Fatalf("resolve without a session: %d", r.status)
	}
	unchanged("a POST without a session")
	// A bearer token is not a session: neither the admin nor the metrics token opens a page.
	for _, tok := range []string{adminToken, metricsToken} {
		if r := c.do(http.MethodGet, "/console/lanes", nil, nil, map[string]string{"Authorization": "Bearer " + tok}); r.status != http.StatusSeeOther {
			t.Fatalf("bearer token opened the console: %d", r.status)
		}
	}

	// The metrics token, and a wrong token, do not log in, and are counted.
	for _, tok := range []string{metricsToken, "wrong-token-0123456789", ""} {
		r, s, _ := c.login(tok)
		if r.status != http.StatusUnauthorized || s != nil {
			t.Fatalf("login with %q: %d, session %v", tok, r.status, s)
		}
	}
	metrics := c.do(http.MethodGet, "/metrics", nil, nil, map[string]string{"Authorization": "Bearer " + metricsToken})
	if !regexp.MustCompile(`ackgate_admin_auth_failures_total\{[^}]*endpoint="console"[^}]*reason="wrong_token"[^}]*\} 2`).MatchString(metrics.body) ||
		!regexp.MustCompile(`ackgate_admin_auth_failures_total\{[^}]*endpoint="console"[^}]*reason="missing"[^}]*\} 1`).MatchString(metrics.body) {
		t.Fatalf("console login refusals not counted:\n%s", grep(metrics.body, "auth_failures"))
	}

	// The login form's own CSRF value must match its cookie.
	form := c.do(http.MethodGet, "/console/login", nil, nil, nil)
	if r := c.do(http.MethodPost, "/console/login", url.Values{"login_csrf": {"forged"}, "token": {adminToken}},
		[]*http.Cookie{cookie(form.cookies, "ackgate_console_login")}, nil); r.status != http.StatusForbidden || cookie(r.cookies, "ackgate_console") != nil {
		t.Fatalf("login with a forged login_csrf: %d", r.status)
	}
	if r := c.do(http.MethodPost, "/console/login", url.Values{"login_csrf": {loginNonceRE.FindStringSubmatch(form.body)[1]}, "token": {adminToken}},
		nil, nil); r.status != http.StatusForbidden || cookie(r.cookies, "ackgate_console") != nil {
		t.Fatalf("login without the login cookie: %d", r.status)
	}

	// A real login: the cookie's attributes.
	r, sess, csrf := c.login(tokenOf("alice"))
	if r.status != http.StatusSeeOther || sess == nil {
		t.Fatalf("login: %d\n%s", r.status, r.body)
	}
	if !sess.HttpOnly || !sess.Secure || sess.SameSite != http.SameSiteStrictMode || sess.MaxAge <= 0 || sess.Path != "/console/" {
		t.Fatalf("session cookie attributes: %+v", sess)
	}
	// A second session, whose CSRF token must not work in the first.
	_, sess2, csrf2 := c.login(tokenOf("bob"))
	if csrf2 == csrf {
		t.Fatal("two sessions share a CSRF token")
	}

	for _, tc := range []struct {
		name    string
		form    url.Values
		cookies []*http.Cookie
		header  map[string]string
	}{
		{"no CSRF token", valid, []*http.Cookie{sess}, nil},
		{"a wrong CSRF token", with(valid, "csrf", "AAAA"+csrf[4:]), []*http.Cookie{sess}, nil},
		{"another session's CSRF token", with(valid, "csrf", csrf2), []*http.Cookie{sess}, nil},
		{"a tampered cookie", with(valid, "csrf", csrf), []*http.Cookie{{Name: "ackgate_console", Value: tamper(sess.Value)}}, nil},
		{"a cross-site request", with(valid, "csrf", csrf), []*http.Cookie{sess}, map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"a foreign origin", with(valid, "csrf", csrf), []*http.Cookie{sess}, map[string]string{"Origin": "https://evil.example"}},
	} {
		r := c.do(http.MethodPost, resolvePath, tc.form, tc.cookies, tc.header)
		if r.status != http.StatusForbidden {
			t.Fatalf("%s: %d, want 403\n%s", tc.name, r.status, r.body)
		}
		unchanged(tc.name)
	}
	// Logging out needs the token too.
	if r := c.do(http.MethodPost, "/console/logout", url.Values{}, []*http.Cookie{sess2}, nil); r.status != http.StatusForbidden {
		t.Fatalf("logout without CSRF: %d", r.status)
	}

	// With both, the resolution goes through the gate, as alice.
	r = c.do(http.MethodPost, resolvePath, with(valid, "csrf", csrf), []*http.Cookie{sess}, nil)
	if r.status != http.StatusSeeOther || !strings.HasSuffix(r.header.Get("Location"), "?done=changed") {
		t.Fatalf("resolve: %d %s\n%s", r.status, r.header.Get("Location"), r.body)
	}
	rec := e.record(id)
	if rec.Operation.State != gate.StatePendingEffect || len(rec.Interventions) != 1 ||
		rec.Interventions[0].Actor != "console:alice" || rec.Interventions[0].Kind != gate.ResolveNotHappened ||
		rec.Interventions[0].Reason != "checked with the provider" {
		t.Fatalf("after resolve: %s %+v", rec.Operation.State, rec.Interventions)
	}
	// The gate's rules hold: a reason is required, and the same state does
	// not take the resolution twice.
	id2 := e.indeterminate("sec-2")
	r = c.do(http.MethodPost, "/console/operations/"+id2+"/resolve", url.Values{"kind": {"abandon"}, "reason": {"  "}, "csrf": {csrf}}, []*http.Cookie{sess}, nil)
	if r.status != http.StatusBadRequest || e.interventions(id2) != 0 || !strings.Contains(r.body, "reason is required") {
		t.Fatalf("resolution without a reason: %d\n%s", r.status, grep(r.body, "problem"))
	}
	// An operator's text is kept as written or refused, never repaired.
	r = c.do(http.MethodPost, "/console/operations/"+id2+"/resolve", url.Values{"kind": {"abandon"}, "reason": {"checked \xff"}, "csrf": {csrf}}, []*http.Cookie{sess}, nil)
	if r.status != http.StatusBadRequest || e.interventions(id2) != 0 || !strings.Contains(r.body, "not valid UTF-8") {
		t.Fatalf("resolution with a reason that is not UTF-8: %d\n%s", r.status, grep(r.body, "problem"))
	}
	r = c.do(http.MethodPost, resolvePath, url.Values{"kind": {"abandon"}, "reason": {"again"}, "csrf": {csrf}}, []*http.Cookie{sess}, nil)
	if r.status != http.StatusConflict || e.interventions(id) != 1 {
		t.Fatalf("abandoning a pending operation: %d\n%s", r.status, grep(r.body, "problem"))
	}

	// Replaying a dead letter: the same form handler, the gate's replay.
	id3 := e.indeterminate("sec-3")
	if _, _, err := e.gw.Gate.Resolve(t.Context(), id3, gate.Resolution{Kind: gate.ResolveAbandon, Reason: "setup", Actor: "test:setup"}); err != nil {
		t.Fatal(err)
	}
	page := c.do(http.MethodGet, "/console/operations/"+id3, nil, []*http.Cookie{sess}, nil)
	if !strings.Contains(page.body, `id="replay"`) || strings.Contains(page.body, `id="resolve"`) {
		t.Fatalf("a terminal operation's page does not offer replay (and only replay or happened)")
	}
	r = c.do(http.MethodPost, "/console/operations/"+id3+"/resolve", url.Values{"kind": {"replay"}, "reason": {"downstream fixed"}}, []*http.Cookie{sess}, nil)
	if r.status != http.StatusForbidden || e.record(id3).Operation.State != gate.StateTerminalFailure {
		t.Fatalf("replay without CSRF: %d", r.status)
	}
	r = c.do(http.MethodPost, "/console/operations/"+id3+"/resolve", url.Values{"kind": {"replay"}, "reason": {"downstream fixed"}, "csrf": {csrf}}, []*http.Cookie{sess}, nil)
	if rec := e.record(id3); r.status != http.StatusSeeOther || rec.Operation.State != gate.StatePendingEffect ||
		len(rec.Interventions) != 2 || rec.Interventions[1].Kind != gate.ResolveReplay || rec.Interventions[1].Actor != "console:alice" {
		t.Fatalf("replay: %d, %s %+v", r.status, rec.Operation.State, rec.Interventions)
	}

	// Logout ends the session on the server: the browser's cookie is
	// dropped, and the same cookie sent again opens nothing.
	r = c.do(http.MethodPost, "/console/logout", url.Values{"csrf": {csrf}}, []*http.Cookie{sess}, nil)
	if out := cookie(r.cookies, "ackgate_console"); r.status != http.StatusSeeOther || out == nil || out.MaxAge >= 0 {
		t.Fatalf("logout: %d %+v", r.status, out)
	}
	if r := c.do(http.MethodGet, "/console/lanes", nil, []*http.Cookie{sess}, nil); r.status != http.StatusSeeOther || r.header.Get("Location") != "/console/login" {
		t.Fatalf("the logged-out cookie still opens pages: %d", r.status)
	}
	id4 := e.indeterminate("sec-4")
	if r := c.do(http.MethodPost, "/console/operations/"+id4+"/resolve", with(valid, "csrf", csrf), []*http.Cookie{sess}, nil); r.status != http.StatusForbidden || e.interventions(id4) != 0 {
		t.Fatalf("the logged-out cookie still resolves: %d", r.status)
	}
	// bob's session is not alice's: still open.
	if r := c.do(http.MethodGet, "/console/lanes", nil, []*http.Cookie{sess2}, nil); r.status != http.StatusOK {
		t.Fatalf("another session after a logout: %d", r.status)
	}
}

func with(v url.Values, k, val string) url.Values {
	out := url.Values{}
	for key, vs := range v {
		out[key] = append([]string(nil), vs...)
	}
	out.Set(k, val)
	return out
}

func grep(s, word string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Every page carries the policy, none has a script, and none shows message
// data or the downstream's credentials: only ids and fingerprints.
func TestPagesShowNoMessageDataAndNoScript(t *testing.T) {
	t.Parallel()
	e := newEnv(t, map[string]string{"GATEWAY_CONSOLE_ALLOW_HTTP": "true"})
	c := newClient(t, e.admin.URL)
	okID := e.confirmed("data-1")
	lostID := e.indeterminate("data-2")
	_, sess, _ := c.login(tokenOf("carol"))
	if sess == nil || sess.Secure {
		t.Fatalf("with GATEWAY_CONSOLE_ALLOW_HTTP the cookie is not Secure: %+v", sess)
	}
	secrets := []string{"SECRET-PAYLOAD-77", "4111-SECRET", "downstream-credential-never-shown", adminToken, metricsToken, tokenOf("carol")}
	for _, p := range []string{"/console/lanes", "/console/lanes?state=effect_indeterminate&route=payments",
		"/console/lanes?message_id=data-1", "/console/outbox", "/console/routes", "/console/poison",
		"/console/search", "/console/search?by=message_id&q=data-2", "/console/search?by=key&q=data-1",
		"/console/operations/" + okID, "/console/operations/" + lostID, "/console/login", "/console/nowhere"} {
		r := c.do(http.MethodGet, p, nil, []*http.Cookie{sess}, nil)
		if r.status != http.StatusOK && !(p == "/console/nowhere" && r.status == http.StatusNotFound) && !(p == "/console/login" && r.status == http.StatusSeeOther) {
			t.Fatalf("%s: %d\n%s", p, r.status, r.body)
		}
		if got := r.header.Get("Content-Security-Policy"); got != console.ContentSecurityPolicy || !strings.Contains(got, "default-src 'none'") {
			t.Fatalf("%s: CSP %q", p, got)
		}
		if strings.Contains(strings.ToLower(r.body), "<script") || strings.Contains(r.body, " style=") {
			t.Fatalf("%s has a script or an inline style", p)
		}
		for _, s := range secrets {
			if strings.Contains(r.body, s) {
				t.Fatalf("%s shows %q", p, s)
			}
		}
	}
	// The message id finds the operation whatever its state.
	if r := c.do(http.MethodGet, "/console/lanes?message_id=data-1", nil, []*http.Cookie{sess}, nil); !strings.Contains(r.body, okID) {
		t.Fatalf("search by message id did not find %s", okID)
	}
	// The record's fingerprint is shown, the trace id links to the viewer.
	rec := e.record(okID)
	r := c.do(http.MethodGet, "/console/operations/"+okID, nil, []*http.Cookie{sess}, nil)
	if !strings.Contains(r.body, rec.Operation.Fingerprint) || rec.Operation.TraceID == "" ||
		!strings.Contains(r.body, `href="https://traces.example/trace/`+rec.Operation.TraceID+`"`) {
		t.Fatalf("operation page lacks the fingerprint or the trace link\n%s", grep(r.body, "trace"))
	}
	if r := c.do(http.MethodGet, "/console/operations/op_nope", nil, []*http.Cookie{sess}, nil); r.status != http.StatusNotFound {
		t.Fatalf("unknown operation: %d", r.status)
	}
	if r := c.do(http.MethodGet, "/console/lanes?cursor=%25%25", nil, []*http.Cookie{sess}, nil); r.status != http.StatusBadRequest {
		t.Fatalf("bad cursor: %d", r.status)
	}
	if r := c.do(http.MethodGet, "/console/static/console.css", nil, nil, nil); r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "text/css") {
		t.Fatalf("stylesheet: %d %s", r.status, r.header.Get("Content-Type"))
	}
	if r := c.do(http.MethodGet, "/console/static/", nil, nil, nil); r.status != http.StatusNotFound {
		t.Fatalf("static directory listing: %d", r.status)
	}
	// The JSON admin API beside the console is unchanged.
	if r := c.do(http.MethodGet, "/v1/operations/"+okID, nil, nil, map[string]string{"Authorization": "Bearer " + adminToken}); r.status != http.StatusOK {
		t.Fatalf("admin API: %d", r.status)
	}
}

// A login form logs in once: posting the same form (nonce and cookie) a
// second time is refused, even with the right token, so a captured form
// cannot be replayed to guess tokens.
func TestLoginFormIsSingleUse(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	c := newClient(t, e.admin.URL)
	nonce, ck := c.loginForm()
	post := func(token string) resp {
		return c.do(http.MethodPost, "/console/login", url.Values{"login_csrf": {nonce}, "token": {token}}, []*http.Cookie{ck}, nil)
	}
	if r := post("wrong-token-0123456789"); r.status != http.StatusUnauthorized {
		t.Fatalf("first post, wrong token: %d", r.status)
	}
	for i := range 3 {
		if r := post(tokenOf("alice")); r.status != http.StatusForbidden || cookie(r.cookies, "ackgate_console") != nil {
			t.Fatalf("post %d of a used form: %d, session %v", i+2, r.status, cookie(r.cookies, "ackgate_console"))
		}
	}
	// A used form is used on every replica.
	other := newClient(t, e.replica(nil).URL)
	if r := other.do(http.MethodPost, "/console/login", url.Values{"login_csrf": {nonce}, "token": {tokenOf("alice")}}, []*http.Cookie{ck}, nil); r.status != http.StatusForbidden {
		t.Fatalf("a used form on another replica: %d", r.status)
	}
	// A fresh form logs in.
	if _, s, _ := c.login(tokenOf("alice")); s == nil {
		t.Fatal("a fresh form did not log in")
	}
}

// Failed logins are limited per client address and overall: past the
// limit a login is refused (429, Retry-After) before the token is looked
// at, even the right one, and the refusal is counted.
func TestLoginIsRateLimited(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	c := newClient(t, e.admin.URL)
	limited := 0
	for i := range 15 {
		r, s, _ := c.login("guess-token-0123456789-" + string(rune('a'+i)))
		switch {
		case s != nil:
			t.Fatalf("guess %d logged in", i)
		case r.status == http.StatusTooManyRequests:
			limited++
			if r.header.Get("Retry-After") == "" {
				t.Fatalf("429 without Retry-After")
			}
		case r.status != http.StatusUnauthorized:
			t.Fatalf("guess %d: %d", i, r.status)
		}
	}
	if limited != 5 {
		t.Fatalf("%d of 15 guesses refused unchecked, want the 5 past the limit of 10", limited)
	}
	if r, s, _ := c.login(tokenOf("alice")); r.status != http.StatusTooManyRequests || s != nil {
		t.Fatalf("the right token from a limited address: %d, session %v", r.status, s)
	}
	// The limit is the address's, for the admin API too (the same
	// credentials): even the metrics token is not checked from here now.
	if r := c.do(http.MethodGet, "/metrics", nil, nil, map[string]string{"Authorization": "Bearer " + metricsToken}); r.status != http.StatusTooManyRequests {
		t.Fatalf("a scrape from the limited address: %d", r.status)
	}
	metrics := e.metrics()
	if !regexp.MustCompile(`ackgate_admin_auth_failures_total\{[^}]*endpoint="console"[^}]*reason="rate_limited"[^}]*\} 6`).MatchString(metrics) ||
		!regexp.MustCompile(`ackgate_admin_auth_failures_total\{[^}]*endpoint="console"[^}]*reason="wrong_token"[^}]*\} 10`).MatchString(metrics) {
		t.Fatalf("refused logins not counted:\n%s", grep(metrics, "auth_failures"))
	}
}

// A session ends with its credential: once the operator's token is
// rotated (or the credential removed), the session it opened opens nothing,
// while other operators' sessions go on.
func TestTokenRotationEndsSessions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	c := newClient(t, e.admin.URL)
	_, alice, _ := c.login(tokenOf("alice"))
	_, bob, _ := c.login(tokenOf("bob"))
	rotated := newClient(t, e.replica(map[string]string{
		"GATEWAY_ADMIN_TOKENS": "alice=alice-rotated-token-0123,bob=" + tokenOf("bob") + ",carol=" + tokenOf("carol"),
	}).URL)
	if r := rotated.do(http.MethodGet, "/console/lanes", nil, []*http.Cookie{alice}, nil); r.status != http.StatusSeeOther {
		t.Fatalf("alice's session after her token was rotated: %d", r.status)
	}
	// Ended for good: not even the replica with the old token opens it.
	if r := c.do(http.MethodGet, "/console/lanes", nil, []*http.Cookie{alice}, nil); r.status != http.StatusSeeOther {
		t.Fatalf("alice's ended session on the old replica: %d", r.status)
	}
	if r := rotated.do(http.MethodGet, "/console/lanes", nil, []*http.Cookie{bob}, nil); r.status != http.StatusOK {
		t.Fatalf("bob's session, whose token did not change: %d", r.status)
	}
	removed := newClient(t, e.replica(map[string]string{"GATEWAY_ADMIN_TOKENS": "carol=" + tokenOf("carol")}).URL)
	if r := removed.do(http.MethodGet, "/console/lanes", nil, []*http.Cookie{bob}, nil); r.status != http.StatusSeeOther {
		t.Fatalf("bob's session after his credential was removed: %d", r.status)
	}
	if _, s, _ := rotated.login("alice-rotated-token-0123"); s == nil {
		t.Fatal("the rotated token does not log in")
	}
}

// tamper changes the first character of a cookie value.
func tamper(v string) string {
	if v[0] == 'x' {
		return "y" + v[1:]
	}
	return "x" + v[1:]
}
