package brokerauth

import (
	"context"
	"crypto/rsa"
	"sync"
	"time"
)

// certCache keeps signing keys by certificate URL for a TTL, at most max of
// them. Concurrent requests for the same URL share one fetch. Failures are
// not cached: the next message tries again, so a certificate host that comes
// back is used at once.
type certCache struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu      sync.Mutex
	entries map[string]*certEntry
}

type certEntry struct {
	done    chan struct{} // closed when the fetch has finished
	key     *rsa.PublicKey
	err     error
	fetched time.Time
}

func newCertCache(ttl time.Duration, max int, now func() time.Time) *certCache {
	return &certCache{ttl: ttl, max: max, now: now, entries: map[string]*certEntry{}}
}

type fetchFunc func(ctx context.Context, url string) (*rsa.PublicKey, error)

func (c *certCache) get(ctx context.Context, url string, fetch fetchFunc) (*rsa.PublicKey, error) {
	c.mu.Lock()
	e, ok := c.entries[url]
	if ok {
		select {
		case <-e.done:
			if e.err == nil && c.now().Sub(e.fetched) < c.ttl {
				c.mu.Unlock()
				return e.key, nil
			}
			// Expired: fetch again below.
		default:
			c.mu.Unlock()
			return c.wait(ctx, e)
		}
	}
	e = &certEntry{done: make(chan struct{})}
	c.evictLocked()
	c.entries[url] = e
	c.mu.Unlock()

	// The fetch belongs to every waiter, not to the request that started it,
	// so it is not cancelled with that request; fetch bounds it itself.
	key, err := fetch(context.WithoutCancel(ctx), url)
	c.mu.Lock()
	e.key, e.err, e.fetched = key, err, c.now()
	if err != nil && c.entries[url] == e {
		delete(c.entries, url)
	}
	close(e.done)
	c.mu.Unlock()
	return key, err
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
// the oldest finished one. Fetches in flight are never evicted.
func (c *certCache) evictLocked() {
	if len(c.entries) < c.max {
		return
	}
	now := c.now()
	var oldestURL string
	var oldest time.Time
	for u, e := range c.entries {
		select {
		case <-e.done:
		default:
			continue
		}
		if now.Sub(e.fetched) >= c.ttl {
			delete(c.entries, u)
			continue
		}
		if oldestURL == "" || e.fetched.Before(oldest) {
			oldestURL, oldest = u, e.fetched
		}
	}
	if len(c.entries) >= c.max && oldestURL != "" {
		delete(c.entries, oldestURL)
	}
}

// len reports how many entries the cache holds, for tests.
func (c *certCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
