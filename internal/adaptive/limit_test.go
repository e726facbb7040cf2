package adaptive_test

import (
	"testing"
	"time"

	"github.com/ackgate/ackgate/internal/adaptive"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// call is one sample: a call that started at offset at and took took.
func call(l *adaptive.Limiter, at, took time.Duration, overload bool) {
	l.Observe(t0.Add(at), t0.Add(at+took), overload)
}

// busy keeps n calls in flight, as the relay does while it runs passes.
func busy(l *adaptive.Limiter, n int) func() {
	l.Take(n)
	return func() {
		for range n {
			l.Release()
		}
	}
}

// Until the first sign of load the limit grows by one per good call; after
// it, by one per round of calls (1/limit per call), up to Max.
func TestGrowsWhileTheLatencyHolds(t *testing.T) {
	t.Parallel()
	l := adaptive.New(adaptive.Options{Initial: 4, Max: 64})
	done := busy(l, 10)
	for i := range 6 {
		call(l, time.Duration(i)*time.Second, 10*time.Millisecond, false)
	}
	if got := l.Limit(); got != 10 {
		t.Fatalf("after 6 good calls in slow start: limit %d, want 10", got)
	}
	// A call three times slower than the baseline ends slow start and
	// holds the limit.
	call(l, 10*time.Second, 30*time.Millisecond, false)
	if got := l.Limit(); got != 10 {
		t.Fatalf("after a slow call: limit %d, want 10 (held)", got)
	}
	// Now 1/limit per good call: 11 calls from 10 (+0.100, +0.099, ...)
	// make one more.
	for i := range 10 {
		call(l, 11*time.Second+time.Duration(i)*time.Millisecond, 10*time.Millisecond, false)
	}
	if got := l.Limit(); got != 10 {
		t.Fatalf("after 10 good calls past slow start: limit %d, want 10", got)
	}
	call(l, 12*time.Second, 10*time.Millisecond, false)
	if got := l.Limit(); got != 11 {
		t.Fatalf("after 11 good calls past slow start: limit %d, want 11", got)
	}
	done()
	// It never passes Max.
	m := adaptive.New(adaptive.Options{Initial: 2, Max: 3})
	defer busy(m, 3)()
	for i := range 10 {
		call(m, time.Duration(i)*time.Second, time.Millisecond, false)
	}
	if got := m.Limit(); got != 3 {
		t.Fatalf("limit %d past Max 3", got)
	}
}

// A limit that is not in use is not raised: idle room says nothing about
// what the downstream can take.
func TestHoldsWhenTheLimitIsNotInUse(t *testing.T) {
	t.Parallel()
	l := adaptive.New(adaptive.Options{Initial: 8, Max: 64})
	done := busy(l, 3) // fewer than half of 8
	for i := range 20 {
		call(l, time.Duration(i)*time.Second, time.Millisecond, false)
	}
	done()
	if got := l.Limit(); got != 8 {
		t.Fatalf("limit %d after good calls with 3 of 8 in use, want 8", got)
	}
}

// An overload (a 429 or 503, a timeout) halves the limit, once for all the
// calls that were under way when it came: their refusals answer the old
// limit. A refusal of a call started after the cut cuts again. Never below
// Min.
func TestShrinksOnOverloadOncePerRound(t *testing.T) {
	t.Parallel()
	l := adaptive.New(adaptive.Options{Initial: 32, Max: 64, Min: 2})
	// 32 calls start at 0..31ms; the downstream refuses all of them.
	for i := range 32 {
		call(l, time.Duration(i)*time.Millisecond, 100*time.Millisecond, true)
	}
	if got := l.Limit(); got != 16 {
		t.Fatalf("after a round of refusals: limit %d, want 16 (one cut)", got)
	}
	// Calls started after the first refusal answered (at 100ms) cut again.
	for round := range 5 {
		call(l, time.Second+time.Duration(round)*time.Second, 100*time.Millisecond, true)
	}
	if got := l.Limit(); got != 2 {
		t.Fatalf("after five more rounds of refusals: limit %d, want Min 2", got)
	}
	if got := l.Room(); got != 2 {
		t.Fatalf("room %d with nothing in flight, want 2", got)
	}
	// A refusal ends slow start: growth is 1/limit per good call from
	// here (2 + 1/2 + 1/2.5 = 2.9, then 3.24).
	defer busy(l, 2)()
	call(l, 10*time.Second, 10*time.Millisecond, false)
	call(l, 11*time.Second, 10*time.Millisecond, false)
	if got := l.Limit(); got != 2 {
		t.Fatalf("after 2 good calls past a refusal: limit %d, want 2", got)
	}
	call(l, 12*time.Second, 10*time.Millisecond, false)
	if got := l.Limit(); got != 3 {
		t.Fatalf("after 3 good calls past a refusal: limit %d, want 3", got)
	}
}

// Room counts the calls in flight against the limit; a Take past it (work
// claimed before a cut) leaves no room until enough have finished.
func TestRoom(t *testing.T) {
	t.Parallel()
	l := adaptive.New(adaptive.Options{Initial: 4, Max: 8})
	l.Take(3)
	if got := l.Room(); got != 1 {
		t.Fatalf("room %d with 3 of 4 in flight", got)
	}
	l.Take(3)
	if got := l.Room(); got != 0 {
		t.Fatalf("room %d with 6 in flight under a limit of 4", got)
	}
	for range 3 {
		l.Release()
	}
	if got := l.Room(); got != 1 {
		t.Fatalf("room %d after 3 of 6 finished", got)
	}
}

// The baseline follows a downstream that became slower for good: after a
// few hundred calls at the new speed, growth resumes.
func TestLearnsANewBaseline(t *testing.T) {
	t.Parallel()
	l := adaptive.New(adaptive.Options{Initial: 4, Max: 64})
	defer busy(l, 64)()
	call(l, 0, 10*time.Millisecond, false) // baseline 10ms; limit 5
	at := time.Second
	for range 400 {
		call(l, at, 50*time.Millisecond, false)
		at += time.Second
	}
	before := l.Limit()
	for range 50 {
		call(l, at, 50*time.Millisecond, false)
		at += time.Second
	}
	if l.Limit() <= before {
		t.Fatalf("limit %d → %d: no growth at the downstream's new, steady speed", before, l.Limit())
	}
}

// A downstream that answers in a fraction of a millisecond still grows the
// limit with calls a few milliseconds slower (Slack): on a loaded machine
// the scheduler alone varies by more than such a latency.
func TestSlackForFastDownstreams(t *testing.T) {
	t.Parallel()
	l := adaptive.New(adaptive.Options{Initial: 4, Max: 64, Slack: 5 * time.Millisecond})
	defer busy(l, 8)()
	call(l, 0, 300*time.Microsecond, false) // baseline 0.3ms: 5
	call(l, time.Second, 4*time.Millisecond, false)
	if got := l.Limit(); got != 6 {
		t.Fatalf("after a 4ms call on a 0.3ms baseline: limit %d, want 6 (within the slack)", got)
	}
	call(l, 2*time.Second, 6*time.Millisecond, false)
	if got := l.Limit(); got != 6 {
		t.Fatalf("after a 6ms call on a 0.3ms baseline: limit %d, want 6 (held: past the slack)", got)
	}
}
