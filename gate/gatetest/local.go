package gatetest

import (
	"context"
	"fmt"
	"sync"

	"github.com/ackgate/ackgate/gate"
)

// Local is an in-memory gate.Local over a Ledger. The statement's effect
// is a row counted under the idempotency key, and it counts only when the
// changes that record it commit, as in one Postgres transaction.
type Local struct {
	Ledger *Ledger
	// Script answers each run of the statement (n counts from 1); nil
	// confirms it with a new row id.
	Script func(n int, req *gate.EffectRequest) gate.EffectResult

	mu   sync.Mutex
	runs int
	rows map[string]int
}

var _ gate.Local = (*Local)(nil)

// Apply implements gate.Local.
func (x *Local) Apply(ctx context.Context, start *gate.Change, req *gate.EffectRequest, settle func(gate.EffectResult) (*gate.Change, error)) error {
	creating := start != nil && start.Claim != nil && start.Claim.Row != nil
	if creating {
		if _, _, err := x.Ledger.FindByID(ctx, start.OperationID); err == nil {
			// Found: the claim records the delivery, and nothing runs.
			op, _, err := x.Ledger.Claim(ctx, start)
			if err != nil {
				return err
			}
			return &gate.Found{Op: op}
		}
	}
	x.mu.Lock()
	x.runs++
	n, script := x.runs, x.Script
	x.mu.Unlock()
	res := gate.EffectResult{Outcome: gate.OutcomeConfirmed, ResultID: fmt.Sprintf("row-%d", n)}
	if script != nil {
		res = script(n, req)
	}
	c, err := settle(res)
	if err != nil {
		return err
	}
	switch {
	case creating:
		err = x.Ledger.commit(start, c)
	case start != nil:
		err = x.Ledger.writeAll(start, c)
	default:
		err = x.Ledger.writeAll(c)
	}
	if err != nil {
		return err
	}
	if res.Outcome == gate.OutcomeConfirmed {
		x.mu.Lock()
		if x.rows == nil {
			x.rows = map[string]int{}
		}
		x.rows[req.IdempotencyKey]++
		x.mu.Unlock()
	}
	return nil
}

// Rows is how many rows the statement left, committed, under key.
func (x *Local) Rows(key string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.rows[key]
}

// Runs is how many times the statement ran, committed or not.
func (x *Local) Runs() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.runs
}
