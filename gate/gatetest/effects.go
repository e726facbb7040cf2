package gatetest

import (
	"context"
	"fmt"
	"sync"

	"github.com/ackgate/ackgate/gate"
)

// Effects is a scripted downstream. By default every call applies the
// effect and confirms it; Script decides each call's fate instead, and what
// was applied is kept per idempotency key, as a provider's own records.
type Effects struct {
	mu sync.Mutex
	// Dedupe makes it honour the idempotency key like a well-behaved
	// provider; without it every applied call is a new effect.
	Dedupe bool
	// Script, when set, answers each call: apply performs the effect (and
	// returns its result id), and the returned result is what the gate sees.
	// Not calling apply is a call that failed before doing anything; calling
	// it and returning OutcomeUnknown is a response lost after the effect.
	Script func(n int, req *gate.EffectRequest, apply func() string) gate.EffectResult
	// LookupDown makes every lookup fail.
	LookupDown bool
	// OnCall runs at the start of every Execute, for tests that need to act
	// while a call is in flight.
	OnCall func(req *gate.EffectRequest)

	calls   int
	lookups int
	applied map[string][]string // idempotency key -> result ids of applied effects
	fences  []int64
}

var _ gate.Effects = (*Effects)(nil)

// Execute implements gate.Effects.
func (e *Effects) Execute(_ context.Context, req *gate.EffectRequest) gate.EffectResult {
	if e.OnCall != nil {
		e.OnCall(req)
	}
	e.mu.Lock()
	e.calls++
	n, script := e.calls, e.Script
	e.fences = append(e.fences, req.Fence)
	e.mu.Unlock()
	apply := func() string { return e.apply(req.IdempotencyKey) }
	if script == nil {
		return gate.EffectResult{Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: apply()}
	}
	return script(n, req, apply)
}

func (e *Effects) apply(key string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.applied == nil {
		e.applied = map[string][]string{}
	}
	if ids := e.applied[key]; e.Dedupe && len(ids) > 0 {
		return ids[0]
	}
	id := fmt.Sprintf("res-%s-%d", key, len(e.applied[key])+1)
	e.applied[key] = append(e.applied[key], id)
	return id
}

// Lookup implements gate.Effects: it answers from the provider's records.
func (e *Effects) Lookup(_ context.Context, req *gate.EffectRequest) gate.LookupResult {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lookups++
	if e.LookupDown {
		return gate.LookupResult{Outcome: gate.OutcomeUnknown, StatusCode: 503, Reason: "lookup unavailable"}
	}
	if ids := e.applied[req.IdempotencyKey]; len(ids) > 0 {
		return gate.LookupResult{Outcome: gate.OutcomeConfirmed, StatusCode: 200, ResultID: ids[0]}
	}
	return gate.LookupResult{Outcome: gate.OutcomeAbsent, StatusCode: 404}
}

// Applied is how many effects were applied under key.
func (e *Effects) Applied(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.applied[key])
}

// Calls is how many effect calls were made.
func (e *Effects) Calls() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls
}

// Lookups is how many lookups were made.
func (e *Effects) Lookups() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lookups
}
