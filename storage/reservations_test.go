package storage_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
	"github.com/redis/go-redis/v9"
)

// newReservations runs against a redis-server of the test's own.
func newReservations(t *testing.T) (*storage.Reservations, *redis.Client, string) {
	t.Helper()
	addr := testenv.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return storage.NewReservations(c), c, addr
}

// takeAndRelease holds op_1 for a moment and returns the fence it was given.
func takeAndRelease(t *testing.T, r *storage.Reservations, owner string, floor int64) int64 {
	t.Helper()
	ctx := context.Background()
	l, err := r.Acquire(ctx, "op_1", owner, time.Minute, floor)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	return l.Fence
}

func TestReservationOwnership(t *testing.T) {
	t.Parallel()
	r, _, _ := newReservations(t)
	ctx := context.Background()

	before := time.Now()
	a, err := r.Acquire(ctx, "op_1", "owner-a", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if a.Key != "op_1" || a.Owner != "owner-a" || a.Fence != 1 || a.Expires.Before(before.Add(time.Minute)) {
		t.Fatalf("lease = %+v", a)
	}
	if _, err := r.Acquire(ctx, "op_1", "owner-b", time.Minute, 0); !errors.Is(err, gate.ErrHeld) {
		t.Fatalf("second owner: %v, want ErrHeld", err)
	}
	renewed, err := r.Renew(ctx, a, 2*time.Minute)
	if err != nil || renewed.Fence != a.Fence || !renewed.Expires.After(a.Expires) {
		t.Fatalf("renew by the holder: %+v, %v", renewed, err)
	}

	// Only the holder renews or releases, and a lease names one holding: the
	// same owner with another fence is not it.
	for _, impostor := range []gate.Lease{
		{Key: "op_1", Owner: "owner-b", Fence: a.Fence},
		{Key: "op_1", Owner: "owner-a", Fence: a.Fence + 1},
	} {
		if _, err := r.Renew(ctx, impostor, time.Minute); !errors.Is(err, gate.ErrLeaseLost) {
			t.Fatalf("renew by %+v: %v, want ErrLeaseLost", impostor, err)
		}
		if err := r.Release(ctx, impostor); err != nil {
			t.Fatalf("release by %+v: %v", impostor, err)
		}
		if _, err := r.Acquire(ctx, "op_1", "owner-b", time.Minute, 0); !errors.Is(err, gate.ErrHeld) {
			t.Fatalf("after release by %+v the lease is gone: %v", impostor, err)
		}
	}

	if err := r.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	b, err := r.Acquire(ctx, "op_1", "owner-b", time.Minute, 0)
	if err != nil || b.Fence != 2 {
		t.Fatalf("acquire after release: %+v, %v; want fence 2", b, err)
	}
	if _, err := r.Renew(ctx, a, time.Minute); !errors.Is(err, gate.ErrLeaseLost) {
		t.Fatalf("renew of a released lease: %v, want ErrLeaseLost", err)
	}
	// Leases on other keys are independent.
	if other, err := r.Acquire(ctx, "op_2", "owner-a", time.Minute, 0); err != nil || other.Fence != 1 {
		t.Fatalf("another key: %+v, %v", other, err)
	}
}

func TestReservationExpires(t *testing.T) {
	t.Parallel()
	r, _, _ := newReservations(t)
	ctx := context.Background()
	a, err := r.Acquire(ctx, "op_1", "owner-a", 50*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b gate.Lease
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err = r.Acquire(ctx, "op_1", "owner-b", time.Minute, 0)
		if err == nil {
			break
		}
		if !errors.Is(err, gate.ErrHeld) || time.Now().After(deadline) {
			t.Fatalf("waiting for expiry: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if b.Fence <= a.Fence {
		t.Fatalf("fence after expiry %d, want above %d", b.Fence, a.Fence)
	}
	if _, err := r.Renew(ctx, a, time.Minute); !errors.Is(err, gate.ErrLeaseLost) {
		t.Fatalf("renew after expiry and takeover: %v, want ErrLeaseLost", err)
	}
}

func TestReservationConcurrentAcquireOneWins(t *testing.T) {
	t.Parallel()
	r, _, _ := newReservations(t)
	const n = 32
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, errs[i] = r.Acquire(context.Background(), "op_hot", fmt.Sprintf("owner-%d", i), time.Minute, 0)
		})
	}
	wg.Wait()
	winners := 0
	for i, err := range errs {
		switch {
		case err == nil:
			winners++
		case !errors.Is(err, gate.ErrHeld):
			t.Errorf("acquire %d: %v", i, err)
		}
	}
	if winners != 1 {
		t.Fatalf("%d owners acquired one lease", winners)
	}
}

func TestReservationFenceMonotonicAndFloor(t *testing.T) {
	t.Parallel()
	r, _, _ := newReservations(t)
	var last int64
	for i, floor := range []int64{0, 0, 1, 100, 5, 0, 100, 101} {
		fence := takeAndRelease(t, r, fmt.Sprintf("owner-%d", i), floor)
		if fence <= last || fence <= floor {
			t.Fatalf("acquire %d with floor %d: fence %d, previous %d", i, floor, fence, last)
		}
		last = fence
	}
	// 1, 2, 3, then floor 100 lifts the counter to 101; lower floors change nothing.
	if last != 105 {
		t.Fatalf("final fence %d, want 105", last)
	}
}

