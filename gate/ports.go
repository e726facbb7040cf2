package gate

import (
	"context"
	"errors"
	"time"
)

// The interfaces below are what the gate needs from the outside world, declared
// here so that storage/ and downstream/ adapt to the gate and not the reverse.

// Ledger is the durable evidence store. Every method is one transaction.
type Ledger interface {
	// Claim records a delivery's arrival in one statement, and is the only
	// way a delivery learns what the ledger holds. c is the creating claim
	// (see change.go) a new operation would be written with.
	//
	// When no operation has c's id, Claim commits c, created is true and op
	// is nil: the delivery holds the new operation under c's fence, as c
	// describes it, and the ledger reads nothing of it back.
	//
	// Otherwise nothing of c is written, created is false and op is the
	// operation as found, never nil: whole, with its newest effect attempt,
	// as FindByID would return it right after. When its fingerprint is c's,
	// the delivery is recorded as a further one of it (op.DeliveryCount is
	// its number), answered at once with c.Claim.AckedAnswer if the
	// operation is acknowledged; when the fingerprints differ, nothing is
	// recorded on it (the delivery belongs to a conflict record).
	//
	// On an error op is nil and created false.
	Claim(ctx context.Context, c *Change) (op *Operation, created bool, err error)
	// FindByID returns the operation or conflict record with id (with its
	// newest effect attempt) and its latest manual intervention (nil when
	// none), or ErrNotFound: what an operator's resolution, the reconciler
	// and the relay decide on.
	FindByID(ctx context.Context, id string) (*Operation, *Intervention, error)
	// Write commits one named change (see change.go) to an existing
	// operation atomically, or nothing. It requires the row in c.Expect and
	// the fence: ErrFenced when a higher token is recorded (or, for a claim
	// or an intervention, an equal one), ErrStateChanged when the state
	// moved, ErrNotFound when there is no such operation.
	Write(ctx context.Context, c *Change) error
	// RecordConflict stores the conflicting record for (scope key, fingerprint)
	// once, appends the delivery, and returns the record.
	RecordConflict(ctx context.Context, c *Conflict) (*Operation, error)
	// AnswerDelivery records what delivery a.N of the operation was told,
	// once: a delivery already answered keeps its answer. It is not fenced:
	// it says what a delivery was told, even one whose fence was superseded.
	AnswerDelivery(ctx context.Context, operationID string, a *Answer) error
}

// Local runs a local route's statement inside the ledger transaction that
// records its evidence.
type Local interface {
	// Apply commits, in one transaction, start (the claim that records the
	// attempt: the creating claim of a new operation, or a later
	// delivery's taking claim), the statement of req.Route.Local, and the
	// change settle builds from the statement's result. A statement that
	// fails is rolled back on its own and handed to settle as the
	// attempt's outcome, so its failure is recorded and none of its effect.
	// If anything else fails, nothing commits, the statement included, and
	// the error says why (ErrFenced, ErrStateChanged as Ledger.Write;
	// ErrLocalConfig when the statement cannot run as the route is
	// configured, which is no outcome of the message's). A creating claim
	// that finds its operation is committed as Ledger.Claim commits it,
	// nothing else runs, and the error is a *Found with the operation.
	Apply(ctx context.Context, start *Change, req *EffectRequest, settle func(EffectResult) (*Change, error)) error
}

// Found is Local.Apply's answer when its creating claim found the
// operation: the delivery is recorded against it, and the gate goes on as
// after a Ledger.Claim that found it.
type Found struct{ Op *Operation }

func (f *Found) Error() string { return "operation " + f.Op.ID + " exists" }

// Reservations hands out short leases with fencing tokens.
type Reservations interface {
	// Acquire takes the lease for key when nobody holds it, in one atomic step,
	// and returns a fencing token strictly greater than every token issued
	// before and than floor (the highest token the ledger has seen), with
	// Reset set when the store's counter was below floor. ErrHeld when
	// another owner holds it.
	Acquire(ctx context.Context, key, owner string, ttl time.Duration, floor int64) (Lease, error)
	// Renew extends the lease only while owner still holds it; ErrLeaseLost otherwise.
	Renew(ctx context.Context, l Lease, ttl time.Duration) (Lease, error)
	// Take takes l (its key, owner and fence, for its TTL from now) when
	// nobody holds the key, raising the store's counter to at least l.Fence
	// so later tokens come out above it: the lease of a delivery that
	// created its operation, whose fence the ledger gave it. ErrHeld when
	// another owner holds it.
	Take(ctx context.Context, l Lease, ttl time.Duration) (Lease, error)
	// Release drops the lease only if owner still holds it.
	Release(ctx context.Context, l Lease) error
	// ReleaseAll releases every lease in ls as Release does, each only if
	// its owner still holds it, in as few round trips as the store allows:
	// the after-answer queue releases a batch of deliveries' leases at once.
	ReleaseAll(ctx context.Context, ls []Lease) error
}

