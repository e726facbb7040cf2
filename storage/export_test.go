package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"go.opentelemetry.io/otel/trace"
)

// SendBatch sends changes to the server as one round trip, as group commit
// does when they arrive together, and returns each one's answer.
func (l *Ledger) SendBatch(changes []*gate.Change) []error {
	batch := make([]*job, len(changes))
	for i, c := range changes {
		batch[i] = &job{kind: changeJob, id: c.OperationID, change: c, span: trace.SpanFromContext(context.Background()), done: make(chan jobResult, 1)}
	}
	l.send(batch)
	out := make([]error, len(batch))
	for i, j := range batch {
		out[i] = (<-j.done).err
	}
	return out
}

// HoldFlushers makes every flusher slot look busy, so steps queue up, and
// returns a function that releases them into flushes. It first waits for
// the flushers of earlier steps to leave: a caller has its answer before
// its flusher looks at the queue again, and a flusher still looking would
// take the steps meant to be held.
func (l *Ledger) HoldFlushers() (queued func() int, release func()) {
	c := &l.commit
	c.lockIdle()
	c.flushers = maxFlushers
	c.mu.Unlock()
	queued = func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.queue)
	}
	release = func() {
		c.mu.Lock()
		c.flushers = 1
		c.mu.Unlock()
		l.flush() // leaves the slot when the queue is empty
	}
	return queued, release
}

// WaitFlushersIdle returns once no flusher runs: a caller has its answer
// before its flusher looks at the queue again, and a flusher still looking
// would take the next step at once.
func (l *Ledger) WaitFlushersIdle() {
	l.commit.lockIdle()
	l.commit.mu.Unlock()
}

// lockIdle waits until no flusher runs and returns holding c.mu.
func (c *committer) lockIdle() {
	for {
		c.mu.Lock()
		if c.flushers == 0 {
			return
		}
		c.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
}

// StallAfter is how long a batch may be out before relief.
const StallAfter = stallAfter

// LingerAckMarks makes a lone ack mark wait d for a batch to ride, and
// returns the number of steps queued at any moment.
func (l *Ledger) LingerAckMarks(d time.Duration) (queued func() int) {
	c := &l.commit
	c.mu.Lock()
	c.linger = d
	c.mu.Unlock()
	return func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.queue)
	}
}

// DeadLettersQuery exposes the listing's SQL, for its plan.
func (l *Ledger) DeadLettersQuery(f adminapi.DeadLetterFilter) (string, []any, error) {
	sql, args, _, err := deadLettersQuery(f)
	return sql, args, err
}

// LaneQuery exposes a lane page's SQL, for its plan.
func LaneQuery(f adminapi.LaneFilter) (string, []any, error) {
	sql, args, _, err := laneQuery(f)
	return sql, args, err
}

// SchemaDDL is schema.sql's DDL.
func SchemaDDL() string { return schemaDDL }

// Queries are schema.sql's named queries as the server gets them, and the
// claim as a batch without dead letters and handoffs sends it.
func Queries() map[string]string {
	out := map[string]string{"claim (plain)": expanded("claim", sideRowsSection)}
	for name := range queries {
		out[name] = expanded(name)
	}
	return out
}

// PlanNode is one node of an EXPLAIN (ANALYZE, FORMAT JSON) plan: its
// type, the relation and index it scans (a bitmap index scan names only
// its index), its direction, and the rows it returned and, for a scan,
// read from its relation (returned, or read and filtered out), over all
// its loops, and how many loops it ran. Tests hold listings to what they
// read with it, and locking statements to how often they lock.
type PlanNode struct {
	Type, Relation, Index, Direction string
	Rows, Read, Loops                float64
}

func (n PlanNode) String() string {
	return fmt.Sprintf("%s on %s (%s %s) read %.0f", n.Type, n.Relation, n.Index, n.Direction, n.Read)
}

// PlanNodes lists the nodes of an EXPLAIN (ANALYZE, FORMAT JSON) plan,
// each before the nodes under it.
func PlanNodes(raw []byte) ([]PlanNode, error) {
	var plan any
	if err := json.Unmarshal(raw, &plan); err != nil {
		return nil, err
	}
	var out []PlanNode
	var walk func(any)
	walk = func(v any) {
		switch n := v.(type) {
		case []any:
			for _, x := range n {
				walk(x)
			}
		case map[string]any:
			if t, ok := n["Node Type"].(string); ok {
				num := func(k string) float64 { f, _ := n[k].(float64); return f }
				p := PlanNode{Type: t, Rows: num("Actual Rows") * num("Actual Loops"), Loops: num("Actual Loops")}
				p.Relation, _ = n["Relation Name"].(string)
				p.Index, _ = n["Index Name"].(string)
				p.Direction, _ = n["Scan Direction"].(string)
				p.Read = p.Rows + (num("Rows Removed by Filter")+num("Rows Removed by Index Recheck"))*num("Actual Loops")
				out = append(out, p)
			}
			if p, ok := n["Plan"]; ok {
				walk(p)
			}
			if ps, ok := n["Plans"]; ok {
				walk(ps)
			}
		}
	}
	walk(plan)
	return out, nil
}

// The statements that lock outbox entries, for their plans.
const (
	ClaimEachSQL   = claimEachSQL
	ClaimOutboxSQL = claimOutboxSQL
	SweepOutboxSQL = sweepOutboxSQL
)

// ClaimDueSQL is the reconciler's claim of due operations, for its plan.
var ClaimDueSQL = claimDueSQL

// PurgePoisonSQL is the poison purge, for its plan.
var PurgePoisonSQL = purgePoisonSQL
