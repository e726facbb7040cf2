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
