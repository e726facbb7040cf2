package adminapi

import (
	"time"

	"github.com/ackgate/ackgate/gate"
)

// The lanes are the operator's queues: operations that stopped short of an
// ack and wait for a person or a policy (indeterminate, terminal, conflicts)
// and a handoff route's outbox entries not delivered yet. The console reads
// them a page at a time, oldest first, so the work that has waited longest is
// at the top.

// LaneFilter selects one page of a lane. State is required: a lane is one
// state, which is also what lets the store stay on an index.
type LaneFilter struct {
	State gate.State
	Route string
	// MessageID matches any delivery of the operation; ByMessage is the
	// operation ids it names (as adminapi.ListFilter's).
	MessageID string
	ByMessage []string
	// Limit defaults to 50 and is capped at 500.
	Limit int
	// Cursor is the Next of the previous page; "" starts from the oldest.
	Cursor string
}

// LaneEntry is one operation in a lane: ids, fingerprint and times, no
// message data.
type LaneEntry struct {
	ID            string
	Route         string
	State         gate.State
	Key           string
	Fingerprint   string
	Shape         gate.Shape
	ConflictOf    string
	AttemptCount  int
	DeliveryCount int
	Reason        string
	Lane          string
	TraceID       string
	CreatedAt     time.Time
	// UpdatedAt is when the operation last changed: for an indeterminate or
	// terminal one, when it entered the lane unless a lookup touched it since.
	UpdatedAt time.Time
	// DeadLetterAt is set when the gateway dead-lettered the operation.
	DeadLetterAt     *time.Time
	DeadLetterReason string
}

// LanePage is one page of a lane and the cursor of the next ("" when none).
type LanePage struct {
	Entries []LaneEntry
	Next    string
}

// LaneCount is how many entries of a route wait in one lane, counted up to
// a cap: Capped says there are at least N and maybe more. Lane is a state's
// name, or LaneOutbox.
type LaneCount struct {
	Route  string
	Lane   string
	N      int64
	Capped bool
}

// LaneOutbox names the lane of a handoff route's undelivered outbox entries.
const LaneOutbox = "outbox"

// OutboxFilter selects one page of undelivered outbox entries.
type OutboxFilter struct {
	Route  string
	Limit  int
	Cursor string
}

// OutboxPage is one page of a handoff outbox: the entries' ids and schedule,
// never the message they carry.
type OutboxPage struct {
	Entries []OutboxRow
	Next    string
}

// OutboxRow is an undelivered entry with its operation's state: an entry
// whose operation is open waits for the relay; one whose operation ended
// (cancelled, terminal, indeterminate) waits for an operator, and the
// relay leaves it alone.
type OutboxRow struct {
	gate.OutboxEntry
	State gate.State
}
