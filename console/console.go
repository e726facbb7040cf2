package console

import (
	"context"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/admincred"
	"github.com/ackgate/ackgate/internal/authlimit"
)

// Ledger is the read model the console needs; storage.Ledger is one.
type Ledger interface {
	// Get answers gate.ErrNotFound for an unknown id.
	Get(ctx context.Context, id string) (*adminapi.Record, error)
	// LanePage answers adminapi.ErrInvalidFilter for a filter it cannot
	// apply (a malformed cursor).
	LanePage(ctx context.Context, f adminapi.LaneFilter) (adminapi.LanePage, error)
	LaneTotals(ctx context.Context, routes []string, states []gate.State) ([]adminapi.LaneCount, error)
	OutboxPage(ctx context.Context, f adminapi.OutboxFilter) (adminapi.OutboxPage, error)
	// List finds operations by key or message id, as GET /v1/operations.
	List(ctx context.Context, f adminapi.ListFilter) ([]gate.Operation, string, error)
}

// PoisonStore lists the messages kept as poison; storage.PoisonLog is one.
type PoisonStore interface {
	List(ctx context.Context, f adminapi.PoisonFilter) ([]adminapi.PoisonRecord, string, error)
}

// OutboxActions makes a handoff outbox entry due at once and records who
// asked; storage.Ledger is one. Cancelling goes through the Resolver.
type OutboxActions interface {
	RetryOutbox(ctx context.Context, id, actor, reason string) error
}

// Resolver applies an operator's resolution; gate.Gate is one.
type Resolver interface {
	Resolve(ctx context.Context, id string, r gate.Resolution) (*gate.Operation, bool, error)
}

// AuthFailureRecorder counts refused credentials; telemetry.Metrics is one.
// A wrong token at the login form is counted like one on the admin API.
type AuthFailureRecorder interface {
	AdminAuthFailed(ctx context.Context, endpoint, reason string)
}

// Options configure the console.
type Options struct {
	// Credentials are what the login form takes: an operator logs in with
	// their own admin token, and the console records their actions under
	// that credential's name. None refuses every login.
	Credentials *admincred.Set
	// Sessions keeps sessions and login nonces for every replica; required.
	Sessions SessionStore
	// AuthLimiter bounds failed logins per client address and overall;
	// share the admin API's. Nil gets one of authlimit.DefaultLimits.
	AuthLimiter *authlimit.Limiter
	Ledger      Ledger
	Resolver    Resolver
	// Poison backs the poison page; without it the page says so.
	Poison PoisonStore
	// Outbox backs an outbox entry's retry-now; without it that is refused.
	Outbox OutboxActions
	Routes []*gate.Route
	Logger *slog.Logger
	// AuthFailures is optional.
	AuthFailures AuthFailureRecorder
	// TraceURL turns a trace id into a link: "{trace_id}" is replaced by
	// the id. Empty shows trace ids as text.
	TraceURL string
	// SessionTTL is how long a login lasts; 0 means DefaultSessionTTL.
	SessionTTL time.Duration
	// AllowHTTP drops the Secure flag from the cookies, for a console
	// reached over plain http on a developer's machine. Browsers do not send
	// Secure cookies over http, except to localhost.
	AllowHTTP bool
	// Now defaults to time.Now.
	Now func() time.Time
}

// DefaultSessionTTL is a working day.
const DefaultSessionTTL = 8 * time.Hour

// Prefix is where the console is served.
const Prefix = "/console/"

// CheckTraceURL reports what is wrong with a trace viewer URL template.
func CheckTraceURL(tmpl string) error {
	if tmpl == "" {
		return nil
	}
	if !strings.Contains(tmpl, "{trace_id}") {
		return errors.New("must contain {trace_id}")
	}
	u, err := url.Parse(strings.ReplaceAll(tmpl, "{trace_id}", "0"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("must be an absolute http or https URL")
	}
	return nil
}

// Console is the console's handler.
type Console struct {
	o        Options
	pages    map[string]*page
	handler  http.Handler
	refusals *rateLog
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// New builds the console. Mount it so that it receives every path under
// Prefix (see Mount).
func New(o Options) (*Console, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.SessionTTL <= 0 {
		o.SessionTTL = DefaultSessionTTL
	}
	if err := CheckTraceURL(o.TraceURL); err != nil {
		return nil, fmt.Errorf("console: trace url: %w", err)
	}
	if o.Sessions == nil {
		return nil, errors.New("console: a session store is required")
	}
	if o.AuthLimiter == nil {
		o.AuthLimiter = authlimit.New(authlimit.DefaultLimits(), o.Now)
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	c := &Console{o: o, pages: pages, refusals: &rateLog{every: 10 * time.Second}}
	c.handler = c.routes()
	return c, nil
}

func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.handler.ServeHTTP(w, r) }

// Mount serves console under Prefix and everything else with other: the
// admin listener's JSON API stays exactly as it was.
func Mount(other http.Handler, console http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/console" || strings.HasPrefix(r.URL.Path, Prefix) {
			console.ServeHTTP(w, r)
			return
		}
		other.ServeHTTP(w, r)
	})
}

