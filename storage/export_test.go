package storage

import (
	"context"

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
// returns a function that releases them into flushes.
func (l *Ledger) HoldFlushers() (queued func() int, release func()) {
	c := &l.commit
	c.mu.Lock()
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

// Queries are schema.sql's named queries.
func Queries() map[string]string { return queries }
