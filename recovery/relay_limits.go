package recovery

import (
	"context"
	"net/http"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/adaptive"
)

// relayStartLimit is where each route's limit starts: the relay's fixed
// concurrency before it adapted, so a downstream sees no more at first than
// it used to.
const relayStartLimit = 4

// RelayLimits are the relay's concurrency limits, one per handoff route,
// each following its route's downstream (package adaptive). Observe feeds
// them: the relay's gate calls each effect through it.
type RelayLimits struct {
	byRoute map[string]*adaptive.Limiter
	now     func() time.Time
}

// NewRelayLimits gives every handoff route of routes a limit that starts at
// min(4, most) and never passes most.
func NewRelayLimits(routes []*gate.Route, most int) *RelayLimits {
	l := &RelayLimits{byRoute: map[string]*adaptive.Limiter{}, now: time.Now}
	for _, rt := range routes {
		if rt.Shape == gate.ShapeHandoff {
			l.byRoute[rt.Name] = adaptive.New(adaptive.Options{
				Initial: min(relayStartLimit, most), Min: 1, Max: most,
			})
		}
	}
	return l
}

// Limit is route's limit now; 0 for a route that is not handoff.
func (l *RelayLimits) Limit(route string) int {
	if lim := l.byRoute[route]; lim != nil {
		return lim.Limit()
	}
	return 0
}

// noLimit stands in for a route without a limiter: it never has room.
var noLimit = adaptive.New(adaptive.Options{Initial: 1, Max: 1})

func (l *RelayLimits) of(route string) *routeLimit {
	lim := l.byRoute[route]
	if lim == nil {
		lim = noLimit
	}
	return &routeLimit{lim}
}

type routeLimit struct{ *adaptive.Limiter }

// state is the limit, the room under it and the passes running.
func (r *routeLimit) state() (limit, room, running int) {
	limit, room = r.Limit(), r.Room()
	return limit, room, max(0, limit-room)
}

// Observe returns effects that time every effect call of a handoff route
// and tell its limit how the downstream answered. Lookups pass through
// unobserved: they ask another endpoint, at the reconciler's own pace.
func (l *RelayLimits) Observe(effects gate.Effects) gate.Effects {
	return &observed{Effects: effects, limits: l}
}

type observed struct {
	gate.Effects
	limits *RelayLimits
}

func (o *observed) Execute(ctx context.Context, req *gate.EffectRequest) gate.EffectResult {
	lim := o.limits.byRoute[req.Route.Name]
	if lim == nil {
		return o.Effects.Execute(ctx, req)
	}
	start := o.limits.now()
	res := o.Effects.Execute(ctx, req)
	lim.Observe(start, o.limits.now(), overloaded(res))
	return res
}

// overloaded says whether an effect call's answer asks for less load: a 429
// or a 503 (the downstream says so), a 504 (a proxy in front of it gave up
// waiting), or no answer at all (a timeout, a refused or broken connection).
func overloaded(res gate.EffectResult) bool {
	switch res.StatusCode {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	case 0:
		return res.Outcome != gate.OutcomeConfirmed
	}
	return false
}
