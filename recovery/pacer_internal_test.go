package recovery

import (
	"testing"
	"time"
)

// A route's pacer lets a burst of its rate through at once and spaces the
// rest at one per 1/rate, whatever the caller's clock says in between.
func TestPacerSpacesCallsAtItsRate(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	p := newPacer(4)
	wait := func(at time.Time) time.Duration { return p.ReserveN(at, 1).DelayFrom(at) }
	for i := range 4 {
		if d := wait(t0); d != 0 {
			t.Fatalf("call %d of the burst waits %s", i, d)
		}
	}
	if d := wait(t0); d != 250*time.Millisecond {
		t.Fatalf("fifth call waits %s, want 250ms", d)
	}
	if d := wait(t0); d != 500*time.Millisecond {
		t.Fatalf("sixth call waits %s, want 500ms", d)
	}
	// A quarter second later one of the two owed tokens is back.
	if d := wait(t0.Add(250 * time.Millisecond)); d != 500*time.Millisecond {
		t.Fatalf("after 250ms: waits %s, want 500ms", d)
	}
	// A slow rate still lets one call through, then one every 10s.
	slow := newPacer(0.1)
	if d := slow.ReserveN(t0, 1).DelayFrom(t0); d != 0 {
		t.Fatalf("slow pacer's first call waits %s", d)
	}
	if d := slow.ReserveN(t0, 1).DelayFrom(t0); d != 10*time.Second {
		t.Fatalf("slow pacer's second call waits %s, want 10s", d)
	}
}
