package brokerauth

import (
	"context"
	"crypto/rsa"
	"errors"
	"sync"
	"time"
)

// CertStore keeps genuine SNS signing certificates where every replica finds
// them (storage.SNSCerts keeps them in Redis), so that a replica with a cold
// cache (a restart, a scale-out) verifies without fetching, and a flood of
// messages naming bogus certificate URLs, which spends fetch budgets, cannot
// keep it from verifying genuine ones. Only certificates that were fetched
// from an allowed URL and parsed are put; anything read back is parsed again.
// The store is a shortcut, never a requirement: when it fails, the verifier
// fetches as it would without one.
type CertStore interface {
	// Cert returns the PEM kept for url; found is false when there is none.
	Cert(ctx context.Context, url string) (pemBytes []byte, found bool, err error)
	// PutCert keeps pemBytes for url until until.
	PutCert(ctx context.Context, url string, pemBytes []byte, until time.Time) error
}

// storeTimeout bounds one CertStore call: a slow store must not eat the
// time SNS gives a delivery.
const storeTimeout = time.Second

// certCache keeps signing keys by certificate URL, at most max of them.
//
// A message names the URL the gateway fetches, and anyone can send a message,
// so every fetch is an outbound request an attacker may ask for. Four things
// keep that bounded: the host must be the SNS endpoint of the region the
// message's topic names, which a route allows (Verify, and the handler's
// check of the route's topics); concurrent requests for one URL share one
// fetch; a failed fetch is remembered for failTTL, so a flood naming one URL
// costs one request per failTTL; and a budget caps fetches per host and
// interval, so a flood of ever new URLs costs at most the budget of the
// hosts it may name. The budget is per host and nothing else: fetches
// refused on one host never stop another host's. A fetch the budget refuses
// is Unavailable (SNS retries later) and is not remembered.
type certCache struct {
	ttl, failTTL, shareTTL time.Duration
	max                    int
	now                    func() time.Time
	// store is set before the cache is used (SNSVerifier.ShareCerts).
	store CertStore

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

// fetchBudget counts fetches in fixed windows of interval: at most perHost
// to each host. maxHosts bounds how many hosts one window tracks, only so
// that the map stays small; the hosts a message may name are the SNS
// endpoints of the regions routes allow, far fewer.
type fetchBudget struct {
	perHost, maxHosts int
	interval          time.Duration

	start  time.Time
	byHost map[string]int
}

func (b *fetchBudget) take(now time.Time, host string) bool {
	if b.byHost == nil || now.Sub(b.start) >= b.interval || now.Before(b.start) {
		b.start, b.byHost = now, map[string]int{}
	}
	n, seen := b.byHost[host]
	if n >= b.perHost || (!seen && len(b.byHost) >= b.maxHosts) {
		return false
	}
	b.byHost[host] = n + 1
	return true
}

type certCacheOptions struct {
	ttl, failTTL, shareTTL time.Duration
	max                    int
	perHost, maxHosts      int
	interval               time.Duration
	now                    func() time.Time
}

func newCertCache(o certCacheOptions) *certCache {
	return &certCache{
		ttl: o.ttl, failTTL: o.failTTL, shareTTL: o.shareTTL, max: o.max, now: o.now,
		entries: map[string]*certEntry{},
		budget:  fetchBudget{perHost: o.perHost, maxHosts: o.maxHosts, interval: o.interval},
	}
}

// fetched is a certificate as downloaded: its key, its PEM (what a store
// keeps) and the end of its validity.
type fetched struct {
	key      *rsa.PublicKey
	pem      []byte
	notAfter time.Time
}

type fetchFunc func(ctx context.Context, url string) (*fetched, error)

var errNoBudget = fail(Unavailable, nil, "signing certificate cannot be fetched now: too many certificate fetches from its host")

// get returns the key at url, which lives on host: from this replica's
// cache, else from the shared store, else fetched when the host's budget
// allows.
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
			// Expired: look again below.
		default:
			c.mu.Unlock()
			return c.wait(ctx, e)
		}
	}
	e := &certEntry{done: make(chan struct{})}
	c.evictLocked(now)
	c.entries[url] = e
	c.mu.Unlock()

	// The lookup belongs to every waiter, not to the request that started
	// it, so it is not cancelled with that request; its calls bound
	// themselves.
	key, err := c.load(context.WithoutCancel(ctx), url, host, fetch)
	c.mu.Lock()
	e.key, e.err, e.fetched = key, err, c.now()
	close(e.done)
	if errors.Is(err, errNoBudget) && c.entries[url] == e {
		delete(c.entries, url) // a refusal of ours, not the URL's answer
	}
	c.mu.Unlock()
	return key, err
}

// load finds the key at url in the shared store, or fetches it and shares
// it.
func (c *certCache) load(ctx context.Context, url, host string, fetch fetchFunc) (*rsa.PublicKey, error) {
	if c.store != nil {
		sctx, cancel := context.WithTimeout(ctx, storeTimeout)
		pemBytes, found, err := c.store.Cert(sctx, url)
		cancel()
		if err == nil && found {
			if cert, err := parseCert(pemBytes); err == nil {
				return cert.key, nil
			}
		}
	}
	c.mu.Lock()
	ok := c.budget.take(c.now(), host)
	c.mu.Unlock()
	if !ok {
		return nil, errNoBudget
	}
	cert, err := fetch(ctx, url)
	if err != nil {
		return nil, err
	}
	if c.store != nil {
		// Kept until the certificate expires, and no longer than shareTTL;
		// one that has already expired (archived messages carry such) is
		// shared as long as this replica keeps it.
		now := c.now()
		until := now.Add(c.shareTTL)
		if !cert.notAfter.After(now) {
			until = now.Add(c.ttl)
		} else if cert.notAfter.Before(until) {
			until = cert.notAfter
		}
		sctx, cancel := context.WithTimeout(ctx, storeTimeout)
		_ = c.store.PutCert(sctx, url, cert.pem, until) // a shortcut for others; failing it costs them a fetch
		cancel()
	}
	return cert.key, nil
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
