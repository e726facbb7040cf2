package handlers

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// AuthFailureRecorder counts admin requests refused for their credential;
// telemetry.Metrics is one.
type AuthFailureRecorder interface {
	AdminAuthFailed(ctx context.Context, endpoint, reason string)
}

// Why an admin request was refused; these are metric label values, so the
// set stays small.
const (
	authMissing     = "missing"      // no Authorization header
	authNotBearer   = "not_bearer"   // another scheme (Basic, ...)
	authWrongToken  = "wrong_token"  // a bearer token that opens nothing here
	authRateLimited = "rate_limited" // not checked: too many failed checks from the client or overall
)

// metricsCredential is the name the metrics token is known by; it opens
// GET /metrics and nothing else, so it never names an actor.
const metricsCredential = "metrics"

type callerKey struct{}

// Caller is the name of the credential that authenticated the admin request
// in ctx ("" when none did).
func Caller(ctx context.Context) string {
	name, _ := ctx.Value(callerKey{}).(string)
	return name
}

// requireCredential admits a request bearing a bearer token of one of the
// admin credentials (or, with metricsToo, the metrics token), with the
// credential's name in its context (Caller), and hands every other to
// refused. A check is bounded by the limiter: a client (or all clients
// together) that has failed too often is answered 429 with Retry-After
// before its token is compared with anything. A request with no bearer
// token at all guesses nothing and is not counted against the limit.
func (o *AdminOptions) requireCredential(metricsToo bool) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			authorization := r.Header.Get("Authorization")
			token, bearer := bearerToken(authorization)
			if !bearer {
				o.refused(r, authFailureReason(authorization))
				unauthorized(w)
				return
			}
			attempt, ok, wait := o.AuthLimiter.Begin(clientAddr(r))
			if !ok {
				o.refused(r, authRateLimited)
				w.Header().Set("Retry-After", strconv.Itoa(max(1, int((wait+time.Second-1)/time.Second))))
				writeProblem(w, http.StatusTooManyRequests, "too many failed credential checks from this address or in all; nothing was checked, try again later")
				return
			}
			name, ok := o.Credentials.Match(token)
			if !ok && metricsToo {
				name, ok = o.metrics.Match(token)
			}
			if !ok {
				attempt.Failed()
				o.refused(r, authWrongToken)
				unauthorized(w)
				return
			}
			attempt.Succeeded()
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, name)))
		})
	}
}

func unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="ackgate-admin"`)
	writeProblem(w, http.StatusUnauthorized, "missing or wrong bearer token")
}

// bearerToken is the token of an Authorization: Bearer header (the scheme
// is case-insensitive, RFC 9110), and whether there is one.
func bearerToken(authorization string) (string, bool) {
	const scheme = "Bearer "
	if len(authorization) <= len(scheme) || !strings.EqualFold(authorization[:len(scheme)], scheme) {
		return "", false
	}
	return authorization[len(scheme):], true
}

// clientAddr is the request's peer address without its port: what the
// limiter counts per client. A proxy's forwarding headers are not read,
// since a client could write them; behind a proxy, the proxy is the client.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// refusalLogInterval is the least time between two log lines about refused
// admin requests. The first refusal is logged at once; the next line says
// how many were left out in between. The metric counts every one.
const refusalLogInterval = 10 * time.Second

func authFailureReason(authorization string) string {
	switch {
	case authorization == "":
		return authMissing
	case len(authorization) < len("Bearer ") || !strings.EqualFold(authorization[:len("Bearer ")], "Bearer "):
		return authNotBearer
	}
	return authWrongToken
}

// refusalLog rate-limits the log lines about refused admin requests: a
// token-guessing run must be visible to an operator without letting whoever
// runs it fill the logs.
type refusalLog struct {
	now   func() time.Time
	every time.Duration

	mu         sync.Mutex
	next       time.Time
	suppressed int64
}

func newRefusalLog(now func() time.Time) *refusalLog {
	return &refusalLog{now: now, every: refusalLogInterval}
}

// admit reports whether this refusal gets a log line, and how many refusals
// since the last line did not.
func (l *refusalLog) admit() (bool, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if now.Before(l.next) {
		l.suppressed++
		return false, 0
	}
	n := l.suppressed
	l.suppressed, l.next = 0, now.Add(l.every)
	return true, n
}

// refused counts and (rate-limited) logs an admin request turned away for
// its credential. The credential itself is never logged: a wrong token may
// be a right one pasted into the wrong place, or one off by a character.
func (o *AdminOptions) refused(r *http.Request, reason string) {
	endpoint := "api"
	if r.URL.Path == "/metrics" {
		endpoint = "metrics"
	}
	if o.AuthFailures != nil {
		o.AuthFailures.AdminAuthFailed(r.Context(), endpoint, reason)
	}
	if ok, notLogged := o.refusals.admit(); ok {
		remote := clientAddr(r)
		o.Logger.WarnContext(r.Context(), "admin request refused", "reason", reason, "endpoint", endpoint,
			"method", gate.Bound(r.Method, 16), "path", gate.Bound(r.URL.Path, 128), "remote", gate.Bound(remote, 64),
			"refused_since_last_line", notLogged)
	}
}