// Effects performs the downstream call and the lookup.
type Effects interface {
	Execute(ctx context.Context, req *EffectRequest) EffectResult
	Lookup(ctx context.Context, req *EffectRequest) LookupResult
}

// Sentinel errors the adapters return; the gate sorts them with errors.Is.
var (
	ErrNotFound     = errors.New("not found")
	ErrExists       = errors.New("already exists")
	ErrFenced       = errors.New("fencing token superseded")
	ErrStateChanged = errors.New("operation state changed underneath")
	ErrHeld         = errors.New("reservation held by another owner")
	ErrLeaseLost    = errors.New("reservation lost")
	// ErrLocalConfig: a local route's statement failed for its route's
	// configuration (its role, grants or table), not for the message, so
	// the delivery is nacked with nothing recorded, until it is fixed.
	ErrLocalConfig = errors.New("local statement cannot run as configured")
)

// Lease is a held reservation.
type Lease struct {
	Key     string    `json:"key"`
	Owner   string    `json:"owner"`
	Fence   int64     `json:"fence"`
	Expires time.Time `json:"expires"`
	// Reset says the store had lost this key's fencing counter (it was below
	// the ledger's floor, as after a restart without persistence): whoever
	// held the lease before may not have been told, and may still be at work.
	Reset bool `json:"reset,omitempty"`
}

