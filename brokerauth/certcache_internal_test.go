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
	c := newCertCache(time.Minute, 3, clock)
	var fetches atomic.Int64
	release := make(chan struct{})
	fetch := func(_ context.Context, url string) (*rsa.PublicKey, error) {
		fetches.Add(1)
		<-release
		return &rsa.PublicKey{N: big.NewInt(int64(len(url))), E: 65537}, nil
	}

	// Concurrent requests for one URL share one fetch.
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.get(context.Background(), "u1", fetch); err != nil {
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
	_, _ = c.get(context.Background(), "u1", fetch)
	if n := fetches.Load(); n != 1 {
		t.Fatalf("cached certificate fetched again")
	}
	advance(2 * time.Minute)
	_, _ = c.get(context.Background(), "u1", fetch)
	if n := fetches.Load(); n != 2 {
		t.Fatalf("expired certificate not fetched again (%d)", n)
	}
	// Never more than max entries.
	for i := range 10 {
		advance(time.Second)
		_, _ = c.get(context.Background(), fmt.Sprintf("u%d", i+2), fetch)
	}
	if n := c.len(); n > 3 {
		t.Fatalf("cache holds %d entries, max 3", n)
	}
	// Failures are not kept.
	boom := func(context.Context, string) (*rsa.PublicKey, error) { return nil, errors.New("down") }
	if _, err := c.get(context.Background(), "bad", boom); err == nil {
		t.Fatal("no error")
	}
	if _, err := c.get(context.Background(), "bad", fetch); err != nil {
		t.Fatalf("a failure was cached: %v", err)
	}
}