func (c *Console) routes() http.Handler {
	static, _ := fs.Sub(staticFS, "static")
	r := chi.NewRouter()
	r.Use(securityHeaders)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		c.render(w, r, http.StatusNotFound, "error.html", errorPage{Title: "Not found", Message: "There is no console page here."})
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		c.render(w, r, http.StatusMethodNotAllowed, "error.html", errorPage{Title: "Method not allowed", Message: "This page does not take that method."})
	})
	r.Get("/console", redirectTo(Prefix))
	files := http.StripPrefix("/console/static/", http.FileServerFS(static))
	r.Get("/console/static/*", func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") { // no directory listings
			http.NotFound(w, r)
			return
		}
		files.ServeHTTP(w, r)
	})
	r.Get("/console/login", c.loginForm)
	r.Post("/console/login", c.login)
	r.Group(func(r chi.Router) {
		r.Use(c.requireSession)
		r.Get("/console/", redirectTo("/console/lanes"))
		r.Get("/console/lanes", c.lanes)
		r.Get("/console/outbox", c.outbox)
		r.Post("/console/outbox/{id}/{action}", c.outboxAction)
		r.Get("/console/search", c.search)
		r.Get("/console/poison", c.poison)
		r.Get("/console/routes", c.routesPage)
		r.Get("/console/operations/{id}", c.operation)
		r.Post("/console/operations/{id}/resolve", c.resolve)
		r.Post("/console/logout", c.logout)
	})
	// The standard library's check of Sec-Fetch-Site and Origin refuses a
	// cross-origin POST before any handler runs: a second wall behind the
	// CSRF token and the SameSite=Strict cookie.
	return http.NewCrossOriginProtection().Handler(r)
}

func redirectTo(path string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, path, http.StatusSeeOther)
	}
}

// securityHeaders: no script may run, nothing may be loaded from elsewhere,
// no page may be framed, forms post only back here, and evidence is never
// cached or leaked in a Referer to the trace viewer.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// ContentSecurityPolicy is sent with every console response.
const ContentSecurityPolicy = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'"

type ctxKey struct{}

func sessionFrom(ctx context.Context) session {
	s, _ := ctx.Value(ctxKey{}).(session)
	return s
}

// maxFormBytes bounds every form the console accepts.
const maxFormBytes = 16 << 10

// requireSession admits a request with a valid session cookie, and a
// state-changing one only with the session's CSRF token besides. Anything
// else changes nothing: a page request goes to the login form, a POST is
// refused. A store that does not answer refuses too.
func (c *Console) requireSession(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var s session
		ck, err := r.Cookie(sessionCookie)
		if err == nil {
			s, err = c.openSession(r.Context(), ck.Value)
		} else {
			err = errBadSession
		}
		switch {
		case errors.Is(err, errBadSession):
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				http.Redirect(w, r, "/console/login", http.StatusSeeOther)
				return
			}
			c.render(w, r, http.StatusForbidden, "error.html", errorPage{Title: "Not logged in",
				Message: "This request carries no valid console session, so it changed nothing. Log in and try again."})
			return
		case err != nil:
			c.o.Logger.ErrorContext(r.Context(), "console: session store failed", "err", err)
			c.render(w, r, http.StatusServiceUnavailable, "error.html", errorPage{Title: "Sessions unavailable",
				Message: "The console's session store did not answer, so nothing changed. Try again in a moment."})
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
			if err := r.ParseForm(); err != nil {
				c.render(w, r, http.StatusBadRequest, "error.html", errorPage{Title: "Bad form", Message: "The form could not be read; nothing changed."})
				return
			}
			if !s.checkCSRF(r.PostForm.Get("csrf")) {
				c.render(w, r, http.StatusForbidden, "error.html", errorPage{Title: "Stale or forged form",
					Message: "The form's CSRF token is missing or wrong, so nothing changed. Reload the page and try again."})
				return
			}
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, s)))
	})
}

func (c *Console) loginForm(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(sessionCookie); err == nil {
		if _, err := c.openSession(r.Context(), ck.Value); err == nil {
			http.Redirect(w, r, "/console/lanes", http.StatusSeeOther)
			return
		}
	}
	c.showLogin(w, r, http.StatusOK, "")
}