// Redis restarted without persistence forgets every counter. The floor, the
// highest fence the ledger recorded, keeps new tokens above the old ones.
func TestReservationFloorAfterRedisLoss(t *testing.T) {
	t.Parallel()
	r, c, _ := newReservations(t)
	ctx := context.Background()
	var seen int64
	for i := range 3 {
		seen = takeAndRelease(t, r, fmt.Sprintf("owner-%d", i), 0)
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	l, err := r.Acquire(ctx, "op_1", "owner-new", time.Minute, seen)
	if err != nil {
		t.Fatal(err)
	}
	if l.Fence <= seen {
		t.Fatalf("fence after Redis lost its state: %d, not above the ledger's %d", l.Fence, seen)
	}
}

// Acquire is the one synchronous Redis round trip a new operation costs.
func TestReservationAcquireIsOneCommand(t *testing.T) {
	t.Parallel()
	r, c, addr := newReservations(t)
	ctx := context.Background()
	commands := testenv.CountRedisCommands(t, addr)
	// The first call loads the script (EVALSHA, NOSCRIPT, EVAL) and opens the
	// connection; what the budget is about is every call after that.
	if _, err := r.Acquire(ctx, "op_warm", "owner", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	before := commands()
	l, err := r.Acquire(ctx, "op_1", "owner", time.Minute, 7)
	if err != nil {
		t.Fatal(err)
	}
	if got := commands() - before; got != 1 {
		t.Fatalf("Acquire sent %d commands, want 1", got)
	}

	// Both keys sit under one hash tag, so Cluster keeps them in one slot.
	keys, err := c.Keys(ctx, "ackgate:*op_1*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Fatalf("keys for op_1: %v", keys)
	}
	for _, k := range keys {
		if !strings.Contains(k, "{op_1}") {
			t.Errorf("key %q lacks the hash tag {op_1}", k)
		}
	}
	if got, _ := c.Get(ctx, "ackgate:{op_1}:fence").Int64(); got != l.Fence {
		t.Fatalf("fence key holds %d, lease has %d", got, l.Fence)
	}
}

// Every Acquire gives the fencing counter the configured TTL again, so
// Redis keeps counters only for operations touched within it; Forget drops
// an idle operation's keys at once.
func TestFenceCounterExpiresAndIsForgotten(t *testing.T) {
	t.Parallel()
	addr := testenv.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	r := storage.NewReservations(c, storage.WithFenceTTL(time.Hour))
	ctx := context.Background()
	l, err := r.Acquire(ctx, "op_ttl", "owner-a", time.Minute, 7)
	if err != nil || l.Fence != 8 {
		t.Fatalf("acquire: %+v, %v", l, err)
	}
	ttl, err := c.PTTL(ctx, "ackgate:{op_ttl}:fence").Result()
	if err != nil || ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("fence TTL after acquire = %s, %v; want about 1h", ttl, err)
	}
	// Shorten it by hand; the next Acquire sets it again.
	if err := c.PExpire(ctx, "ackgate:{op_ttl}:fence", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if l, err = r.Acquire(ctx, "op_ttl", "owner-b", time.Minute, 0); err != nil || l.Fence != 9 {
		t.Fatalf("second acquire: %+v, %v", l, err)
	}
	if ttl, _ := c.PTTL(ctx, "ackgate:{op_ttl}:fence").Result(); ttl <= 59*time.Minute {
		t.Fatalf("fence TTL after the second acquire = %s, want it set again", ttl)
	}
	if err := r.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := r.Forget(ctx, []string{"op_ttl"}); err != nil {
		t.Fatal(err)
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("keys after forget = %d, %v; want none", n, err)
	}
	if err := r.Forget(ctx, nil); err != nil {
		t.Fatalf("forget of nothing: %v", err)
	}
}

// A batch of releases is one command however many leases it holds, each
// still conditional on its owner:fence; and it survives the server losing
// its script cache (a restart), by sending the script's body again.
func TestReleaseAllIsOneCommand(t *testing.T) {
	t.Parallel()
	r, c, addr := newReservations(t)
	ctx := context.Background()
	commands := testenv.CountRedisCommands(t, addr)
	take := func(prefix string, n int) []gate.Lease {
		out := make([]gate.Lease, n)
		for i := range out {
			l, err := r.Acquire(ctx, fmt.Sprintf("%s_%d", prefix, i), "owner", time.Minute, 0)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = l
		}
		return out
	}
	if err := r.ReleaseAll(ctx, take("op_warm", 1)); err != nil {
		t.Fatal(err)
	}
	leases := take("op_batch", 40)
	// One of them passed to a newer owner before the batch: it stays.
	if err := r.Release(ctx, leases[7]); err != nil {
		t.Fatal(err)
	}
	newer, err := r.Acquire(ctx, "op_batch_7", "newer", time.Minute, leases[7].Fence)
	if err != nil {
		t.Fatal(err)
	}
	before := commands()
	if err := r.ReleaseAll(ctx, leases); err != nil {
		t.Fatal(err)
	}
	if got := commands() - before; got != 1 {
		t.Fatalf("ReleaseAll of %d leases sent %d commands, want 1", len(leases), got)
	}
	left, err := c.Keys(ctx, "ackgate:{op_batch_*}:lease").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != "ackgate:{op_batch_7}:lease" {
		t.Fatalf("lease keys left after the batch: %v, want only op_batch_7's", left)
	}
	if _, err := r.Renew(ctx, newer, time.Minute); err != nil {
		t.Fatalf("the newer owner's lease: %v", err)
	}

	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	again := take("op_again", 3)
	if err := r.ReleaseAll(ctx, again); err != nil {
		t.Fatalf("ReleaseAll after the script cache was flushed: %v", err)
	}
	if left, err := c.Keys(ctx, "ackgate:{op_again_*}:lease").Result(); err != nil || len(left) != 0 {
		t.Fatalf("lease keys left after the flushed-cache batch: %v, %v", left, err)
	}
}
