package brokerauth

import (
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestCertCacheTTLBoundAndSharedFetch(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	c := newCertCache(certCacheOptions{
		ttl: time.Minute, failTTL: 10 * time.Second, max: 3, now: clock,
		perHost: 100, maxHosts: 100, interval: time.Hour,
	})
	var fetches atomic.Int64
	release := make(chan struct{})
	fetch := func(_ context.Context, url string) (*fetched, error) {
		fetches.Add(1)
		<-release
		return &fetched{key: &rsa.PublicKey{N: big.NewInt(int64(len(url))), E: 65537}}, nil
	}

	// Concurrent requests for one URL share one fetch.
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.get(context.Background(), "u1", "h", fetch); err != nil {
				t.Error(err)
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	close(release)
	wg.Wait()
	if n := fetches.Load(); n != 1 {
		t.Fatalf("%d fetches for one URL, want 1", n)
	}
	// Within the TTL: cached. After it: fetched again.
	_, _ = c.get(context.Background(), "u1", "h", fetch)
	if n := fetches.Load(); n != 1 {
		t.Fatalf("cached certificate fetched again")
	}
	advance(2 * time.Minute)
	_, _ = c.get(context.Background(), "u1", "h", fetch)
	if n := fetches.Load(); n != 2 {
		t.Fatalf("expired certificate not fetched again (%d)", n)
	}
	// Never more than max entries.
	for i := range 10 {
		advance(time.Second)
		_, _ = c.get(context.Background(), fmt.Sprintf("u%d", i+2), "h", fetch)
	}
	if n := c.len(); n > 3 {
		t.Fatalf("cache holds %d entries, max 3", n)
	}
	// Failures are kept for failTTL, then tried again.
	boom := func(context.Context, string) (*fetched, error) { return nil, errors.New("down") }
	if _, err := c.get(context.Background(), "bad", "h", boom); err == nil {
		t.Fatal("no error")
	}
	before := fetches.Load()
	if _, err := c.get(context.Background(), "bad", "h", fetch); err == nil || fetches.Load() != before {
		t.Fatalf("a failure was not kept: %v", err)
	}
	advance(11 * time.Second)
	if _, err := c.get(context.Background(), "bad", "h", fetch); err != nil {
		t.Fatalf("a failure was kept past its time: %v", err)
	}
}

// Remembered failures, which anyone can cause, make way before certificates.
func TestCertCacheEvictsFailuresFirst(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	c := newCertCache(certCacheOptions{
		ttl: time.Hour, failTTL: time.Minute, max: 2, now: func() time.Time { return now },
		perHost: 100, maxHosts: 100, interval: time.Hour,
	})
	good := func(context.Context, string) (*fetched, error) {
		return &fetched{key: &rsa.PublicKey{N: big.NewInt(7), E: 3}}, nil
	}
	bad := func(context.Context, string) (*fetched, error) { return nil, errors.New("gone") }
	_, _ = c.get(context.Background(), "cert", "h", good)
	for i := range 5 {
		now = now.Add(time.Second)
		_, _ = c.get(context.Background(), fmt.Sprintf("bad%d", i), "h", bad)
	}
	c.mu.Lock()
	_, kept := c.entries["cert"]
	c.mu.Unlock()
	if !kept || c.len() != 2 {
		t.Fatalf("certificate evicted by failures (kept %v, %d entries)", kept, c.len())
	}
}

// The budget counts per host only, and starts afresh each interval: a host
// whose budget is spent never stops another host's fetches. The number of
// hosts one interval tracks is bounded, but only well beyond the hosts
// routes may name.
func TestFetchBudget(t *testing.T) {
	t.Parallel()
	b := fetchBudget{perHost: 2, maxHosts: 3, interval: time.Minute}
	now := time.Unix(1000, 0)
	for i, want := range []bool{true, true, false} {
		if got := b.take(now, "a"); got != want {
			t.Fatalf("host a, fetch %d: %v, want %v", i+1, got, want)
		}
	}
	for range 10 {
		b.take(now, "a") // spending a's budget further
	}
	for i, want := range []bool{true, true, false} {
		if got := b.take(now, "b"); got != want {
			t.Fatalf("host b, fetch %d: %v, want %v: its budget depends on host a's", i+1, got, want)
		}
	}
	if !b.take(now, "c") || b.take(now, "d") {
		t.Fatal("hosts tracked per interval not bounded")
	}
	if !b.take(now.Add(time.Minute), "a") || !b.take(now.Add(time.Minute), "d") {
		t.Fatal("new interval did not reset the budget")
	}
}

// A budget refusal is not remembered as the URL's answer: once the budget
// allows, the same URL is fetched.
func TestCertCacheForgetsBudgetRefusals(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	c := newCertCache(certCacheOptions{
		ttl: time.Hour, failTTL: time.Minute, max: 8, now: func() time.Time { return now },
		perHost: 1, maxHosts: 8, interval: time.Minute,
	})
	calls := 0
	good := func(context.Context, string) (*fetched, error) {
		calls++
		return &fetched{key: &rsa.PublicKey{N: big.NewInt(7), E: 3}}, nil
	}
	_, _ = c.get(context.Background(), "first", "h", good)
	if _, err := c.get(context.Background(), "second", "h", good); !errors.Is(err, errNoBudget) {
		t.Fatalf("second fetch in the interval: %v, want the budget's refusal", err)
	}
	now = now.Add(time.Minute)
	if _, err := c.get(context.Background(), "second", "h", good); err != nil || calls != 2 {
		t.Fatalf("after the interval: %v, %d fetches", err, calls)
	}
}
