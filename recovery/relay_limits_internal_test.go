package recovery

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// answers is a downstream that answers each call with the next status and
// takes the next duration of a fake clock to do it.
type answers struct {
	clock    *time.Time
	statuses []int
	took     []time.Duration
	calls    int
}

func (a *answers) Execute(context.Context, *gate.EffectRequest) gate.EffectResult {
	i := a.calls
	a.calls++
	*a.clock = a.clock.Add(a.took[i])
	code := a.statuses[i]
	if code >= 200 && code < 300 {
		return gate.EffectResult{Outcome: gate.OutcomeConfirmed, StatusCode: code, ResultID: "r"}
	}
	if code == 0 {
		return gate.EffectResult{Outcome: gate.OutcomeUnknown, Reason: "sent, no answer: effect timeout (1s) reached"}
	}
	return gate.EffectResult{Outcome: gate.OutcomeRetryable, StatusCode: code}
}

func (a *answers) Lookup(context.Context, *gate.EffectRequest) gate.LookupResult {
	return gate.LookupResult{Outcome: gate.OutcomeAbsent}
}

// The relay's effects feed each route's limit with what its downstream
// answered: fast 201s grow it, a 503 or 429 or a call without an answer
// halves it (once for the calls that were under way together), a route
// that is not handoff is not observed, and lookups pass through.
func TestRelayLimitsFollowTheDownstream(t *testing.T) {
	t.Parallel()
	ship := &gate.Route{Name: "ship", Shape: gate.ShapeHandoff}
	other := &gate.Route{Name: "other", Shape: gate.ShapeIdempotent}
	limits := NewRelayLimits([]*gate.Route{ship, other}, 64)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	limits.now = func() time.Time { return now }
	ms := time.Millisecond
	down := &answers{clock: &now,
		statuses: []int{201, 201, 201, 201, 503, 201, 429, 0, 201},
		took:     []time.Duration{10 * ms, 10 * ms, 10 * ms, 10 * ms, 10 * ms, 10 * ms, 10 * ms, 10 * ms, 10 * ms}}
	effects := limits.Observe(down)
	lim := limits.of("ship")
	if got := limits.Limit("ship"); got != 4 {
		t.Fatalf("start: %d, want 4", got)
	}
	lim.Take(4) // the limit is in use
	call := func() { effects.Execute(context.Background(), &gate.EffectRequest{Route: ship}) }
	for range 4 {
		call()
	}
	if got := limits.Limit("ship"); got != 8 {
		t.Fatalf("after four fast 201s: %d, want 8", got)
	}
	call() // 503
	if got := limits.Limit("ship"); got != 4 {
		t.Fatalf("after a 503: %d, want 4", got)
	}
	call() // 201: past slow start, +1/4
	call() // 429
	if got := limits.Limit("ship"); got != 2 {
		t.Fatalf("after a 429: %d, want 2", got)
	}
	call() // no answer in time
	if got := limits.Limit("ship"); got != 1 {
		t.Fatalf("after a call without an answer: %d, want 1", got)
	}
	effects.Execute(context.Background(), &gate.EffectRequest{Route: other})
	if got := limits.Limit("other"); got != 0 {
		t.Fatalf("a route that is not handoff has a limit: %d", got)
	}
	if got := effects.Lookup(context.Background(), &gate.EffectRequest{Route: ship}); got.Outcome != gate.OutcomeAbsent || down.calls != 9 {
		t.Fatalf("lookup: %+v after %d calls", got, down.calls)
	}
	if got := limits.Limit("ship"); got != 1 {
		t.Fatalf("a non-handoff call or a lookup moved the limit: %d", got)
	}
	for code, want := range map[int]bool{http.StatusServiceUnavailable: true, http.StatusTooManyRequests: true,
		http.StatusGatewayTimeout: true, http.StatusInternalServerError: false, http.StatusConflict: false} {
		if got := overloaded(gate.EffectResult{StatusCode: code, Outcome: gate.OutcomeRetryable}); got != want {
			t.Errorf("status %d overloaded = %v, want %v", code, got, want)
		}
	}
}

// A round claims for a route once a quarter of its limit is free, or when
// none of its passes runs: not one entry per pass that ends.
func TestRelayRoundsClaimInBatches(t *testing.T) {
	t.Parallel()
	ship := &gate.Route{Name: "ship", Shape: gate.ShapeHandoff, Effect: gate.EffectSpec{Timeout: time.Second}}
	post := &gate.Route{Name: "post", Shape: gate.ShapeHandoff, Effect: gate.EffectSpec{Timeout: time.Second}}
	limits := NewRelayLimits([]*gate.Route{ship, post}, 64)
	r := &Relay{limits: limits, names: []string{"ship", "post"}, concurrency: 64}
	// Raise ship's limit to 16 with good calls while it is in use.
	s := limits.byRoute["ship"]
	s.Take(16)
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for i := range 12 {
		s.Observe(t0.Add(time.Duration(i)*time.Second), t0.Add(time.Duration(i)*time.Second+time.Millisecond), false)
	}
	if got := s.Limit(); got != 16 {
		t.Fatalf("ship's limit %d, want 16", got)
	}
	s.Release() // 15 running: 1 free, less than a quarter of 16
	want := r.wanted(context.Background(), true)
	if _, ok := want["ship"]; ok || want["post"] != 4 {
		t.Fatalf("with 1 of 16 free on ship and post idle: %v; want nothing of ship and 4 of post", want)
	}
	for range 3 {
		s.Release()
	}
	if want := r.wanted(context.Background(), true); want["ship"] != 4 {
		t.Fatalf("with 4 of 16 free: %v; want 4 of ship", want)
	}
	if want := r.wanted(context.Background(), false); want["ship"] != 64 || want["post"] != 64 {
		t.Fatalf("a tick asks for Concurrency of each: %v", want)
	}
}
