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
// operation with its first delivery and attempt, and whatever happened off
// the common path, each list oldest first.
type Record struct {
	gate.Operation
	Deliveries []gate.Delivery `json:"deliveries"`
	Attempts   []gate.Attempt  `json:"attempts"`
	// Events is the operation's history, one entry per transition.
	Events []Event `json:"events"`
	// DeadLetters lists every time the gateway took the message out of
	// circulation (a replayed operation may be dead-lettered again).
	DeadLetters []gate.DeadLetter `json:"dead_letters"`
	// Interventions are operators' resolutions.
	Interventions []gate.Intervention `json:"manual_interventions"`
	// LeaseEvents are what happened to leases apart from the effect.
	LeaseEvents []LeaseEvent `json:"lease_events"`
}

// LeaseEvent is a lease that an owner found gone during its call ("lost"),
// or one taken from a reservation store that had lost the operation's
// fencing counter ("reset").
type LeaseEvent struct {
	Kind  string    `json:"kind"`
	Fence int64     `json:"fence"`
	At    time.Time `json:"at"`
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
	// ByKey and ByMessage are the operation ids Key and MessageID name on
	// the routes (an id is derived from its route and key; see
	// gate.Route.OperationID): the one a key names on each route, the one a
	// message id names on each route keyed on message ids. The admin API
	// fills them from its routes; the store finds those operations, their
	// conflict records, and, for MessageID, the deliveries of other routes.
	ByKey, ByMessage []string
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
	// ManualInterventions are operators' resolutions, oldest first; the
	// newest is summarised in Evidence.ManualIntervention.
	ManualInterventions []gate.Intervention `json:"manual_interventions"`
	LeaseEvents         []LeaseEvent        `json:"lease_events"`
	Contract            *gate.Route         `json:"contract,omitempty"`
	Links               map[string]string   `json:"links,omitempty"`
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

// ResolveRequest is the body of POST /v1/operations/{id}/resolve: what an
// operator found out about the effect, and why. Who says so is not the
// caller's to write: the resolution is recorded under the name of the
// admin credential the request carried ("api:NAME").
type ResolveRequest struct {
	Kind gate.ResolutionKind `json:"kind"`
	// ResultID is the effect's evidence; required for "happened" and
	// refused for the other kinds.
	ResultID string `json:"result_id,omitempty"`
	Reason   string `json:"reason"`
	// Note is optional free text kept with the reason (a ticket, on whose
	// behalf).
	Note string `json:"note,omitempty"`
	// Actor is accepted for older clients only when it names the
	// credential itself (NAME or api:NAME); any other value is refused.
	Actor string `json:"actor,omitempty"`
}

// ReplayRequest is the body of POST /v1/operations/{id}/replay; its fields
// are ResolveRequest's.
type ReplayRequest struct {
	Reason string `json:"reason"`
	Note   string `json:"note,omitempty"`
	Actor  string `json:"actor,omitempty"`
}

// OutboxActionRequest is the body of POST /v1/outbox/{id}/retry and
// /v1/outbox/{id}/cancel; its fields are ResolveRequest's, and the action
// is recorded the same way, under the credential's name.
type OutboxActionRequest struct {
	Reason string `json:"reason"`
	Note   string `json:"note,omitempty"`
	Actor  string `json:"actor,omitempty"`
}

// Who took a terminal operation out of circulation.
const (
	// DeadLetteredByGateway: the gateway recorded a dead letter and acked.
	DeadLetteredByGateway = "gateway"
	// DeadLetteredByBroker: the gateway keeps refusing it, and the broker's
	// own dead-letter policy (a dead-letter topic, the retention limit)
	// takes it.
	DeadLetteredByBroker = "broker"
)

// DeadLetterEntry is one terminal record in GET /v1/dead-letters: a
// terminal_failure operation or a conflict record.
type DeadLetterEntry struct {
	OperationID string     `json:"operation_id"`
	Route       string     `json:"route"`
	Key         string     `json:"key"`
	State       gate.State `json:"state"`
	// ConflictOf is set on a conflict record: the operation whose key it
	// reused.
	ConflictOf string `json:"conflict_of,omitempty"`
	// MessageID is the broker message id of its first delivery, which
	// names the message on the broker's dead-letter topic.
	MessageID      string `json:"message_id,omitempty"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	Reason         string `json:"reason"`
	// DeadLetteredBy is DeadLetteredByGateway or DeadLetteredByBroker.
	DeadLetteredBy string `json:"dead_lettered_by"`
	// Since is when it entered its terminal state; AgeSeconds is how long
	// ago that was when the list was read.
	Since        time.Time `json:"since"`
	AgeSeconds   int64     `json:"age_seconds"`
	AttemptCount int       `json:"attempt_count"`
	// Replayable says POST /v1/operations/{id}/replay may arm it: a
	// terminal_failure. A conflict record never is.
	Replayable bool      `json:"replayable"`
	CreatedAt  time.Time `json:"created_at"`
}

// DeadLetterFilter selects terminal records. Empty fields match all.
type DeadLetterFilter struct {
	Route string
	// Limit defaults to 50 and is capped at 500.
	Limit int
	// Cursor is the next_cursor of the previous page.
	Cursor string
}

// DeadLetterList is one page of terminal records, newest operation first.
type DeadLetterList struct {
	DeadLetters []DeadLetterEntry `json:"dead_letters"`
	NextCursor  string            `json:"next_cursor,omitempty"`
}

// ByKey is the ids of the operations key names, one per route (see
// ListFilter.ByKey): only route's when route is not "".
func ByKey(routes []*gate.Route, route, key string) []string {
	var ids []string
	for _, r := range routes {
		if route == "" || r.Name == route {
			ids = append(ids, r.OperationID(key))
		}
	}
	return ids
}

// ByMessage is the ids of the operations messageID names on the routes
// keyed on message ids (see ListFilter.ByMessage).
func ByMessage(routes []*gate.Route, route, messageID string) []string {
	var ids []string
	for _, r := range routes {
		if (route == "" || r.Name == route) && r.Key.Kind == gate.KeyMessageID {
			ids = append(ids, r.OperationID(messageID))
		}
	}
	return ids
}