func (c *Console) showLogin(w http.ResponseWriter, r *http.Request, status int, problem string) {
	nonce, err := c.newLoginNonce(r.Context())
	if err != nil {
		c.o.Logger.ErrorContext(r.Context(), "console: session store failed", "err", err)
		c.render(w, r, http.StatusServiceUnavailable, "error.html", errorPage{Title: "Sessions unavailable",
			Message: "The console's session store did not answer; no one can log in until it does."})
		return
	}
	c.setCookie(w, loginCookie, nonce, loginTTL)
	c.render(w, r, status, "login.html", loginPage{Nonce: nonce, Problem: problem})
}

// login opens a session for the credential whose token the form carries.
// The form's nonce must be the one this browser was given and unused
// (each form logs in once); the check of the token itself is rate-limited
// per client address and overall, like the admin API's.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		c.showLogin(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	ck, err := r.Cookie(loginCookie)
	form := r.PostForm.Get("login_csrf")
	if err != nil || form == "" || subtle.ConstantTimeCompare([]byte(ck.Value), []byte(form)) != 1 {
		c.showLogin(w, r, http.StatusForbidden, "The login form expired or did not come from this console. Try again.")
		return
	}
	fresh, err := c.takeLoginNonce(r.Context(), form)
	switch {
	case err != nil:
		c.o.Logger.ErrorContext(r.Context(), "console: session store failed", "err", err)
		c.render(w, r, http.StatusServiceUnavailable, "error.html", errorPage{Title: "Sessions unavailable",
			Message: "The console's session store did not answer; try again in a moment."})
		return
	case !fresh:
		c.showLogin(w, r, http.StatusForbidden, "That login form was used already or has expired. Try again.")
		return
	}
	c.setCookie(w, loginCookie, "", 0)
	attempt, ok, wait := c.o.AuthLimiter.Begin(clientAddr(r))
	if !ok {
		c.refused(r, "rate_limited")
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int((wait+time.Second-1)/time.Second))))
		c.showLogin(w, r, http.StatusTooManyRequests, "Too many failed logins from your address, or in all; nothing was checked. Wait a minute and try again.")
		return
	}
	token := r.PostForm.Get("token")
	name, ok := c.o.Credentials.Match(token)
	if !ok {
		attempt.Failed()
		reason := "wrong_token"
		if token == "" {
			reason = "missing"
		}
		c.refused(r, reason)
		c.showLogin(w, r, http.StatusUnauthorized, "That is not an admin token.")
		return
	}
	attempt.Succeeded()
	s, err := c.newSession(r.Context(), name, c.o.Credentials.Version(name))
	if err != nil {
		c.o.Logger.ErrorContext(r.Context(), "console: session store failed", "err", err)
		c.render(w, r, http.StatusServiceUnavailable, "error.html", errorPage{Title: "Sessions unavailable",
			Message: "The console's session store did not answer; you are not logged in. Try again in a moment."})
		return
	}
	c.setCookie(w, sessionCookie, s.ID, c.o.SessionTTL)
	c.o.Logger.InfoContext(r.Context(), "console login", "actor", "console:"+name)
	http.Redirect(w, r, "/console/lanes", http.StatusSeeOther)
}

// logout ends the session on the server, for every replica, and drops the
// browser's cookie.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r.Context())
	if err := c.endSession(r.Context(), s.ID); err != nil {
		c.o.Logger.ErrorContext(r.Context(), "console: session store failed", "err", err)
		c.render(w, r, http.StatusServiceUnavailable, "error.html", errorPage{Title: "Sessions unavailable",
			Message: "The console's session store did not answer, so the session may still be open. Try again."})
		return
	}
	c.setCookie(w, sessionCookie, "", 0)
	c.o.Logger.InfoContext(r.Context(), "console logout", "actor", "console:"+s.Name)
	http.Redirect(w, r, "/console/login", http.StatusSeeOther)
}

// clientAddr is the request's peer address without its port.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// refused counts a wrong token at the login form like any refused admin
// credential, and logs it at most every few seconds; the token itself is
// never logged.
func (c *Console) refused(r *http.Request, reason string) {
	if c.o.AuthFailures != nil {
		c.o.AuthFailures.AdminAuthFailed(r.Context(), "console", reason)
	}
	if ok, notLogged := c.refusals.admit(c.o.Now()); ok {
		c.o.Logger.WarnContext(r.Context(), "console login refused", "reason", reason,
			"remote", gate.Bound(clientAddr(r), 64), "refused_since_last_line", notLogged)
	}
}

// rateLog admits one log line per interval and counts the rest.
type rateLog struct {
	every      time.Duration
	mu         sync.Mutex
	next       time.Time
	suppressed int64
}

func (l *rateLog) admit(now time.Time) (bool, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.suppressed++
		return false, 0
	}
	n := l.suppressed
	l.suppressed, l.next = 0, now.Add(l.every)
	return true, n
}
