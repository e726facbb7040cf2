// Package gatetest holds in-memory fakes of the gate's ports and the
// conformance suite that keeps them honest.
//
// The fakes exist so the gate's logic can be tested at the speed of memory
// and with interleavings a test chooses (a lease that lapses between two
// steps, a write refused in the middle of a delivery). They are worth that
// only while they behave like the real adapters, so the same conformance
// cases run against them here and against storage/ on real Postgres and
// Redis in storage's tests. A behaviour the suite does not pin down is one a
// gate test must not rely on.
package gatetest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// ErrRefused stands for the ledger's own rules turning a write down (an
// illegal transition, finishing an attempt that never started): a bug in the
// caller, as storage.ErrRefused is.
var ErrRefused = fmt.Errorf("fake ledger refused the change")

// Snapshot is everything a test may want to know about one operation.
type Snapshot struct {
	Op          gate.Operation
	Deliveries  []gate.Delivery
	Attempts    []gate.Attempt
	Transitions []gate.Transition
	DeadLetters []gate.DeadLetter
	// Interventions are the operator resolutions recorded, oldest first.
	Interventions []gate.Intervention
	// LeaseEvents are the leases found lost and the resets met, oldest first.
	LeaseEvents []LeaseEvent
	// Outbox is a handoff route's entry.
	Outbox *gate.OutboxEntry
}

// LeaseEvent is a lease lost during a call ("lost") or taken from a store
// that had lost the operation's counter ("reset"), under Fence.
type LeaseEvent struct {
	Kind  string
	Fence int64
}

// Ledger is an in-memory gate.Ledger with the guards of the Postgres one:
// every write is all or nothing, follows the transition table, and is fenced.
type Ledger struct {
	mu  sync.Mutex
	ops map[string]*Snapshot // by operation id, conflict records included

	// BeforeWrite, when set, runs before each Claim and Write with the lock
	// released; an error it returns is the call's result and nothing is
	// written. Tests use it to make the store fail, or to let another owner
	// in, at a chosen step.
	BeforeWrite func(c *gate.Change) error
	// Writes counts the claims and writes that committed.
	Writes int
}

var _ gate.Ledger = (*Ledger)(nil)

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{ops: map[string]*Snapshot{}}
}

