package soak

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"
)

// operatorNote is kept with each of the soak operator's interventions.
const operatorNote = "soak operator"

// OperatorAction is one resolution or replay the admin API applied (200).
type OperatorAction struct {
	OperationID string
	// Kind is happened, not_happened, abandon or replay.
	Kind string
}

// OperatorStats counts what the soak's operator did.
type OperatorStats struct {
	Rounds                                   int
	Happened, NotHappened, Abandoned, Replay int
	// Republished counts messages published again after a grant whose
	// broker was done with them: a replay or a not_happened needs a
	// delivery to make its attempt.
	Republished int
	// Cured counts poisoned payloads the downstream was told to accept
	// before their replay.
	Cured int
	// Refused counts 409s: the operation moved on between the list and the
	// request. Errors counts rounds cut short by an unreachable API.
	Refused, Errors int
}

// operator plays the person on call. Each round it lists the indeterminate
// operations and the dead letters through the admin API and settles them
// the way the runbook says, from the downstream's own record (its
// console): an effect that exists is resolved happened with its result id;
// one that does not is resolved not_happened (one more attempt under the
// same key), or, for one in four, abandoned. Lookup routes' operations are
// left to the reconciler until it has tried twice. Terminal operations are
// replayed once each, after the downstream was told to accept the payload
// (the fix an operator waits for before replaying). A grant needs a
// delivery: when the broker is done with the message, the operator
// publishes it again, as from a dead-letter topic; a handoff's relay takes
// the entry up by itself.
type operator struct {
	r     *runner
	admin *adminClient

	mu        sync.Mutex
	actions   []OperatorAction
	abandoned map[string]bool
	replayed  map[string]bool
	stats     OperatorStats
}

func newOperator(r *runner, admin *adminClient) *operator {
	return &operator{r: r, admin: admin, abandoned: map[string]bool{}, replayed: map[string]bool{}}
}

// run goes through the lanes every `every` until stop is called.
func (o *operator) run(ctx context.Context, every time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(every):
			}
			o.round(ctx, false)
		}
	})
	return func() { cancel(); wg.Wait() }
}

// touched lists the operations the operator acted on.
func (o *operator) touched() map[string]bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[string]bool, len(o.actions))
	for _, a := range o.actions {
		out[a.OperationID] = true
	}
	return out
}

func (o *operator) snapshot() ([]OperatorAction, OperatorStats) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.actions), o.stats
}

func (o *operator) count(f func(*OperatorStats)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	f(&o.stats)
}

// round is one pass; final takes every indeterminate operation, the
// reconciler's too, since the run is ending. It returns how many messages
// it published again.
func (o *operator) round(ctx context.Context, final bool) int {
	o.count(func(s *OperatorStats) { s.Rounds++ })
	republished := 0
	ops, err := o.admin.operations(ctx, "effect_indeterminate")
	if err != nil {
		o.count(func(s *OperatorStats) { s.Errors++ })
		return 0
	}
	for _, op := range ops {
		if ctx.Err() != nil {
			return republished
		}
		rt, ok := routeNamed(op.Route)
		if !ok || op.ConflictOf != "" || rt.endpoint.Name == "" {
			continue
		}
		if rt.endpoint.Lookup && op.Checks < 2 && !final {
			continue // the reconciler's, for now
		}
		kind, resultID, reason := "not_happened", "", "the downstream has no effect under this key"
		if id, applied := o.r.down.Applied(rt.endpoint.Name, op.IdempotencyKey); applied {
			kind, resultID, reason = "happened", id, "the downstream applied it as "+id
		} else if hashOf(op.ID)%4 == 0 {
			kind, reason = "abandon", "the downstream has no effect under this key; the business gives it up"
		}
		if o.apply(ctx, op.ID, kind, resultID, reason) && kind == "not_happened" && rt.shape != shapeHandoff {
			republished += o.republish(ctx, op.ID)
		}
	}

	dls, err := o.admin.deadLetters(ctx)
	if err != nil {
		o.count(func(s *OperatorStats) { s.Errors++ })
		return republished
	}
	for _, dl := range dls {
		if ctx.Err() != nil {
			return republished
		}
		rt, ok := routeNamed(dl.Route)
		o.mu.Lock()
		skip := o.abandoned[dl.OperationID] || o.replayed[dl.OperationID]
		o.mu.Unlock()
		if !ok || !dl.Replayable || dl.State != "terminal_failure" || skip || rt.endpoint.Name == "" {
			continue
		}
		rec, err := o.admin.record(ctx, dl.OperationID)
		if err != nil {
			o.count(func(s *OperatorStats) { s.Errors++ })
			continue
		}
		if p, ok := o.r.publicationOf(rec); ok {
			o.r.down.Cure(p.intent.BodySHA256)
			o.count(func(s *OperatorStats) { s.Cured++ })
		}
		if o.apply(ctx, dl.OperationID, "replay", "", "the downstream accepts the payload now") && rt.shape != shapeHandoff {
			republished += o.republish(ctx, dl.OperationID)
		}
	}
	return republished
}

