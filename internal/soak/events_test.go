package soak

import (
	"testing"
	"time"

	"github.com/ackgate/ackgate/internal/soak/pushsim"
)

// An event's cost: nacks inside its window only, until the next event;
// acked again once two seconds pass with acks and no nack; a straggler
// nacked after that is counted apart; readiness failures inside the
// window add up per gateway.
func TestEventCosts(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var answers []pushsim.Answer
	add := func(ms, status int) { answers = append(answers, pushsim.Answer{At: at(ms), Status: status}) }
	add(-500, 503) // before the event: not its cost
	add(100, 204)
	add(300, 503)
	add(900, 0)
	add(1500, 503)
	for ms := 1600; ms < 6000; ms += 100 {
		add(ms, 204)
	}
	add(8000, 503)  // a straggler, long after the recovery
	add(10500, 503) // the next event's
	events := []EventRecord{{Name: "a", Start: at(0), End: at(50)}, {Name: "b", Start: at(10000), End: at(10100)}}
	// Gateway 1 fails the polls at +200 ms (the next begins at +400) and
	// +400 ms (a slow one: the next begins at +1400), and one in the
	// second event's window; gateway 2 is always ready.
	rd := &readiness{samples: [][]sample{
		{{at(0), true}, {at(200), false}, {at(400), false}, {at(1400), true}, {at(10200), false}},
		{{at(0), true}, {at(200), true}},
	}, every: 200 * time.Millisecond}
	costs(events, answers, rd, at(12000))

	e := events[0]
	if e.Window != 10*time.Second || e.Nacked != 4 || e.NackedBefore != 3 || e.Acked != 45 {
		t.Fatalf("window %s, nacked %d (%d before recovery), acked %d; want 10s, 4 (3), 45", e.Window, e.Nacked, e.NackedBefore, e.Acked)
	}
	if e.FirstNack != 300*time.Millisecond || e.LastNack != 8*time.Second || e.Recovered != 1500*time.Millisecond+time.Nanosecond {
		t.Fatalf("first nack +%s, last +%s, recovered +%s", e.FirstNack, e.LastNack, e.Recovered)
	}
	if e.NackedStatuses[503] != 3 || e.NackedStatuses[0] != 1 {
		t.Fatalf("statuses %v", e.NackedStatuses)
	}
	if e.Unready[0] != 1200*time.Millisecond || e.Unready[1] != 0 {
		t.Fatalf("unready %v", e.Unready)
	}
	if b := events[1]; b.Nacked != 1 || b.Acked != 0 || b.Window != 2*time.Second || b.Unready[0] != 200*time.Millisecond {
		t.Fatalf("second event: %+v", b)
	}
}

// A failover whose effect begins a while after the event (a switchover
// demotes after a second) recovers after its nacks, not at its start; an
// event nothing nacked after recovered at once.
func TestRecoveredStartsFromTheNacks(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var answers []pushsim.Answer
	for ms := 0; ms < 1200; ms += 100 {
		answers = append(answers, pushsim.Answer{At: at(ms), Status: 204})
	}
	answers = append(answers, pushsim.Answer{At: at(1300), Status: 503}, pushsim.Answer{At: at(2500), Status: 503})
	for ms := 2600; ms < 6000; ms += 100 {
		answers = append(answers, pushsim.Answer{At: at(ms), Status: 204})
	}
	if got := recovered(answers, t0, at(6000)); got != 2500*time.Millisecond+time.Nanosecond {
		t.Fatalf("recovered +%s, want just after the last nack at +2.5s", got)
	}
	if got := recovered(answers[:10], t0, at(6000)); got != 0 {
		t.Fatalf("recovered +%s with nothing nacked, want 0", got)
	}
}
