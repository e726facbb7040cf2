package testenv

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// Eventually polls cond every 10ms until it holds, and fails the test with
// describe() if it still does not after timeout. It is for effects that
// follow a response (post-ack bookkeeping, spans ended after the answer, a
// server coming up), never for asserting how fast something is: the timeout
// is a generous bound, not an expectation.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, describe func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, describe())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// StepTimeout bounds how long a test waits for something another goroutine or
// process must do next: a handler reached, an answer written, a server
// stopped. It is generous for a busy machine and far below go test's own
// timeout, so a test that waits on a step that never comes fails with its
// own message instead of hanging until the whole binary is killed.
const StepTimeout = 30 * time.Second

// Receive waits up to StepTimeout for a value from ch and fails the test
// with "after 30s: " + what if none comes. Call it from the test's own
// goroutine (t.Fatal must be).
func Receive[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	return receive(t, ch, StepTimeout, what)
}

func receive[T any](t testing.TB, ch <-chan T, timeout time.Duration, what string) T {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("after %s: %s", timeout, what)
	}
	var zero T
	return zero
}

// Release holds test handlers that block on C until Now is called, or until
// the test ends: a handler still blocked when a failing test cleans up would
// keep its httptest server's Close (which waits for every request) waiting
// forever.
type Release struct {
	C    <-chan struct{}
	c    chan struct{}
	once sync.Once
}

// NewRelease returns a Release that is let go on cleanup at the latest.
// Create it after the server whose handlers wait on it: cleanups run last in,
// first out, so the handlers are let go before the server is closed.
func NewRelease(t testing.TB) *Release {
	c := make(chan struct{})
	r := &Release{C: c, c: c}
	t.Cleanup(r.Now)
	return r
}

// Now lets every waiting handler, and every later one, go on. It may be
// called more than once.
func (r *Release) Now() { r.once.Do(func() { close(r.c) }) }

// SyncBuffer collects output (logs, a child process's stderr) written from
// several goroutines while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
