package storage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/redis/go-redis/v9"
)

// Reservations keeps leases and fencing counters in Redis. Each takes one
// script call, one round trip once the script is cached on the server
// (go-redis sends EVALSHA and falls back to EVAL on NOSCRIPT).
//
// Redis is only a fast path for mutual exclusion: if it loses its counters, the
// floor passed to Acquire (the highest fence the ledger has recorded) keeps new
// tokens above every token that ever reached the ledger, and the ledger refuses
// writes under a superseded token whatever Redis says.
//
// That is also why a fencing counter may expire: every Acquire passes the
// floor, so a counter that is gone is rebuilt above everything the ledger
// holds. Each Acquire sets the counter's TTL again, so only operations
// nobody has touched for a whole fence TTL lose theirs, and Redis holds one
// counter per operation in flight, not one per operation in history.
type Reservations struct {
	c        redis.UniversalClient
	fenceTTL time.Duration
}

var _ gate.Reservations = (*Reservations)(nil)

// DefaultFenceTTL is how long an operation's fencing counter outlives the
// last Acquire on it, unless WithFenceTTL says otherwise.
const DefaultFenceTTL = 24 * time.Hour

// ReservationsOption adjusts a Reservations.
type ReservationsOption func(*Reservations)

// WithFenceTTL sets the fencing counters' TTL. It must exceed the longest
// lease by a wide margin (config.Settings checks twice the longest route's
// lease): a counter that expires while its lease is still held would be
// rebuilt from the ledger's floor, which the holder may not have reached yet.
func WithFenceTTL(d time.Duration) ReservationsOption {
	return func(r *Reservations) {
		if d > 0 {
			r.fenceTTL = d
		}
	}
}

// NewReservations works with a standalone, Sentinel or Cluster client alike:
// both keys of a reservation share a hash tag, so each script touches one slot.
func NewReservations(c redis.UniversalClient, opts ...ReservationsOption) *Reservations {
	r := &Reservations{c: c, fenceTTL: DefaultFenceTTL}
	for _, o := range opts {
		o(r)
	}
	return r
}

func leaseKey(key string) string { return "ackgate:{" + key + "}:lease" }
func fenceKey(key string) string { return "ackgate:{" + key + "}:fence" }

// The lease value is "owner:fence", so renew and release can check that the
// holder is this very reservation, not just the same owner name.
func leaseValue(l gate.Lease) string { return l.Owner + ":" + strconv.FormatInt(l.Fence, 10) }

// acquireScript returns {new fence, 1 if the counter was below the floor}, or
// {0, 0} when another owner holds the lease. The counter is first raised to
// the floor and then incremented, which keeps every arithmetic step on Redis
// integers (Lua numbers are doubles).
var acquireScript = redis.NewScript(`
local held = redis.call('GET', KEYS[1])
if held and string.match(held, '^(.*):%d+$') ~= ARGV[1] then
	return {0, 0}
end
local reset = 0
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current < tonumber(ARGV[3]) then
	redis.call('SET', KEYS[2], ARGV[3])
	reset = 1
end
local fence = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. fence, 'PX', ARGV[2])
return {fence, reset}
`)

// takeScript takes the lease at the fence given, {1}, when nobody holds
// it, raising the counter to that fence; {0} when another owner holds it.
var takeScript = redis.NewScript(`
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] .. ':' .. ARGV[2] then
	return 0
end
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
	redis.call('SET', KEYS[2], ARGV[2])
end
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2], 'PX', ARGV[3])
return 1
`)

// forgetScript drops an operation's fencing counter unless its lease is held
// right now: a holder is a delivery of a message whose evidence was just
// purged (a broker redelivering past retention), and its counter expires on
// its own later.
var forgetScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
	return 0
end
return redis.call('DEL', KEYS[2])
`)

var renewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('DEL', KEYS[1])
end
return 0
`)

// Acquire returns a lease whose Expires is computed from the local clock taken
// before the call, so it errs early rather than late.
func (r *Reservations) Acquire(ctx context.Context, key, owner string, ttl time.Duration, floor int64) (gate.Lease, error) {
	if err := checkLease(key, owner, ttl); err != nil {
		return gate.Lease{}, err
	}
	start := time.Now()
	res, err := acquireScript.Run(ctx, r.c, []string{leaseKey(key), fenceKey(key)},
		owner, ttl.Milliseconds(), floor, r.fenceTTL.Milliseconds()).Int64Slice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("acquire script answered %v", res)
	}
	if err != nil {
		return gate.Lease{}, fmt.Errorf("storage: acquire %s: %w", key, err)
	}
	if res[0] == 0 {
		return gate.Lease{}, fmt.Errorf("storage: acquire %s: %w", key, gate.ErrHeld)
	}
	return gate.Lease{Key: key, Owner: owner, Fence: res[0], Expires: start.Add(ttl), Reset: res[1] == 1}, nil
}

