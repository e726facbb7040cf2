package testenv

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// fatalRecorder stands in for a test: Fatalf records the message and ends
// the goroutine, as testing.T's does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}
func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestReceive(t *testing.T) {
	t.Parallel()
	ch := make(chan int, 1)
	ch <- 7
	if got := Receive(t, ch, "a value"); got != 7 {
		t.Fatalf("Receive = %d, want 7", got)
	}

	// Nothing comes: the wait ends with the caller's words, not a hang.
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		receive(rec, make(chan int), 10*time.Millisecond, "the handler was never reached")
		rec.msg = "receive returned without failing"
	}()
	Receive(t, done, "receive did not give up on an empty channel")
	if rec.msg != "after 10ms: the handler was never reached" {
		t.Fatalf("failure message %q", rec.msg)
	}
}

func TestReleaseOnCleanup(t *testing.T) {
	t.Parallel()
	var r *Release
	t.Run("inner", func(t *testing.T) {
		r = NewRelease(t)
		r.Now()
		r.Now() // twice is fine
		r = NewRelease(t)
		select {
		case <-r.C:
			t.Fatal("released before Now or cleanup")
		default:
		}
	})
	// The inner test is over: its cleanup let the handlers go.
	Receive(t, r.C, "a Release was not let go when its test ended")
}
