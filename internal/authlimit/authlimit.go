// Package authlimit rate-limits credential checks (admin API bearer tokens
// and console logins), per client address and overall, with
// golang.org/x/time/rate.
//
// What is limited is failures: a check may start only while its client's
// bucket and the overall bucket have room for it (counting the checks
// already running), a successful check costs nothing, a failed one spends a
// token of each. A client that has failed its
// burst is refused further checks until its bucket refills, before its
// token is compared with anything, so a guessing run learns nothing more;
// a run spread over many addresses meets the overall bucket, which then
// refuses every check until it refills, genuine ones too. That is the
// price of the bound, and the reason the overall budget is far above what
// people mistyping ever spend.
package authlimit

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limits are the buckets' sizes and refill rates.
type Limits struct {
	// PerClient failures refill at this rate, up to PerClientBurst.
	PerClient      rate.Limit
	PerClientBurst int
	// Overall failures, from every client together.
	Overall      rate.Limit
	OverallBurst int
	// MaxClients bounds the clients tracked; beyond it the fullest (least
	// suspicious) are forgotten first.
	MaxClients int
}

// DefaultLimits: ten failures per client address, then one every six
// seconds; a hundred overall, then ten a second.
func DefaultLimits() Limits {
	return Limits{
		PerClient: rate.Every(6 * time.Second), PerClientBurst: 10,
		Overall: rate.Every(100 * time.Millisecond), OverallBurst: 100,
		MaxClients: 10000,
	}
}

// Limiter is safe for concurrent use; one is shared by every listener that
// checks the same credentials.
type Limiter struct {
	limits  Limits
	now     func() time.Time
	mu      sync.Mutex
	clients map[string]*bucket
	overall bucket
}

// bucket is a rate limiter of failures and the checks running against it:
// a check may start only while the bucket holds a token for it and for
// every check already running, so concurrent guesses cannot overdraw it.
type bucket struct {
	lim      *rate.Limiter
	inflight int
}

func (b *bucket) room(now time.Time) float64 { return b.lim.TokensAt(now) - float64(b.inflight) }

// New returns a limiter with limits, on the clock now (time.Now when nil).
func New(limits Limits, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{limits: limits, now: now, clients: map[string]*bucket{},
		overall: bucket{lim: rate.NewLimiter(limits.Overall, limits.OverallBurst)}}
}

// Attempt is one check in progress; end it with Succeeded or Failed.
type Attempt struct {
	l      *Limiter
	client *bucket
}

// Begin starts a check from client (its address). When the client or the
// whole listener has spent its failures, ok is false and retryAfter says
// roughly when one more will be allowed; the check must then be refused
// without comparing anything.
func (l *Limiter) Begin(client string) (a Attempt, ok bool, retryAfter time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	c := l.clientLocked(client, now)
	if c.room(now) < 1 || l.overall.room(now) < 1 {
		wait := time.Second
		if c.room(now) < 1 && c.lim.Limit() > 0 {
			wait = max(wait, time.Duration((1-c.room(now))/float64(c.lim.Limit())*float64(time.Second)))
		}
		return Attempt{}, false, wait
	}
	c.inflight++
	l.overall.inflight++
	return Attempt{l: l, client: c}, true, 0
}

// Succeeded ends a check whose credential was right: it costs nothing.
func (a Attempt) Succeeded() { a.end(false) }

// Failed ends a check whose credential was wrong: it spends a token of the
// client's bucket and of the overall one.
func (a Attempt) Failed() { a.end(true) }

func (a Attempt) end(failed bool) {
	if a.l == nil {
		return
	}
	a.l.mu.Lock()
	defer a.l.mu.Unlock()
	now := a.l.now()
	a.client.inflight--
	a.l.overall.inflight--
	if failed {
		a.client.lim.AllowN(now, 1)
		a.l.overall.lim.AllowN(now, 1)
	}
}

func (l *Limiter) clientLocked(client string, now time.Time) *bucket {
	if c, ok := l.clients[client]; ok {
		return c
	}
	if len(l.clients) >= l.limits.MaxClients {
		// Forget the clients whose buckets are full and idle: they have
		// nothing against them. If none is, forget one anyway (an idle
		// one); the overall bucket still bounds them all.
		for k, c := range l.clients {
			if c.inflight == 0 && c.lim.TokensAt(now) >= float64(l.limits.PerClientBurst) {
				delete(l.clients, k)
			}
		}
		for k, c := range l.clients {
			if len(l.clients) < l.limits.MaxClients {
				break
			}
			if c.inflight == 0 {
				delete(l.clients, k)
			}
		}
	}
	c := &bucket{lim: rate.NewLimiter(l.limits.PerClient, l.limits.PerClientBurst)}
	l.clients[client] = c
	return c
}

// Tracked is how many clients the limiter keeps a bucket for.
func (l *Limiter) Tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.clients)
}
