package storage

import (
	"slices"

	"github.com/ackgate/ackgate/gate"
)

// SendBatch sends changes to the server as one shared statement, as group
// commit does when they arrive together, and returns each one's answer.
func (l *Ledger) SendBatch(changes []*gate.Change) []error {
	batch := make([]*pending, len(changes))
	for i, c := range changes {
		wire, err := encode(c)
		if err != nil {
			panic(err)
		}
		batch[i] = &pending{id: c.OperationID, wire: wire, done: make(chan error, 1)}
	}
	return l.sendAll(batch)
}

// SendRaw sends wire forms as they are, to break the shared statement
// itself.
func (l *Ledger) SendRaw(ids []string, wires [][]byte) []error {
	batch := make([]*pending, len(ids))
	for i := range ids {
		batch[i] = &pending{id: ids[i], wire: wires[i], done: make(chan error, 1)}
	}
	return l.sendAll(batch)
}

func (l *Ledger) sendAll(batch []*pending) []error {
	l.send(slices.Clone(batch))
	out := make([]error, len(batch))
	for i, p := range batch {
		out[i] = <-p.done
	}
	return out
}

// HoldFlushers makes every flusher slot look busy, so Writes queue up, and
// returns a function that releases them into one flush.
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

// SendPerChangeOnly makes every batch go through ackgate_write, as before
// migration 0017, so that a test can compare the two ways.
func (l *Ledger) SendPerChangeOnly() {
	l.commit.mu.Lock()
	defer l.commit.mu.Unlock()
	l.commit.setFrom = maxBatch + 1
}

// SetBasedFrom sends batches of n changes or more set-based, in place of
// minSetBatch, so that a test's small batches take that path.
func (l *Ledger) SetBasedFrom(n int) {
	l.commit.mu.Lock()
	defer l.commit.mu.Unlock()
	l.commit.setFrom = n
}

// Encode exposes the wire form of a change.
func Encode(c *gate.Change) ([]byte, error) { return encode(c) }

// EncodeDeliveryOnly exposes the wire form of RecordDelivery.
func EncodeDeliveryOnly(d *gate.Delivery) ([]byte, error) { return encodeDeliveryOnly(d) }