// apply posts one resolution and records it when the gateway applied it.
func (o *operator) apply(ctx context.Context, id, kind, resultID, reason string) bool {
	ok, err := o.admin.resolve(ctx, id, kind, resultID, reason)
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case err != nil:
		o.stats.Errors++
		return false
	case !ok:
		o.stats.Refused++
		return false
	}
	o.actions = append(o.actions, OperatorAction{OperationID: id, Kind: kind})
	switch kind {
	case "happened":
		o.stats.Happened++
	case "not_happened":
		o.stats.NotHappened++
	case "abandon":
		o.stats.Abandoned++
		o.abandoned[id] = true
	case "replay":
		o.stats.Replay++
		o.replayed[id] = true
	}
	return true
}

// republish publishes the operation's message again when the broker is
// done with every publication of it; while one is still being delivered,
// that delivery makes the granted attempt.
func (o *operator) republish(ctx context.Context, id string) int {
	rec, err := o.admin.record(ctx, id)
	if err != nil {
		o.count(func(s *OperatorStats) { s.Errors++ })
		return 0
	}
	p, ok := o.r.publicationOf(rec)
	if !ok || o.r.delivering(p.intent.Route, p.intent.MessageID) {
		return 0
	}
	o.r.publish(ctx, p.again())
	o.count(func(s *OperatorStats) { s.Republished++ })
	return 1
}

func routeNamed(name string) (route, bool) {
	for _, rt := range routes {
		if rt.name == name {
			return rt, true
		}
	}
	return route{}, false
}

func hashOf(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}

// OpLanes is what the admin API shows of an operation's way through the
// lanes, for the checker.
type OpLanes struct {
	Interventions []LaneAction
	// IndeterminateExits counts transitions out of effect_indeterminate:
	// by an operator's resolution or by the reconciler's lookup.
	IndeterminateExits int
	// LookupFound: a lookup (the delivery path's, the relay's or the
	// reconciler's) found the effect.
	LookupFound bool
	// EffectAttempts counts effect calls; RetriedUnknown says an effect
	// call whose answer was lost (unknown, or never recorded: its owner
	// died) was followed by another effect call under the same key that
	// was confirmed.
	EffectAttempts int
	RetriedUnknown bool
}

// LaneAction is one intervention as the ledger recorded it.
type LaneAction struct {
	Kind, Actor, From, To string
}

// readLanes reads, through the admin API, the recovery of every operation
// that may have one: those with more or fewer than one attempt, checked by
// the reconciler, granted an attempt, not confirmed, handed off, or touched
// by the operator. Every other operation took its effect at the first call
// and has nothing to say about the lanes.
func (r *runner) readLanes(ctx context.Context, admin *adminClient, touched map[string]bool) (map[string]*OpLanes, error) {
	ops, err := admin.operations(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("lanes: %w", err)
	}
	out := map[string]*OpLanes{}
	for _, op := range ops {
		if op.AttemptCount == 1 && op.Checks == 0 && op.Grant == 0 && slices.Contains(confirmedStates, op.State) &&
			op.Shape != shapeHandoff && !touched[op.ID] {
			continue
		}
		rec, err := admin.record(ctx, op.ID)
		if err != nil {
			return nil, fmt.Errorf("lanes: %s: %w", op.ID, err)
		}
		l := &OpLanes{}
		for _, iv := range rec.Interventions {
			l.Interventions = append(l.Interventions, LaneAction{Kind: iv.Kind, Actor: iv.Actor, From: iv.From, To: iv.To})
		}
		for _, tr := range rec.Transitions {
			if tr.From == "effect_indeterminate" {
				l.IndeterminateExits++
			}
		}
		lost := false
		for _, a := range rec.Attempts {
			switch {
			case a.Kind == "lookup" && a.Outcome == "confirmed":
				l.LookupFound = true
			case a.Kind == "effect":
				l.EffectAttempts++
				if a.Outcome == "confirmed" && lost {
					l.RetriedUnknown = true
				}
				lost = lost || a.Outcome == "unknown" || a.Outcome == ""
			}
		}
		out[op.ID] = l
	}
	return out, nil
}
