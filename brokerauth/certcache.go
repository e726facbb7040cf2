package brokerauth

import (
	"context"
	"crypto/rsa"
	"sync"
	"time"
)

// certCache keeps signing keys by certificate URL, at most max of them.
//
// A message names the URL the gateway fetches, and anyone can send a message,
// so every fetch is an outbound request an attacker may ask for. Three things
// keep that bounded: concurrent requests for one URL share one fetch; a failed
// fetch is remembered for failTTL, so a flood naming one URL costs one
// request per failTTL; and a budget caps fetches per host, and in all, per
// interval, so a flood of ever new URLs costs at most the budget. A fetch the
// budget refuses is Unavailable (SNS retries later) and is not remembered.
type certCache struct {
	ttl, failTTL time.Duration
	max          int
	now          func() time.Time

	mu      sync.Mutex
	entries map[string]*certEntry
	budget  fetchBudget
}

type certEntry struct {
	done    chan struct{} // closed when the fetch has finished
	key     *rsa.PublicKey
	err     error
	fetched time.Time
}

// fetchBudget counts fetches in fixed windows of interval: at most perHost to
// one host and total to all hosts together. One window for every host keeps
// the map bounded by total.
type fetchBudget struct {
	perHost, total int
	interval       time.Duration

	start  time.Time
	all    int
	byHost map[string]int
}

func (b *fetchBudget) take(now time.Time, host string) bool {
	if b.byHost == nil || now.Sub(b.start) >= b.interval || now.Before(b.start) {
		b.start, b.all, b.byHost = now, 0, map[string]int{}
	}
	if b.all >= b.total || b.byHost[host] >= b.perHost {
		return false
	}
	b.all++
	b.byHost[host]++
	return true
}

type certCacheOptions struct {
	ttl, failTTL   time.Duration
	max            int
	perHost, total int
	interval       time.Duration
	now            func() time.Time
}

func newCertCache(o certCacheOptions) *certCache {
	return &certCache{
		ttl: o.ttl, failTTL: o.failTTL, max: o.max, now: o.now,
		entries: map[string]*certEntry{},
		budget:  fetchBudget{perHost: o.perHost, total: o.total, interval: o.interval},
	}
}

type fetchFunc func(ctx context.Context, url string) (*rsa.PublicKey, error)

// get returns the key at url, which lives on host, fetching it when it is not
// cached and the budget allows.
func (c *certCache) get(ctx context.Context, url, host string, fetch fetchFunc) (*rsa.PublicKey, error) {
	c.mu.Lock()
	now := c.now()
	if e, ok := c.entries[url]; ok {
		select {
		case <-e.done:
			if now.Before(c.expiry(e)) {
				c.mu.Unlock()
				return e.key, e.err
			}
			// Expired: fetch again below.
		default:
			c.mu.Unlock()
			return c.wait(ctx, e)
		}
	}
	if !c.budget.take(now, host) {
		c.mu.Unlock()
		return nil, fail(Unavailable, nil, "signing certificate cannot be fetched now: too many certificate fetches from its host")
	}
	e := &certEntry{done: make(chan struct{})}
	c.evictLocked(now)
	c.entries[url] = e
	c.mu.Unlock()

	// The fetch belongs to every waiter, not to the request that started it,
	// so it is not cancelled with that request; fetch bounds it itself.
	key, err := fetch(context.WithoutCancel(ctx), url)
	c.mu.Lock()
	e.key, e.err, e.fetched = key, err, c.now()
	close(e.done)
	c.mu.Unlock()
	return key, err
}

// expiry is when a finished entry stops being served.
func (c *certCache) expiry(e *certEntry) time.Time {
	if e.err != nil {
		return e.fetched.Add(c.failTTL)
	}
	return e.fetched.Add(c.ttl)
}

func (c *certCache) wait(ctx context.Context, e *certEntry) (*rsa.PublicKey, error) {
	select {
	case <-e.done:
		return e.key, e.err
	case <-ctx.Done():
		return nil, fail(Unavailable, ctx.Err(), "signing certificate cannot be fetched now")
	}
}

// evictLocked makes room for one more entry: expired entries go first, then
// the oldest failure, then the oldest certificate, so remembered failures
// (which anyone can cause) never push out a certificate while a failure is
// left to drop. Fetches in flight are never evicted.
func (c *certCache) evictLocked(now time.Time) {
	if len(c.entries) < c.max {
		return
	}
	var oldestFail, oldestKey string
	for u, e := range c.entries {
		select {
		case <-e.done:
		default:
			continue
		}
		if !now.Before(c.expiry(e)) {
			delete(c.entries, u)
			continue
		}
		oldest := &oldestKey
		if e.err != nil {
			oldest = &oldestFail
		}
		if *oldest == "" || e.fetched.Before(c.entries[*oldest].fetched) {
			*oldest = u
		}
	}
	if len(c.entries) < c.max {
		return
	}
	if oldestFail != "" {
		delete(c.entries, oldestFail)
	} else if oldestKey != "" {
		delete(c.entries, oldestKey)
	}
}

// len reports how many entries the cache holds, for tests.
func (c *certCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
