// Package adminapi holds the admin API's shared types: the evidence read
// model that storage returns and the admin handler reads, and the JSON
// documents the admin listener writes and `gateway ops` decodes.
//
// It exists so that the server, its store and its client agree on these
// types without importing one another: handlers never depends on storage, and
// the CLI never on handlers. It is a leaf that imports only gate, the domain
// whose records it carries.
package adminapi

import (
	"errors"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// Record is an operation's whole evidence as the ledger holds it: the
// operation and every row recorded about it.
type Record struct {
	gate.Operation
	Deliveries []gate.Delivery `json:"deliveries"`
	Attempts   []gate.Attempt  `json:"attempts"`
	Events     []Event         `json:"events"`
	// DeadLetters has at most one entry: a message leaves circulation once.
	DeadLetters []gate.DeadLetter `json:"dead_letters"`
	// Interventions are operators' resolutions, oldest first.
	Interventions []gate.Intervention `json:"manual_interventions"`
}

// Event is one entry of an operation's transition log.
type Event struct {
	Seq int `json:"seq"`
	// From is "" for the entry that created the record.
	From      gate.State `json:"from,omitempty"`
	To        gate.State `json:"to"`
	At        time.Time  `json:"at"`
	Fence     int64      `json:"fence"`
	MessageID string     `json:"message_id,omitempty"`
	Reason    string     `json:"reason,omitempty"`
}

// ListFilter selects operations for GET /v1/operations. Empty fields match
// all.
type ListFilter struct {
	Route string
	State string
	// MessageID matches any delivery of the operation.
	MessageID string
	Key       string
	// Limit defaults to 50 and is capped at 500.
	Limit int
	// Cursor is the next_cursor of the previous page; "" starts from the newest.
	Cursor string
}

// ErrInvalidFilter is a ListFilter the store cannot answer (an unknown state,
// a malformed cursor): the client is at fault, and the admin API says 400.
var ErrInvalidFilter = errors.New("invalid filter")

// EvidenceRecord is what "what happened to message X?" gets back: the
// minimized evidence fields, the raw ledger rows behind them, and the
// completion statement.
type EvidenceRecord struct {
	Operation   gate.Operation    `json:"operation"`
	Evidence    EvidenceFields    `json:"evidence"`
	Statement   string            `json:"completion_statement"`
	Deliveries  []gate.Delivery   `json:"deliveries"`
	Attempts    []gate.Attempt    `json:"attempts"`
	Transitions []Event           `json:"transitions"`
	DeadLetters []gate.DeadLetter `json:"dead_letters"`
	Contract    *gate.Route       `json:"contract,omitempty"`
	Links       map[string]string `json:"links,omitempty"`
}

// EvidenceFields names each field of the minimized evidence record once, so an
// operator does not have to know the ledger's tables to read it.
type EvidenceFields struct {
	DeliveryID           string         `json:"delivery_id"`
	ReceiveCount         int            `json:"receive_count"`
	OperationScope       string         `json:"operation_scope"`
	SemanticFingerprint  string         `json:"semantic_fingerprint"`
	MessageSchemaVersion int            `json:"message_schema_version"`
	LeaseStart           *time.Time     `json:"lease_start,omitempty"`
	LeaseDeadline        *time.Time     `json:"lease_deadline,omitempty"`
	LeaseExtensions      int            `json:"lease_extensions"`
	LeaseLostAt          *time.Time     `json:"lease_lost_at,omitempty"`
	OwnerToken           string         `json:"owner_token"`
	FencingVersion       int64          `json:"fencing_version"`
	TransitionTimes      []TransitionAt `json:"reservation_transition_times"`
	PendingHandoffID     *string        `json:"pending_handoff_or_outbox_id"`
	EffectAttemptID      string         `json:"effect_attempt_id,omitempty"`
	IdempotencyKey       string         `json:"idempotency_key"`
	ResultID             string         `json:"provider_result_id,omitempty"`
	EffectStatus         gate.State     `json:"effect_status"`
	EvidenceTime         *time.Time     `json:"evidence_time,omitempty"`
	AckConfirmedTime     *time.Time     `json:"acknowledgment_confirmed_time,omitempty"`
	NegativeOrDeadLetter string         `json:"negative_ack_or_dead_letter_reason,omitempty"`
	IndeterminateLane    string         `json:"indeterminate_lane,omitempty"`
	ManualIntervention   *string        `json:"manual_intervention"`
	RetentionExpiry      time.Time      `json:"retention_expiry"`
	TraceID              string         `json:"trace_id,omitempty"`
	ContractVersion      string         `json:"contract_version"`
}

// TransitionAt is one step of the lifecycle with its time and fence.
type TransitionAt struct {
	To    gate.State `json:"to"`
	At    time.Time  `json:"at"`
	Fence int64      `json:"fence"`
}

// OperationList is one page of operations.
type OperationList struct {
	Operations []gate.Operation `json:"operations"`
	NextCursor string           `json:"next_cursor,omitempty"`
}

// RouteList lists every route's effective contract.
type RouteList struct {
	Routes []*gate.Route `json:"routes"`
}

// PoisonRecord is one message that could never be processed (it had no
// usable identity), kept once per route and fingerprint however often it
// came: GET /v1/poison.
type PoisonRecord struct {
	Route  string      `json:"route"`
	Broker gate.Broker `json:"broker"`
	// Fingerprint identifies the message (a hash, never its body).
	Fingerprint string `json:"fingerprint"`
	// MessageID is empty when there was none the ledger could hold.
	MessageID string    `json:"message_id,omitempty"`
	Reason    string    `json:"reason"`
	Count     int64     `json:"count"`
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	// Acked says the latest copy was acked once recorded (dead_letter:
	// gateway); otherwise it was refused, for the broker's own dead-letter
	// policy.
	Acked bool `json:"acked"`
}

// PoisonFilter selects poison records. Empty fields match all.
type PoisonFilter struct {
	Route string
	// Limit defaults to 50 and is capped at 500.
	Limit int
	// Cursor is the next_cursor of the previous page.
	Cursor string
}

// PoisonList is one page of poison records, the first seen most recently
// first.
type PoisonList struct {
	Poison     []PoisonRecord `json:"poison"`
	NextCursor string         `json:"next_cursor,omitempty"`
}
