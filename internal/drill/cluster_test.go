package drill

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/wiring"
	"github.com/ackgate/ackgate/storage"
)

// Reservations.ReleaseAll on a real Redis Cluster: the cluster path sends
// one script call per lease in a pipeline that go-redis splits by node.
// Leases spread over every primary are released, each only if still its
// owner's, and a lease that passed to another owner is left alone. Then a
// primary is killed and its replica promoted, which has no script cached:
// the release must still go through (NOSCRIPT, then the script's body).
func TestReleaseAllOnRedisCluster(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, err := StartRedisCluster(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	// The client the gateway builds for a cluster (its slot map refreshed
	// every second, not every minute).
	rdb := wiring.RedisClient(&redis.UniversalOptions{Addrs: cl.Addrs(), IsClusterMode: true}).(*redis.ClusterClient)
	t.Cleanup(func() { rdb.Close() })
	res := storage.NewReservations(rdb)

	acquire := func(round, n int) []gate.Lease {
		t.Helper()
		var ls []gate.Lease
		for i := range n {
			l, err := res.Acquire(ctx, fmt.Sprintf("op-%d-%d", round, i), "owner-a", time.Minute, 0)
			if err != nil {
				t.Fatal(err)
			}
			ls = append(ls, l)
		}
		return ls
	}
	// held reports whether key's lease is still held by someone: another
	// owner's Acquire is refused.
	held := func(key string) bool {
		t.Helper()
		_, err := res.Acquire(ctx, key, "owner-probe", time.Minute, 0)
		switch {
		case errors.Is(err, gate.ErrHeld):
			return true
		case err != nil:
			t.Fatal(err)
		}
		return false
	}

	ls := acquire(1, 60)
	// The lease of op-1-0 expires and passes to another owner: releasing
	// the stale lease must not drop the new owner's.
	if err := rdb.Del(ctx, "ackgate:{op-1-0}:lease").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := res.Acquire(ctx, "op-1-0", "owner-b", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	slots := map[string]bool{}
	for _, l := range ls {
		node, err := rdb.MasterForKey(ctx, "ackgate:{"+l.Key+"}:lease")
		if err != nil {
			t.Fatal(err)
		}
		slots[node.Options().Addr] = true
	}
	if len(slots) != 3 {
		t.Fatalf("60 leases landed on %d primaries, want all 3", len(slots))
	}
	if err := res.ReleaseAll(ctx, ls); err != nil {
		t.Fatalf("ReleaseAll on the cluster: %v", err)
	}
	if !held("op-1-0") {
		t.Fatal("ReleaseAll dropped a lease that another owner holds")
	}
	for _, l := range ls[1:] {
		if held(l.Key) {
			t.Fatalf("lease %s is still held after ReleaseAll", l.Key)
		}
	}

	// A primary dies; its replica, promoted, has never run the scripts.
	ls = acquire(2, 60)
	masters := map[string]string{}
	for _, l := range ls {
		node, err := rdb.MasterForKey(ctx, "ackgate:{"+l.Key+"}:lease")
		if err != nil {
			t.Fatal(err)
		}
		masters[l.Key] = node.Options().Addr
	}
	killed, err := cl.KillPrimary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	onVictim := 0
	for _, m := range masters {
		if m == killed {
			onVictim++
		}
	}
	if onVictim == 0 {
		t.Fatalf("no lease was on the killed primary %s", killed)
	}
	// Until the client's slot map is refreshed it dials the dead primary,
	// and a release fails (the lease then lapses by its TTL, as after any
	// failed release). The gateway's client refreshes the map every
	// ClusterStateReload; the bound here is thirty times that, for a busy
	// machine.
	var lastErr error
	for range 60 {
		if lastErr = res.ReleaseAll(ctx, ls); lastErr == nil {
			break
		}
		time.Sleep(wiring.ClusterStateReload / 2)
	}
	if lastErr != nil {
		t.Fatalf("ReleaseAll after %s was killed: %v", killed, lastErr)
	}
	// Leases on the killed primary's slots may have been lost with it
	// (replication is asynchronous), or kept by the replica: either way
	// none may be held now.
	for _, l := range ls {
		if held(l.Key) {
			t.Fatalf("lease %s is still held after ReleaseAll across the failover of %s", l.Key, killed)
		}
	}
}
