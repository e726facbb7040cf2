// Package adaptive holds a concurrency limit that follows what a downstream
// can take: additive increase while its calls stay about as fast as they
// have been, multiplicative decrease when it says it is overloaded (429, 503)
// or stops answering in time. The relay keeps one per handoff route, so that
// it drains the outbox as fast as the downstream allows and backs off before
// it makes an outage worse.
//
// It is a few dozen lines rather than a module: the limiters published for
// Go are either unmaintained ports of Netflix's concurrency-limits or part of
// a resilience framework whose executor would have to wrap the relay's
// passes, and whose decisions cannot be driven by a test without a real
// clock. This one takes the times of each call from its caller, so a test
// decides every sample.
package adaptive

import (
	"sync"
	"time"
)

// Options configure a Limiter; zero fields take the defaults.
type Options struct {
	// Initial is the limit before any sample (default Min, at least 1).
	Initial int
	// Min and Max bound the limit (defaults 1 and Initial).
	Min, Max int
	// Tolerance is how much slower than the baseline a call may be and still
	// count as the downstream keeping its latency (default 2: twice the
	// baseline), and Slack the least it may be slower by (default 5ms): a
	// downstream answering in a fraction of a millisecond on loopback
	// varies by more than its own latency with the scheduler alone. Slower
	// calls stop the growth without shrinking the limit.
	Tolerance float64
	Slack     time.Duration
	// Backoff multiplies the limit after an overload (default 0.5).
	Backoff float64
}

// Limiter is one downstream's limit and the calls in flight under it. Its
// methods are safe for concurrent use.
type Limiter struct {
	mu        sync.Mutex
	limit     float64
	min, max  float64
	tolerance float64
	slack     time.Duration
	backoff   float64
	inflight  int
	// baseline is the latency the downstream keeps when it is not loaded:
	// the fastest recent call, drifting up slowly so that a lasting change
	// of its speed is learned.
	baseline time.Duration
	// slowStart: until the first sign of load the limit grows by one per
	// good call (doubling per round of calls) instead of one per round.
	slowStart bool
	// cut is when the limit was last decreased: an overload from a call
	// that started before it was answered under the old limit and is not
	// counted again.
	cut time.Time
}

// baselineDrift is the share of the gap to a slower call by which the
// baseline moves up per call.
const baselineDrift = 64

// New returns a Limiter at o.Initial.
func New(o Options) *Limiter {
	if o.Min < 1 {
		o.Min = 1
	}
	if o.Initial < o.Min {
		o.Initial = o.Min
	}
	if o.Max < o.Initial {
		o.Max = o.Initial
	}
	if o.Tolerance <= 1 {
		o.Tolerance = 2
	}
	if o.Slack <= 0 {
		o.Slack = 5 * time.Millisecond
	}
	if o.Backoff <= 0 || o.Backoff >= 1 {
		o.Backoff = 0.5
	}
	return &Limiter{limit: float64(o.Initial), min: float64(o.Min), max: float64(o.Max),
		tolerance: o.Tolerance, slack: o.Slack, backoff: o.Backoff, slowStart: true}
}

// Limit is the number of calls the downstream is given at once now.
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.limit)
}

// Room is how many more calls may start now.
func (l *Limiter) Room() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(0, int(l.limit)-l.inflight)
}

// Take counts n calls as started; Release counts one as finished. Take
// may exceed the room (a caller that claimed work before a decrease), and
// the room stays at zero until enough have finished.
func (l *Limiter) Take(n int) {
	l.mu.Lock()
	l.inflight += n
	l.mu.Unlock()
}

// Release counts one call as finished.
func (l *Limiter) Release() {
	l.mu.Lock()
	if l.inflight > 0 {
		l.inflight--
	}
	l.mu.Unlock()
}

// Observe adjusts the limit after one call that started at start and ended
// at end. overload says the downstream refused it for load (429, 503) or did
// not answer in time.
func (l *Limiter) Observe(start, end time.Time, overload bool) {
	took := max(end.Sub(start), 0)
	l.mu.Lock()
	defer l.mu.Unlock()
	if overload {
		l.slowStart = false
		if start.Before(l.cut) {
			return // answered under the limit before the last cut
		}
		l.limit = max(l.min, l.limit*l.backoff)
		l.cut = end
		return
	}
	switch {
	case l.baseline == 0 || took < l.baseline:
		l.baseline = took
	default:
		l.baseline += (took - l.baseline) / baselineDrift
	}
	if took > max(time.Duration(l.tolerance*float64(l.baseline)), l.baseline+l.slack) {
		l.slowStart = false
		return // the downstream is slowing down: hold
	}
	if float64(l.inflight) < l.limit/2 {
		return // the limit is not in use; growing it would only be a guess
	}
	if l.slowStart {
		l.limit = min(l.max, l.limit+1)
	} else {
		l.limit = min(l.max, l.limit+1/l.limit)
	}
}