// Operation is the ledger's record of one unit of intent, and the core of the
// evidence record. It holds references and fingerprints, never message bodies.
type Operation struct {
	ID                 string           `json:"id"`
	ScopeKey           string           `json:"scope_key"`
	Tenant             string           `json:"tenant"`
	Route              string           `json:"route"`
	KeySource          KeyKind          `json:"key_source"`
	Key                string           `json:"key"`
	Fingerprint        string           `json:"fingerprint"`
	FingerprintVersion int              `json:"fingerprint_version"`
	ConflictOf         string           `json:"conflict_of,omitempty"`
	State              State            `json:"state"`
	Shape              Shape            `json:"shape"`
	DeadLetterPolicy   DeadLetterPolicy `json:"dead_letter_policy"`
	ContractVersion    string           `json:"contract_version"`
	IdempotencyKey     string           `json:"idempotency_key"`
	Fence              int64            `json:"fence"`
	Owner              string           `json:"owner"`
	LeaseStart         *time.Time       `json:"lease_start,omitempty"`
	LeaseDeadline      *time.Time       `json:"lease_deadline,omitempty"`
	LeaseExtensions    int              `json:"lease_extensions"`
	// LeaseLostAt is when the owner found its lease gone mid-call.
	LeaseLostAt   *time.Time `json:"lease_lost_at,omitempty"`
	DeliveryCount int        `json:"delivery_count"`
	// AttemptCount counts every recorded call, effects and lookups alike.
	AttemptCount int `json:"attempt_count"`
	// Grant is the attempt number up to which evidence from outside the push
	// path (an operator's resolution or replay, a lookup that found the
	// effect absent) allowed another attempt: while AttemptCount < Grant the
	// next delivery makes one, whatever the last attempt's outcome. Zero
	// when nothing was granted.
	Grant int `json:"grant,omitempty"`
	// NextCheckAt is when the reconciler asks the lookup again about an
	// indeterminate operation; Checks counts the lookups it made since the
	// operation last entered the lane.
	NextCheckAt *time.Time `json:"next_check_at,omitempty"`
	Checks      int        `json:"checks,omitempty"`
	// HandedOffAt is when a handoff route's operation committed with its
	// outbox entry: the point its broker was acked, before any effect.
	HandedOffAt *time.Time `json:"handed_off_at,omitempty"`
	// FirstAttemptAt anchors the provider's dedupe window.
	FirstAttemptAt *time.Time `json:"first_attempt_at,omitempty"`
	// LastAttempt is the newest effect attempt; Outcome "" means it was started
	// and no result was ever recorded (the owner died or lost its fence).
	LastAttempt *Attempt   `json:"last_attempt,omitempty"`
	ResultID    string     `json:"result_id,omitempty"`
	EvidenceAt  *time.Time `json:"evidence_at,omitempty"`
	AckedAt     *time.Time `json:"acked_at,omitempty"`
	// Reason is the latest negative-ack, terminal or indeterminate reason.
	Reason string `json:"reason,omitempty"`
	// Lane names who settles an indeterminate operation ("operator").
	Lane string `json:"lane,omitempty"`
	// TraceID is the first delivery's trace: the operation's, whichever
	// delivery wrote to it later (each delivery keeps its own).
	TraceID string `json:"trace_id,omitempty"`
	// SpanID is the first delivery's span, the target of later deliveries'
	// span links.
	SpanID      string    `json:"span_id,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
	RetainUntil time.Time `json:"retain_until"`
}

// LaneOperator is the lane of indeterminate work only a person can settle.
const LaneOperator = "operator"

// AttemptKind tells an effect call from a lookup.
type AttemptKind string

const (
	AttemptEffect AttemptKind = "effect"
	AttemptLookup AttemptKind = "lookup"
)

// Attempt is one downstream call the gate decided on and recorded before
// making it.
type Attempt struct {
	N              int         `json:"n"`
	Kind           AttemptKind `json:"kind"`
	IdempotencyKey string      `json:"idempotency_key"`
	Fence          int64       `json:"fence"`
	// ContractVersion is the route contract the attempt was made under,
	// which may be newer than the one the operation began with.
	ContractVersion string     `json:"contract_version"`
	StartedAt       time.Time  `json:"started_at"`
	FinishedAt      *time.Time `json:"finished_at,omitempty"`
	Outcome         Outcome    `json:"outcome,omitempty"`
	StatusCode      int        `json:"status_code,omitempty"`
	ResultID        string     `json:"result_id,omitempty"`
	Reason          string     `json:"reason,omitempty"`
}

// Outcome classifies a downstream answer.
type Outcome string

const (
	// OutcomeConfirmed: 2xx, the effect is evidenced (or the lookup found it).
	OutcomeConfirmed Outcome = "confirmed"
	// OutcomeRetryable: a documented failure that left no effect.
	OutcomeRetryable Outcome = "retryable"
	// OutcomeTerminal: a failure that will not change on retry.
	OutcomeTerminal Outcome = "terminal"
	// OutcomeUnknown: the request may have been applied and we cannot tell
	// (timeout, connection lost after sending, unlisted status).
	OutcomeUnknown Outcome = "unknown"
	// OutcomeAbsent: a lookup says the effect definitely does not exist.
	OutcomeAbsent Outcome = "absent"
)

// Delivery is one push request as the ledger keeps it. An operation's first
// delivery is part of its row; the further ones are kept beside it.
type Delivery struct {
	OperationID string `json:"operation_id"`
	// N numbers the operation's deliveries from 1, in the order the ledger
	// recorded them; answers find a delivery by it.
	N             int       `json:"n"`
	Broker        Broker    `json:"broker"`
	Source        string    `json:"source"`
	MessageID     string    `json:"message_id"`
	BrokerAttempt int       `json:"broker_attempt,omitempty"`
	ReceivedAt    time.Time `json:"received_at"`
	// PublishTime is when the broker says it accepted the message, kept
	// beside ReceivedAt (when this delivery reached the gateway); nil when
	// the broker sent none.
	PublishTime *time.Time `json:"publish_time,omitempty"`
	// Found is the state a further delivery found the operation in; empty
	// for the delivery that created it.
	Found State `json:"found,omitempty"`
	// Fence is the fencing token the delivery took the operation's lease
	// with; 0 when it took none.
	Fence int64 `json:"fence,omitempty"`
	// Decision is the gate's answer to this delivery (ack, nack, reject) and
	// Reason why; empty until it is known.
	Decision Decision `json:"decision"`
	Reason   string   `json:"reason,omitempty"`
	// Anomaly flags deliveries the broker should not have sent, such as a
	// redelivery after the ack went out.
	Anomaly string `json:"anomaly,omitempty"`
	// TraceID is this delivery's own trace; the operation keeps its first
	// delivery's.
	TraceID string `json:"trace_id,omitempty"`
}

// ResolutionKind is what an operator says about an operation's effect.
type ResolutionKind string

const (
	// ResolveHappened: the effect took place; ResultID is its evidence.
	ResolveHappened ResolutionKind = "happened"
	// ResolveNotHappened: the effect did not take place; the next delivery
	// may make exactly one new attempt under the same idempotency key.
	ResolveNotHappened ResolutionKind = "not_happened"
	// ResolveAbandon: nobody will find out; the operation ends terminally.
	ResolveAbandon ResolutionKind = "abandon"
	// ResolveReplay: a terminal operation whose effect is not confirmed gets
	// exactly one new attempt, under the same identity and key.
	ResolveReplay ResolutionKind = "replay"
	// ResolveCancel: a handed-off operation's outbox entry is taken out of
	// the relay's queue. The operation ends terminally and dead-lettered, in
	// the lane an operator works through, where a replay hands it back to
	// the relay; it is never called done.
	ResolveCancel ResolutionKind = "cancel"
	// OutboxRetryNow is not a resolution the gate applies: it records an
	// operator who made an outbox entry due at once. It changes no state, so
	// the ledger writes it beside the entry's new schedule, with no lease.
	OutboxRetryNow ResolutionKind = "retry_now"
)

// Resolution is an operator's request. Reason and Actor are required: a
// manual change to evidence without them would be an unexplained edit.
type Resolution struct {
	Kind     ResolutionKind `json:"kind"`
	ResultID string         `json:"result_id,omitempty"`
	Reason   string         `json:"reason"`
	Actor    string         `json:"actor"`
}

// Intervention is a resolution as the ledger keeps it: who, why, and what
// it changed, under which fence.
type Intervention struct {
	Resolution
	From  State     `json:"from"`
	To    State     `json:"to"`
	Fence int64     `json:"fence"`
	At    time.Time `json:"at"`
}

// OutboxEntry is what a handoff route keeps for its relay: the message as
// the effect needs it, without the route's private attributes, under a
// stable publication id (the operation's idempotency key). It is kept only
// until the effect is evidenced.
type OutboxEntry struct {
	OperationID   string    `json:"operation_id"`
	Route         string    `json:"route"`
	PublicationID string    `json:"publication_id"`
	Message       *Message  `json:"-"`
	CreatedAt     time.Time `json:"created_at"`
	// NextAttemptAt is when the relay may take the entry up again.
	NextAttemptAt time.Time `json:"next_attempt_at"`
	// Passes counts the relay passes that took the entry up.
	Passes int `json:"passes"`
	// Private are the JSON pointers into the message's data whose values
	// the outbox keeps sealed: the route's private values.
	Private []string `json:"-"`
	// Unopened says why the message, kept sealed, could not be opened (its
	// key is no longer configured, say): the relay must not call the
	// effect with what it has, and takes the entry up again later.
	Unopened error `json:"-"`
}

// Answer records what delivery N of an operation was told, once it is
// known.
type Answer struct {
	N        int      `json:"n"`
	Decision Decision `json:"decision"`
	Reason   string   `json:"reason,omitempty"`
	Anomaly  string   `json:"anomaly,omitempty"`
	// ResetFence is the fence of the delivery's lease when it came from a
	// reservation store that had lost the operation's fencing counter
	// (Lease.Reset), 0 otherwise: a fact kept with the operation's lease
	// history.
	ResetFence int64 `json:"reset_fence,omitempty"`
}

// DeadLetter records that the gateway took a message out of circulation.
type DeadLetter struct {
	OperationID string    `json:"operation_id"`
	Reason      string    `json:"reason"`
	At          time.Time `json:"at"`
}

// Step is one transition with its reason, as appended to the event log.
type Step struct {
	Transition
	Reason string `json:"reason,omitempty"`
}

// Conflict is a reused key with a different fingerprint.
type Conflict struct {
	// Original is the operation that owns the key; it is never modified.
	Original *Operation
	Record   *Operation
	Delivery *Delivery
	// DeadLetter is set under DeadLetterGateway.
	DeadLetter *DeadLetter
	At         time.Time
}

// EffectRequest is everything downstream/ needs for one call.
type EffectRequest struct {
	Route          *Route
	Message        *Message
	OperationID    string
	IdempotencyKey string
	Fence          int64
}

// EffectResult is the classified answer of one effect call.
type EffectResult struct {
	Outcome    Outcome
	StatusCode int
	ResultID   string
	// Reason is short and bounded; never a response body.
	Reason string
}

// LookupResult answers "does the effect for this key exist?".
type LookupResult struct {
	// Outcome is OutcomeConfirmed (found), OutcomeAbsent, or OutcomeUnknown
	// (the lookup itself failed).
	Outcome    Outcome
	StatusCode int
	ResultID   string
	Reason     string
}
