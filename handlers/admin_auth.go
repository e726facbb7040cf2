package handlers

import (
	"context"
	"github.com/ackgate/ackgate/gate"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// AuthFailureRecorder counts admin requests refused for their credential;
// telemetry.Metrics is one.
type AuthFailureRecorder interface {
	AdminAuthFailed(ctx context.Context, endpoint, reason string)
}

// Why an admin request was refused; these are metric label values, so the
// set stays small.
const (
	authMissing    = "missing"     // no Authorization header
	authNotBearer  = "not_bearer"  // another scheme (Basic, ...)
	authWrongToken = "wrong_token" // a bearer token that opens nothing here
)

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
		remote, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			remote = r.RemoteAddr
		}
		o.Logger.WarnContext(r.Context(), "admin request refused", "reason", reason, "endpoint", endpoint,
			"method", gate.Bound(r.Method, 16), "path", gate.Bound(r.URL.Path, 128), "remote", gate.Bound(remote, 64),
			"refused_since_last_line", notLogged)
	}
}
