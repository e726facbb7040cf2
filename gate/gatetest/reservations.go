package gatetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// Clock is a manual clock for the fakes and the gate: time moves only when
// a test says so, so "the lease lapsed" is a step, not a sleep.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock starts at t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Reservations is an in-memory gate.Reservations with the Redis adapter's
// rules: one holder per key until its lease lapses, and fencing tokens that
// only go up, past the floor the caller passes.
type Reservations struct {
	mu     sync.Mutex
	now    func() time.Time
	leases map[string]gate.Lease
	fences map[string]int64
	// Calls counts every call, as the Redis adapter's round trips.
	Calls int
	// Fail, when set, is returned by every call: the store is down.
	Fail error
	// lost counts renewals refused because the lease was gone.
	lost int
	// latest is the latest expiry ever granted per key.
	latest map[string]time.Time
}

var _ gate.Reservations = (*Reservations)(nil)

// NewReservations keeps time by now.
func NewReservations(now func() time.Time) *Reservations {
	return &Reservations{now: now, leases: map[string]gate.Lease{}, fences: map[string]int64{}, latest: map[string]time.Time{}}
}

// Flush forgets every lease and counter, as a Redis restart without
// persistence does.
func (r *Reservations) Flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leases, r.fences = map[string]gate.Lease{}, map[string]int64{}
}

// Acquire implements gate.Reservations.
func (r *Reservations) Acquire(_ context.Context, key, owner string, ttl time.Duration, floor int64) (gate.Lease, error) {
	if err := check(key, owner, ttl); err != nil {
		return gate.Lease{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Calls++
	if r.Fail != nil {
		return gate.Lease{}, r.Fail
	}
	now := r.now()
	if held, ok := r.leases[key]; ok && now.Before(held.Expires) && held.Owner != owner {
		return gate.Lease{}, gate.ErrHeld
	}
	reset := r.fences[key] < floor
	fence := max(r.fences[key], floor) + 1
	r.fences[key] = fence
	l := gate.Lease{Key: key, Owner: owner, Fence: fence, Expires: now.Add(ttl), Reset: reset}
	r.hold(l)
	return l, nil
}

// Take implements gate.Reservations.
func (r *Reservations) Take(_ context.Context, l gate.Lease, ttl time.Duration) (gate.Lease, error) {
	if err := check(l.Key, l.Owner, ttl); err != nil {
		return gate.Lease{}, err
	}
	if l.Fence < 1 {
		return gate.Lease{}, fmt.Errorf("gatetest: take %s: fence %d is not a fence", l.Key, l.Fence)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Calls++
	if r.Fail != nil {
		return gate.Lease{}, r.Fail
	}
	now := r.now()
	if held, ok := r.leases[l.Key]; ok && now.Before(held.Expires) && (held.Owner != l.Owner || held.Fence != l.Fence) {
		return gate.Lease{}, gate.ErrHeld
	}
	r.fences[l.Key] = max(r.fences[l.Key], l.Fence)
	l.Expires, l.Reset = now.Add(ttl), false
	r.hold(l)
	return l, nil
}

// hold makes l the key's lease.
func (r *Reservations) hold(l gate.Lease) {
	r.leases[l.Key] = l
	if l.Expires.After(r.latest[l.Key]) {
		r.latest[l.Key] = l.Expires
	}
}

// LatestExpiry is the latest expiry the store ever granted key's lease:
// how long its holders kept others off at most.
func (r *Reservations) LatestExpiry(key string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.latest[key]
}

// Renew implements gate.Reservations.
func (r *Reservations) Renew(_ context.Context, l gate.Lease, ttl time.Duration) (gate.Lease, error) {
	if err := check(l.Key, l.Owner, ttl); err != nil {
		return gate.Lease{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Calls++
	if r.Fail != nil {
		return gate.Lease{}, r.Fail
	}
	now := r.now()
	held, ok := r.leases[l.Key]
	if !ok || !now.Before(held.Expires) || held.Owner != l.Owner || held.Fence != l.Fence {
		r.lost++
		return gate.Lease{}, gate.ErrLeaseLost
	}
	l.Expires = now.Add(ttl)
	r.hold(l)
	return l, nil
}

// Release implements gate.Reservations.
func (r *Reservations) Release(_ context.Context, l gate.Lease) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Calls++
	if r.Fail != nil {
		return r.Fail
	}
	if held, ok := r.leases[l.Key]; ok && held.Owner == l.Owner && held.Fence == l.Fence {
		delete(r.leases, l.Key)
	}
	return nil
}

// ReleaseAll implements gate.Reservations: one call for the whole batch, as
// the Redis adapter makes one round trip.
func (r *Reservations) ReleaseAll(_ context.Context, ls []gate.Lease) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Calls++
	if r.Fail != nil {
		return r.Fail
	}
	for _, l := range ls {
		if held, ok := r.leases[l.Key]; ok && held.Owner == l.Owner && held.Fence == l.Fence {
			delete(r.leases, l.Key)
		}
	}
	return nil
}

// Forget drops the fencing counters of keys whose lease is not held now,
// as the Redis adapter does for operations the retention purge removed.
func (r *Reservations) Forget(_ context.Context, keys []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Calls++
	if r.Fail != nil {
		return r.Fail
	}
	now := r.now()
	for _, k := range keys {
		if l, ok := r.leases[k]; ok && now.Before(l.Expires) {
			continue
		}
		delete(r.leases, k)
		delete(r.fences, k)
	}
	return nil
}

// Keys is how many keys the store holds: a lease or a counter each.
func (r *Reservations) Keys() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.leases) + len(r.fences)
}

// Held reports whether key's lease is held now.
func (r *Reservations) Held(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.leases[key]
	return ok && r.now().Before(l.Expires)
}

func check(key, owner string, ttl time.Duration) error {
	switch {
	case key == "":
		return errors.New("gatetest: reservation key is empty")
	case strings.TrimSpace(owner) == "":
		return errors.New("gatetest: reservation owner is empty")
	case ttl < time.Millisecond:
		return errors.New("gatetest: reservation ttl is under a millisecond")
	}
	return nil
}

// CallCount is Calls, read under the store's lock: safe while a renewer
// may be calling.
func (r *Reservations) CallCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.Calls
}

// LostRenewals is how many renewals found their lease gone.
func (r *Reservations) LostRenewals() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}
