package authlimit_test

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/ackgate/ackgate/internal/authlimit"
)

type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func limits() authlimit.Limits {
	return authlimit.Limits{PerClient: rate.Every(6 * time.Second), PerClientBurst: 3, Overall: rate.Every(time.Second), OverallBurst: 5, MaxClients: 100}
}

// failures spends n failed checks from client and returns how many were
// allowed to be checked.
func failures(l *authlimit.Limiter, client string, n int) int {
	allowed := 0
	for range n {
		if a, ok, _ := l.Begin(client); ok {
			allowed++
			a.Failed()
		}
	}
	return allowed
}

// A client gets its burst of failures, then is refused until its bucket
// refills; other clients keep theirs; successes cost nothing.
func TestPerClientFailures(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Unix(1000, 0)}
	l := authlimit.New(limits(), c.Now)
	if n := failures(l, "10.0.0.1", 10); n != 3 {
		t.Fatalf("%d failed checks allowed, want 3", n)
	}
	_, ok, wait := l.Begin("10.0.0.1")
	if ok || wait <= 0 || wait > 6*time.Second {
		t.Fatalf("a spent client: allowed %v, retry after %s", ok, wait)
	}
	for range 20 { // the right token, many times: nothing spent
		a, ok, _ := l.Begin("10.0.0.2")
		if !ok {
			t.Fatal("a client with only successes was refused")
		}
		a.Succeeded()
	}
	c.now = c.now.Add(6 * time.Second)
	if n := failures(l, "10.0.0.1", 3); n != 1 {
		t.Fatalf("after one refill period: %d allowed, want 1", n)
	}
}

// Failures spread over many clients meet the overall bucket, which then
// refuses everyone until it refills.
func TestOverallFailures(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Unix(1000, 0)}
	l := authlimit.New(limits(), c.Now)
	allowed := 0
	for i := range 20 {
		allowed += failures(l, fmt.Sprintf("10.0.1.%d", i), 1)
	}
	if allowed != 5 {
		t.Fatalf("%d failed checks allowed across clients, want the overall burst of 5", allowed)
	}
	if _, ok, _ := l.Begin("10.0.9.9"); ok {
		t.Fatal("a fresh client was checked with the overall budget spent")
	}
	c.now = c.now.Add(time.Second)
	if _, ok, _ := l.Begin("10.0.9.9"); !ok {
		t.Fatal("the overall budget did not refill")
	}
}

// The clients tracked stay bounded.
func TestClientsAreBounded(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Unix(1000, 0)}
	lim := limits()
	lim.MaxClients, lim.OverallBurst = 10, 1000
	l := authlimit.New(lim, c.Now)
	for i := range 50 {
		failures(l, fmt.Sprintf("10.0.2.%d", i), 1)
	}
	if n := l.Tracked(); n > 10 {
		t.Fatalf("%d clients tracked, bound 10", n)
	}
	// The latest client is among those kept: its spent failure still counts.
	if n := failures(l, "10.0.2.49", 5); n != 2 {
		t.Fatalf("the last client: %d more allowed, want 2", n)
	}
}

// Concurrent checks cannot overdraw a bucket: while checks are running,
// only as many more start as the bucket has tokens for them all.
func TestConcurrentChecksAreCounted(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Unix(1000, 0)}
	l := authlimit.New(limits(), c.Now)
	var running []authlimit.Attempt
	for range 10 {
		if a, ok, _ := l.Begin("10.0.3.1"); ok {
			running = append(running, a)
		}
	}
	if len(running) != 3 {
		t.Fatalf("%d concurrent checks started, want the burst of 3", len(running))
	}
	running[0].Succeeded() // a right token: its room comes back
	if _, ok, _ := l.Begin("10.0.3.1"); !ok {
		t.Fatal("no room after a check succeeded")
	}
}
