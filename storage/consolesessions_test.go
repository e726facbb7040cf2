package storage_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
)

// Take hands a value to one caller only, however many ask at once: a
// console login form is used once across every replica.
func TestConsoleSessionsTakeOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.Redis(t)})
	t.Cleanup(func() { rdb.Close() })
	s := storage.NewConsoleSessions(rdb)
	if err := s.Put(ctx, "login:n1", []byte{1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	var found atomic.Int64
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, ok, err := s.Take(ctx, "login:n1"); err != nil {
				t.Error(err)
			} else if ok {
				found.Add(1)
			}
		})
	}
	wg.Wait()
	if n := found.Load(); n != 1 {
		t.Fatalf("%d callers took the value, want 1", n)
	}
	if err := s.Put(ctx, "session:s1", []byte("v"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := s.Get(ctx, "session:s1"); !ok || err != nil || string(v) != "v" {
		t.Fatalf("get: %q %v %v", v, ok, err)
	}
	if ttl := rdb.TTL(ctx, "ackgate:console:session:s1").Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("ttl %s", ttl)
	}
	if err := s.Delete(ctx, "session:s1"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Get(ctx, "session:s1"); ok {
		t.Fatal("a deleted session is still there")
	}
}