// Claim implements gate.Ledger: the operation it finds, or nil with
// created true.
func (l *Ledger) Claim(_ context.Context, c *gate.Change) (*gate.Operation, bool, error) {
	if c == nil || c.Claim == nil || c.Claim.Row == nil || c.Claim.Delivery == nil || c.Fence != 1 {
		return nil, false, fmt.Errorf("%w: a claim creates its operation under fence 1 with its first delivery", ErrRefused)
	}
	if l.BeforeWrite != nil {
		if err := l.BeforeWrite(c); err != nil {
			return nil, false, err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.ops[c.OperationID]; ok {
		if s.Op.Fingerprint == c.Claim.Row.Fingerprint {
			s.Op.DeliveryCount++
			d := *c.Claim.Delivery
			d.OperationID, d.N, d.Found, d.Fence = s.Op.ID, s.Op.DeliveryCount, s.Op.State, 0
			d.Decision, d.Reason, d.Anomaly = "", "", ""
			if a := c.Claim.AckedAnswer; a != nil && s.Op.State == gate.StateAcknowledged {
				d.Decision, d.Reason, d.Anomaly = a.Decision, a.Reason, a.Anomaly
			}
			s.Deliveries = append(s.Deliveries, d)
		}
		return l.operation(s), false, nil
	}
	s, err := l.create(c)
	if err != nil {
		return nil, false, err
	}
	l.ops[s.Op.ID] = s
	l.Writes++
	// As the Postgres ledger, nothing of a created operation comes back.
	return nil, true, nil
}

// FindByID implements gate.Ledger.
func (l *Ledger) FindByID(_ context.Context, id string) (*gate.Operation, *gate.Intervention, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.ops[id]
	if !ok {
		return nil, nil, gate.ErrNotFound
	}
	var last *gate.Intervention
	if n := len(s.Interventions); n > 0 {
		iv := s.Interventions[n-1]
		last = &iv
	}
	return l.operation(s), last, nil
}

// operation is the row as Claim and FindByID return it: with its newest
// effect attempt.
func (l *Ledger) operation(s *Snapshot) *gate.Operation {
	op := s.Op
	op.LastAttempt = nil
	for i := len(s.Attempts) - 1; i >= 0; i-- {
		if s.Attempts[i].Kind == gate.AttemptEffect {
			a := s.Attempts[i]
			op.LastAttempt = &a
			break
		}
	}
	return &op
}

// Write implements gate.Ledger.
func (l *Ledger) Write(_ context.Context, c *gate.Change) error {
	return l.writeAll(c)
}

// writeAll commits changes together or not at all, as one transaction.
func (l *Ledger) writeAll(changes ...*gate.Change) error {
	return l.commit(nil, changes...)
}

// commit commits create (a creating claim, or nil) and changes together or
// not at all, as one transaction. A creating claim whose operation exists
// refuses the whole with ErrExists.
func (l *Ledger) commit(create *gate.Change, changes ...*gate.Change) error {
	if create != nil {
		changes = append([]*gate.Change{create}, changes...)
	}
	if l.BeforeWrite != nil {
		for _, c := range changes {
			if err := l.BeforeWrite(c); err != nil {
				return err
			}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	staged := map[string]*Snapshot{}
	for i, c := range changes {
		if c.Claim != nil && c.Claim.Row != nil {
			if i > 0 || create == nil {
				return fmt.Errorf("%w: a creating claim goes through Claim", ErrRefused)
			}
			if _, ok := l.ops[c.OperationID]; ok {
				return gate.ErrExists
			}
			s, err := l.create(c)
			if err != nil {
				return err
			}
			staged[s.Op.ID] = s
			continue
		}
		s, err := l.apply(c, staged)
		if err != nil {
			return err
		}
		staged[s.Op.ID] = s
	}
	// Everything was checked on copies; only now does it become visible.
	for id, s := range staged {
		l.ops[id] = s
	}
	l.Writes += len(changes)
	return nil
}

// current is the operation as the transaction under way sees it.
func (l *Ledger) current(id string, staged map[string]*Snapshot) (*Snapshot, bool) {
	if s, ok := staged[id]; ok {
		return s, true
	}
	s, ok := l.ops[id]
	return s, ok
}

func (l *Ledger) create(c *gate.Change) (*Snapshot, error) {
	row := *c.Claim.Row
	if len(c.Steps) == 0 || row.ID != c.OperationID {
		return nil, fmt.Errorf("%w: a creating claim needs its row and a step", ErrRefused)
	}
	switch c.Steps[len(c.Steps)-1].To {
	case gate.StatePendingEffect, gate.StateTerminalFailure:
	default:
		return nil, fmt.Errorf("%w: an operation begins in pending_effect or terminal_failure", ErrRefused)
	}
	row.State, row.ConflictOf = "", ""
	row.DeliveryCount, row.AttemptCount, row.FirstAttemptAt = 1, 0, nil
	row.ResultID, row.EvidenceAt, row.AckedAt, row.Lane, row.LeaseLostAt = "", nil, nil, "", nil
	row.HandedOffAt, row.Grant, row.NextCheckAt, row.Checks = nil, 0, nil, 0
	row.TraceID = c.Claim.Delivery.TraceID
	row.CreatedAt = c.At
	d := *c.Claim.Delivery
	d.OperationID, d.N, d.Fence, d.Found, d.ReceivedAt = row.ID, 1, 1, "", c.At
	s := &Snapshot{Op: row, Deliveries: []gate.Delivery{d}}
	return s, l.change(s, c, true)
}

func (l *Ledger) apply(c *gate.Change, staged map[string]*Snapshot) (*Snapshot, error) {
	cur, ok := l.current(c.OperationID, staged)
	if !ok || cur.Op.ConflictOf != "" {
		return nil, gate.ErrNotFound
	}
	claim := c.Claim != nil || c.Intervene != nil
	if (claim && cur.Op.Fence >= c.Fence) || (!claim && cur.Op.Fence != c.Fence) {
		return nil, gate.ErrFenced
	}
	if cur.Op.State != c.Expect {
		return nil, gate.ErrStateChanged
	}
	// Attempts are numbered in turn.
	next := cur.Op.AttemptCount + 1
	if c.Lookup != nil {
		if c.Lookup.N != next {
			return nil, fmt.Errorf("%w: lookup numbered %d, next attempt is %d", gate.ErrStateChanged, c.Lookup.N, next)
		}
		next++
	}
	if c.Start != nil && c.Start.N != next {
		return nil, fmt.Errorf("%w: attempt numbered %d, next is %d", gate.ErrStateChanged, c.Start.N, next)
	}
	s := clone(cur)
	return s, l.change(s, c, false)
}

// change applies c to s, a copy nobody else sees yet.
func (l *Ledger) change(s *Snapshot, c *gate.Change, creating bool) error {
	op := &s.Op
	for _, st := range c.Steps {
		if st.From != op.State || !(st.From == "" && creating || gate.CanTransition(st.From, st.To)) {
			return fmt.Errorf("%w: transition %q -> %q from %q", ErrRefused, st.From, st.To, op.State)
		}
		if st.From == "" && (!creating || st.To != gate.StateReceived) {
			return fmt.Errorf("%w: an operation begins in received", ErrRefused)
		}
		op.State = st.To
		s.Transitions = append(s.Transitions, st.Transition)
	}
	op.UpdatedAt = c.At
	switch {
	case c.Claim != nil:
		op.Fence, op.Owner = c.Fence, c.Claim.Owner
		start, deadline := c.At, c.Claim.LeaseDeadline
		op.LeaseStart, op.LeaseDeadline, op.LeaseExtensions, op.LeaseLostAt = &start, &deadline, 0, nil
		if d := c.Claim.Delivery; d != nil && !creating {
			for i := range s.Deliveries {
				if s.Deliveries[i].N == d.N && s.Deliveries[i].Fence == 0 {
					s.Deliveries[i].Fence = c.Fence
				}
			}
		}
		if c.Claim.Reset {
			s.LeaseEvents = append(s.LeaseEvents, LeaseEvent{Kind: "reset", Fence: c.Fence})
		}
	case c.Intervene != nil:
		iv := c.Intervene
		op.Fence, op.Owner = c.Fence, iv.Owner
		if iv.Grant > 0 {
			op.Grant = iv.Grant
		}
		op.NextCheckAt, op.Checks = iv.NextCheckAt, iv.Checks
		if iv.Intervention != nil {
			s.Interventions = append(s.Interventions, *iv.Intervention)
		}
	case c.Settle != nil:
		deadline := c.Settle.Lease.Deadline
		op.LeaseExtensions, op.LeaseDeadline, op.LeaseLostAt = c.Settle.Lease.Extensions, &deadline, c.Settle.Lease.LostAt
		if c.Settle.Lease.LostAt != nil {
			s.LeaseEvents = append(s.LeaseEvents, LeaseEvent{Kind: "lost", Fence: c.Fence})
		}
		if a := c.Settle.Answer; a != nil && a.N > 0 {
			answer(s, a)
		}
		if f := c.Settle.Finish; f != nil {
			if err := finish(s, f, c.At); err != nil {
				return err
			}
		}
	}
	if op.State != gate.StateEffectIndeterminate {
		op.Lane = ""
	}
	switch {
	case c.Kind == gate.ChangeIndeterminate:
		op.Lane = c.Lane
	case c.Kind == gate.ChangeAcked:
		at := c.At
		op.AckedAt = &at
	}
	if slices.ContainsFunc(c.Steps, func(st gate.Step) bool { return st.To == gate.StateEffectConfirmed }) {
		at := c.At
		op.ResultID, op.EvidenceAt = c.ResultID, &at
	}
	if c.Kind != gate.ChangeAcked {
		op.Reason = c.Reason
	}
	for _, a := range []*gate.Attempt{c.Lookup, c.Start} {
		if a == nil {
			continue
		}
		aa := *a
		aa.Fence = c.Fence
		if aa.StartedAt.IsZero() {
			aa.StartedAt = c.At
		}
		if creating {
			aa.StartedAt, aa.ContractVersion = c.At, op.ContractVersion
		}
		s.Attempts = append(s.Attempts, aa)
		op.AttemptCount++
		if aa.Kind == gate.AttemptEffect && op.FirstAttemptAt == nil {
			t := aa.StartedAt
			op.FirstAttemptAt = &t
		}
	}
	if e := c.Outbox; e != nil {
		at, entry := c.At, *e
		op.HandedOffAt, s.Outbox = &at, &entry
	}
	if dl := c.DeadLetter; dl != nil {
		d := *dl
		d.OperationID = op.ID
		d.At = c.At
		s.DeadLetters = append(s.DeadLetters, d)
	}
	return nil
}

func finish(s *Snapshot, f *gate.Attempt, at time.Time) error {
	for i := range s.Attempts {
		a := &s.Attempts[i]
		if a.N != f.N || a.FinishedAt != nil {
			continue
		}
		done := at
		if f.FinishedAt != nil {
			done = *f.FinishedAt
		}
		a.FinishedAt, a.Outcome, a.StatusCode, a.ResultID, a.Reason = &done, f.Outcome, f.StatusCode, f.ResultID, f.Reason
		return nil
	}
	return fmt.Errorf("%w: no unfinished attempt %d", ErrRefused, f.N)
}

// answer records a's decision on delivery a.N, once.
func answer(s *Snapshot, a *gate.Answer) {
	for i := range s.Deliveries {
		d := &s.Deliveries[i]
		if d.N == a.N && d.Decision == "" {
			d.Decision, d.Anomaly = a.Decision, a.Anomaly
			if a.Reason != "" {
				d.Reason = a.Reason
			}
		}
	}
}

// RecordConflict implements gate.Ledger.
func (l *Ledger) RecordConflict(_ context.Context, c *gate.Conflict) (*gate.Operation, error) {
	if c.Original == nil || c.Record == nil || c.Record.ID == "" || c.Delivery == nil {
		return nil, fmt.Errorf("%w: a conflict needs its original, its record and its delivery", ErrRefused)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	d := *c.Delivery
	s, ok := l.ops[c.Record.ID]
	if !ok {
		row := *c.Record
		row.ConflictOf, row.State = c.Original.ID, gate.StateConflicting
		row.Fence, row.Owner, row.LeaseStart, row.LeaseDeadline, row.LeaseExtensions = 0, "", nil, nil, 0
		row.DeliveryCount, row.AttemptCount = 1, 0
		row.TraceID = d.TraceID
		if row.CreatedAt.IsZero() {
			row.CreatedAt = c.At
		}
		row.UpdatedAt = c.At
		d.OperationID, d.N, d.Found, d.Fence, d.ReceivedAt = row.ID, 1, "", 0, row.CreatedAt
		s = &Snapshot{Op: row, Deliveries: []gate.Delivery{d}, Transitions: []gate.Transition{
			{From: "", To: gate.StateReceived}, {From: gate.StateReceived, To: gate.StateConflicting},
		}}
		l.ops[row.ID] = s
	} else {
		s.Op.DeliveryCount++
		d.OperationID, d.N, d.Found, d.Fence = s.Op.ID, s.Op.DeliveryCount, s.Op.State, 0
		s.Deliveries = append(s.Deliveries, d)
	}
	if c.DeadLetter != nil && len(s.DeadLetters) == 0 {
		dl := *c.DeadLetter
		dl.OperationID = s.Op.ID
		s.DeadLetters = append(s.DeadLetters, dl)
	}
	return l.operation(s), nil
}

// AnswerDelivery implements gate.Ledger.
func (l *Ledger) AnswerDelivery(_ context.Context, operationID string, a *gate.Answer) error {
	if a == nil || a.N < 1 {
		return fmt.Errorf("%w: the answer names no delivery", ErrRefused)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.ops[operationID]; ok {
		answer(s, a)
		if a.ResetFence > 0 {
			s.LeaseEvents = append(s.LeaseEvents, LeaseEvent{Kind: "reset", Fence: a.ResetFence})
		}
	}
	return nil
}

// Snapshot returns a copy of everything recorded for operation id.
func (l *Ledger) Snapshot(id string) (Snapshot, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.ops[id]
	if !ok {
		return Snapshot{}, false
	}
	c := clone(s)
	c.Op = *l.operation(s)
	return *c, true
}

// IDs lists every operation id, conflict records included, in order.
func (l *Ledger) IDs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(maps.Keys(l.ops))
}

func clone(s *Snapshot) *Snapshot {
	return &Snapshot{
		Op:            s.Op,
		Deliveries:    slices.Clone(s.Deliveries),
		Attempts:      slices.Clone(s.Attempts),
		Transitions:   slices.Clone(s.Transitions),
		DeadLetters:   slices.Clone(s.DeadLetters),
		Interventions: slices.Clone(s.Interventions),
		LeaseEvents:   slices.Clone(s.LeaseEvents),
		Outbox:        s.Outbox,
	}
}
