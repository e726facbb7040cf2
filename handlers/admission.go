package handlers

import (
	"context"
	"net/http"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/ackgate/ackgate/gate"
)

// admission bounds what this process works on at once, so that its memory
// follows its own limits rather than the brokers' concurrency: the number of
// deliveries (each holds its request and decoded message, a downstream
// connection, a lease and the goroutines serving them) and the bytes of push
// bodies they hold (one broker pushing large messages would otherwise need
// MaxBodyBytes per delivery). A delivery past either bound waits for room
// before its body is read, so a waiting request costs little more than its
// connection; if none frees within the wait it is refused with a nack that
// asks the broker to come back later (overloaded). A nil admission admits
// all.
//
// Both bounds are weighted semaphores (golang.org/x/sync/semaphore): a body
// takes as many units as its bytes, and waiters are served in arrival order,
// so a large body is not starved by a stream of small ones.
type admission struct {
	slots *semaphore.Weighted // nil: no bound on deliveries
	bytes *semaphore.Weighted // nil: no bound on body bytes
	// maxBody is what a body of unknown length reserves until it is read:
	// the largest body the listener accepts.
	maxBody int64
	wait    time.Duration
}

func newAdmission(maxInFlight int, maxBytes, maxBody int64, wait time.Duration) *admission {
	if maxInFlight <= 0 && maxBytes <= 0 {
		return nil
	}
	a := &admission{maxBody: maxBody, wait: wait}
	if maxInFlight > 0 {
		a.slots = semaphore.NewWeighted(int64(maxInFlight))
	}
	if maxBytes > 0 {
		// A budget below one body of the largest size would refuse that
		// body for ever; the settings refuse such a budget, and this keeps
		// the handler safe without them.
		a.bytes = semaphore.NewWeighted(max(maxBytes, maxBody))
	}
	return a
}

// ticket is one admitted delivery: its slot and the body bytes it reserved.
// The zero ticket holds nothing.
type ticket struct {
	a    *admission
	slot bool
	held int64
}

// enter takes a delivery's slot, waiting at most a.wait and no longer than
// ctx lives. A true answer must be paired with the ticket's leave.
func (a *admission) enter(ctx context.Context) (ticket, bool) {
	if a == nil || a.slots == nil {
		return ticket{a: a}, true
	}
	if !a.acquire(ctx, a.slots, 1) {
		return ticket{}, false
	}
	return ticket{a: a, slot: true}, true
}

// reserve takes room for r's body before it is read: its declared length, or
// the largest body accepted when the length is unknown (the rest is given
// back by fit once the body is read). A declared length beyond the body
// limit reserves nothing: readBody refuses it with 413 without reading.
func (t *ticket) reserve(ctx context.Context, r *http.Request) bool {
	a := t.a
	if a == nil || a.bytes == nil {
		return true
	}
	n := r.ContentLength
	switch {
	case n == 0:
		return true
	case n < 0:
		n = a.maxBody
	case n > a.maxBody:
		return true
	}
	if !a.acquire(ctx, a.bytes, n) {
		return false
	}
	t.held = n
	return true
}

// fit gives back what the body reserved beyond its real size.
func (t *ticket) fit(size int) {
	if t.a == nil || t.a.bytes == nil {
		return
	}
	if extra := t.held - int64(size); extra > 0 {
		t.a.bytes.Release(extra)
		t.held -= extra
	}
}

// leave returns what the ticket holds.
func (t *ticket) leave() {
	if t.a == nil {
		return
	}
	if t.held > 0 {
		t.a.bytes.Release(t.held)
		t.held = 0
	}
	if t.slot {
		t.a.slots.Release(1)
		t.slot = false
	}
}

// acquire takes n units of s, at once when they are free, else waiting at
// most a.wait. The timer exists only on the waiting path.
func (a *admission) acquire(ctx context.Context, s *semaphore.Weighted, n int64) bool {
	if s.TryAcquire(n) {
		return true
	}
	if a.wait <= 0 || ctx.Err() != nil {
		return false
	}
	wctx, cancel := context.WithTimeout(ctx, a.wait)
	defer cancel()
	return s.Acquire(wctx, n) == nil
}

// atCapacity is the answer to a delivery that found no room: a nack that
// says the gateway is overloaded, with Retry-After, chosen per broker.
// Pub/Sub reads every status but 102, 200, 201, 202 and 204 as a nack, and
// 429 tells whoever reads it (the broker's push backoff, an operator's
// dashboard) that this is load, not a failure of the message or of the
// downstream. SNS counts every status below 500 as delivered and would drop
// the message on a 429, so it gets 503.
func atCapacity(b gate.Broker) outcome {
	status := http.StatusServiceUnavailable
	if b == gate.BrokerPubSub {
		status = http.StatusTooManyRequests
	}
	return outcome{decision: gate.Nack, status: status,
		reason: "gateway at its limit of deliveries or body bytes in flight; the broker will redeliver"}
}