// Take implements gate.Reservations: one script call, as Acquire.
func (r *Reservations) Take(ctx context.Context, l gate.Lease, ttl time.Duration) (gate.Lease, error) {
	if err := checkLease(l.Key, l.Owner, ttl); err != nil {
		return gate.Lease{}, err
	}
	if l.Fence < 1 {
		return gate.Lease{}, fmt.Errorf("storage: take %s: fence %d is not a fence", l.Key, l.Fence)
	}
	start := time.Now()
	ok, err := takeScript.Run(ctx, r.c, []string{leaseKey(l.Key), fenceKey(l.Key)},
		l.Owner, l.Fence, ttl.Milliseconds(), r.fenceTTL.Milliseconds()).Int()
	if err != nil {
		return gate.Lease{}, fmt.Errorf("storage: take %s: %w", l.Key, err)
	}
	if ok == 0 {
		return gate.Lease{}, fmt.Errorf("storage: take %s: %w", l.Key, gate.ErrHeld)
	}
	l.Expires, l.Reset = start.Add(ttl), false
	return l, nil
}

// Renew extends l by ttl from now, if l is still the lease held.
func (r *Reservations) Renew(ctx context.Context, l gate.Lease, ttl time.Duration) (gate.Lease, error) {
	if err := checkLease(l.Key, l.Owner, ttl); err != nil {
		return gate.Lease{}, err
	}
	start := time.Now()
	ok, err := renewScript.Run(ctx, r.c, []string{leaseKey(l.Key)}, leaseValue(l), ttl.Milliseconds()).Int()
	if err != nil {
		return gate.Lease{}, fmt.Errorf("storage: renew %s: %w", l.Key, err)
	}
	if ok == 0 {
		return gate.Lease{}, fmt.Errorf("storage: renew %s: %w", l.Key, gate.ErrLeaseLost)
	}
	l.Expires = start.Add(ttl)
	return l, nil
}

// Release drops l if it is still the lease held; releasing a lease that has
// expired or passed to another owner is a no-op, not an error.
func (r *Reservations) Release(ctx context.Context, l gate.Lease) error {
	if err := releaseScript.Run(ctx, r.c, []string{leaseKey(l.Key)}, leaseValue(l)).Err(); err != nil {
		return fmt.Errorf("storage: release %s: %w", l.Key, err)
	}
	return nil
}

// releaseAllScript is releaseScript over many leases: KEYS[i] is dropped
// only while it still holds ARGV[i], the owner:fence of the lease released.
var releaseAllScript = redis.NewScript(`
local n = 0
for i, k in ipairs(KEYS) do
	if redis.call('GET', k) == ARGV[i] then
		n = n + redis.call('DEL', k)
	end
end
return n
`)

// maxReleaseKeys bounds the keys of one releaseAllScript call, so one call
// never keeps the server busy for long.
const maxReleaseKeys = 256

// ReleaseAll releases each of ls as Release does, each still conditional
// on its owner:fence. On a standalone or Sentinel server that is one
// script call per maxReleaseKeys leases, so a batch costs one round trip
// and one command; a Cluster spreads the keys over slots a single script
// may not span, so there each lease gets its own script call, pipelined.
func (r *Reservations) ReleaseAll(ctx context.Context, ls []gate.Lease) error {
	if len(ls) == 0 {
		return nil
	}
	script, size := releaseAllScript, maxReleaseKeys
	if _, cluster := r.c.(*redis.ClusterClient); cluster {
		script, size = releaseScript, 1
	}
	type call struct {
		keys []string
		vals []any
	}
	var calls []call
	for chunk := range slices.Chunk(ls, size) {
		c := call{keys: make([]string, len(chunk)), vals: make([]any, len(chunk))}
		for i, l := range chunk {
			c.keys[i], c.vals[i] = leaseKey(l.Key), leaseValue(l)
		}
		calls = append(calls, c)
	}
	send := func(byBody bool) error {
		pipe := r.c.Pipeline()
		for _, c := range calls {
			if byBody {
				script.Eval(ctx, pipe, c.keys, c.vals...)
			} else {
				script.EvalSha(ctx, pipe, c.keys, c.vals...)
			}
		}
		_, err := pipe.Exec(ctx)
		return err
	}
	err := send(false)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// The server lost its script cache (a restart): the body goes once
		// more, which caches it again.
		err = send(true)
	}
	if err != nil {
		return fmt.Errorf("storage: release %d reservations: %w", len(ls), err)
	}
	return nil
}

// Forget drops what Redis keeps for operations whose evidence the ledger
// no longer holds (the retention purge), one pipelined round trip for all of
// them; each script touches one hash slot, so Cluster works too. A lease
// held right now is left alone, and so is its counter.
func (r *Reservations) Forget(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	pipe := r.c.Pipeline()
	cmds := make([]*redis.Cmd, len(keys))
	for i, k := range keys {
		cmds[i] = forgetScript.Eval(ctx, pipe, []string{leaseKey(k), fenceKey(k)})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("storage: forget %d reservations: %w", len(keys), err)
	}
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			return fmt.Errorf("storage: forget %s: %w", keys[i], err)
		}
	}
	return nil
}

// checkLease turns arguments that cannot make a lease into errors before any
// round trip: Redis refuses a zero PX, and an empty owner or key names nobody.
func checkLease(key, owner string, ttl time.Duration) error {
	switch {
	case key == "":
		return errors.New("storage: reservation key is empty")
	case owner == "":
		return errors.New("storage: reservation owner is empty")
	case ttl < time.Millisecond:
		return fmt.Errorf("storage: reservation ttl %s is under a millisecond", ttl)
	}
	return nil
}
