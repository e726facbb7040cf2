package gate

import "time"

// Broker names the push protocol a route receives.
type Broker string

const (
	BrokerPubSub Broker = "pubsub"
	BrokerSNS    Broker = "sns"
)

// Auth names the authenticator a route's deliveries must pass.
type Auth string

const (
	// AuthNone accepts unauthenticated deliveries (development only).
	AuthNone Auth = "none"
	// AuthOIDC verifies Pub/Sub push tokens (Authorization: Bearer).
	AuthOIDC Auth = "oidc"
	// AuthSNSSignature verifies SNS message signatures.
	AuthSNSSignature Auth = "sns_signature"
	// AuthBasic checks HTTP basic credentials (SNS endpoints may carry
	// user:password); SNS messages that are signed are verified too.
	AuthBasic Auth = "basic"
)

// PubSubMode is how a Pub/Sub push subscription writes its body.
type PubSubMode string

const (
	// PubSubWrapped is the JSON push envelope (Pub/Sub's default).
	PubSubWrapped PubSubMode = "wrapped"
	// PubSubUnwrapped is the raw message data as the body, with metadata in
	// x-goog-pubsub-* headers and each attribute as a header (payload
	// unwrapping with write metadata).
	PubSubUnwrapped PubSubMode = "unwrapped"
)

// OIDCAuth is what a Pub/Sub push token must carry.
type OIDCAuth struct {
	Audience       string `json:"audience"`
	ServiceAccount string `json:"service_account"`
	// JWKSURL overrides the process's key set URL for this route.
	JWKSURL string `json:"jwks_url,omitempty"`
}

// BasicAuthEnv names the environment variables that hold HTTP basic
// credentials; the values never appear in the route.
type BasicAuthEnv struct {
	UsernameEnv string `json:"username_env"`
	PasswordEnv string `json:"password_env"`
}

// Shape says what the downstream effect tolerates, which decides what the gate
// may do after a lost response.
type Shape string

const (
	// ShapeIdempotent: the provider deduplicates by Idempotency-Key for DedupeWindow.
	ShapeIdempotent Shape = "idempotent"
	// ShapeLookup: the provider can be asked, by key, whether the effect exists.
	ShapeLookup Shape = "lookup"
	// ShapeUnsafe: neither; a lost response is indeterminate at once.
	ShapeUnsafe Shape = "unsafe"
	// ShapeRepeatable: repeating the effect is harmless (reads, rebuilds).
	ShapeRepeatable Shape = "repeatable"
	// ShapeHandoff: the commit of the operation with an outbox entry is what
	// the broker's ack waits for; the gateway's relay performs the effect
	// afterwards, under the rules of RelayShape.
	ShapeHandoff Shape = "handoff"
	// ShapeLocal: the effect is a SQL statement (Route.Local) run inside the
	// transaction that records its evidence, so the two commit or roll back
	// together and a lost response cannot exist.
	ShapeLocal Shape = "local"
)

// DeadLetterPolicy says who takes a message the gateway will never process.
type DeadLetterPolicy string

const (
	// DeadLetterGateway: record a dead letter in the ledger, then ack so the
	// broker stops redelivering.
	DeadLetterGateway DeadLetterPolicy = "gateway"
	// DeadLetterBroker: keep nacking so the subscription's own dead-letter
	// policy (or SNS's redrive) takes the message.
	DeadLetterBroker DeadLetterPolicy = "broker"
)

// KeyKind is where the operation key comes from.
type KeyKind string

const (
	KeyMessageID   KeyKind = "message_id"
	KeyAttribute   KeyKind = "attribute"
	KeyJSONPointer KeyKind = "json_pointer"
)

// KeySource selects the stable identifier of the intent inside a message.
type KeySource struct {
	Kind KeyKind `json:"kind"`
	// Name is the attribute name for KeyAttribute, the pointer for KeyJSONPointer.
	Name string `json:"name,omitempty"`
	// Hashed says Name is a field the route lists as private: the key is
	// kept only as its keyed hash (Route.HashKey), never in clear.
	Hashed bool `json:"hashed,omitempty"`
}

// FingerprintSpec names the fields that define "the same intent". Version is
// part of the hash so that changing the spec never makes old and new
// fingerprints compare equal by accident.
type FingerprintSpec struct {
	Version    int      `json:"version"`
	Data       bool     `json:"data"`
	Attributes []string `json:"attributes,omitempty"`
	Pointers   []string `json:"pointers,omitempty"`
}

// BodyMode is what the effect request carries.
type BodyMode string

const (
	BodyRaw        BodyMode = "raw"
	BodyEnvelope   BodyMode = "envelope"
	BodyCloudEvent BodyMode = "cloudevent"
)

// EvidenceKind is what a 2xx answer must carry to count as proof of the
// effect.
type EvidenceKind string

const (
	// EvidenceResultID: the provider's result id, read from ResultIDHeader or
	// ResultIDPointer; a 2xx without it is not evidence.
	EvidenceResultID EvidenceKind = "result_id"
	// EvidenceStatusOnly: the status code alone. A route has to say so
	// explicitly, and the completion statement says so too.
	EvidenceStatusOnly EvidenceKind = "status_only"
)

// EffectSpec is the downstream call that performs the route's effect, and how
// its answers are read.
type EffectSpec struct {
	Method   string            `json:"method"`
	URL      string            `json:"url"`
	BodyMode BodyMode          `json:"body_mode"`
	Headers  map[string]string `json:"headers,omitempty"`
	// Timeout caps one call; the remaining lease caps it further.
	Timeout time.Duration `json:"timeout"`
	// Evidence says whether a 2xx proves the effect with a result id or by
	// its status alone; ResultIDHeader / ResultIDPointer locate the result id.
	Evidence        EvidenceKind `json:"evidence"`
	ResultIDHeader  string       `json:"result_id_header,omitempty"`
	ResultIDPointer string       `json:"result_id_pointer,omitempty"`
	// TerminalStatuses will never succeed on retry; RetryableStatuses are
	// documented failures with no effect. Any other non-2xx status is unknown.
	TerminalStatuses  []int `json:"terminal_statuses"`
	RetryableStatuses []int `json:"retryable_statuses"`
	// LookupURL is used by ShapeLookup; "{key}" is replaced by the idempotency key.
	LookupURL string `json:"lookup_url,omitempty"`
}

// Renewal bounds lease extension while a downstream call runs.
type Renewal struct {
	Interval     time.Duration `json:"interval"`
	MaxExtension time.Duration `json:"max_extension"`
}

// Route is one acknowledgment contract: everything the gate needs to decide
// what an incoming message means and when it may be acked.
type Route struct {
	Name   string `json:"name"`
	Tenant string `json:"tenant"`
	Broker Broker `json:"broker"`
	// Auth is the broker authenticator (AuthNone, AuthOIDC, AuthSNSSignature
	// or AuthBasic); "none" must be written out explicitly.
	Auth Auth `json:"auth"`
	// OIDC is what a Pub/Sub push token must say, for AuthOIDC.
	OIDC *OIDCAuth `json:"oidc,omitempty"`
	// VerificationTokenEnv names the environment variable that holds the
	// route's legacy Pub/Sub verification token (the ?token= query
	// parameter). Only the name is part of the contract, never the value.
	VerificationTokenEnv string `json:"verification_token_env,omitempty"`
	// BasicAuth names the environment variables that hold the HTTP basic
	// credentials of an AuthBasic route.
	BasicAuth *BasicAuthEnv `json:"basic_auth,omitempty"`
	// PubSubMode is the push body form of a Pub/Sub route.
	PubSubMode PubSubMode `json:"pubsub_mode,omitempty"`
	// RawDelivery accepts SNS raw message delivery, which carries no
	// signature; only with AuthBasic.
	RawDelivery bool `json:"raw_delivery,omitempty"`
	// Subscriptions (Pub/Sub) or topic ARNs (SNS) allowed to feed the route;
	// empty allows any. SNS subscriptions are confirmed only for topics
	// listed here.
	Sources []string `json:"sources,omitempty"`

	Key         KeySource       `json:"operation_key"`
	Fingerprint FingerprintSpec `json:"fingerprint"`
	// Effect is the downstream call; absent on a ShapeLocal route, whose
	// effect is Local.
	Effect EffectSpec `json:"effect,omitzero"`
	Shape  Shape      `json:"shape"`
	// CommitBoundary says what must be durable before the broker is acked:
	// the downstream's evidence, an outbox entry, or a local transaction.
	CommitBoundary string `json:"commit_boundary"`
	// DedupeWindow is how long the provider honours an idempotency key
	// (ShapeIdempotent): a retry after a lost response is safe only inside it.
	DedupeWindow time.Duration `json:"dedupe_window,omitempty"`

	// Local is the statement of a ShapeLocal route.
	Local *LocalSpec `json:"local,omitempty"`
	// Handoff paces the relay of a ShapeHandoff route.
	Handoff *HandoffSpec `json:"handoff,omitempty"`
	// Reconcile is how the background reconciler works this route's
	// indeterminate lane; only lookup routes have one.
	Reconcile ReconcilePolicy `json:"reconcile,omitzero"`

	MaxAttempts int              `json:"max_attempts"`
	DeadLetter  DeadLetterPolicy `json:"dead_letter"`
	// AckDeadline is the broker's deadline for this route's deliveries; the
	// reservation lease is derived from it.
	AckDeadline time.Duration `json:"ack_deadline"`
	Renewal     Renewal       `json:"renewal"`
	// Retention is how long evidence is kept; it must outlast the broker's
	// redelivery horizon or a late redelivery would look new.
	Retention time.Duration `json:"retention"`
	// Private attributes are neither stored, fingerprinted into logs, nor logged.
	Private []string `json:"private,omitempty"`
	// HashKey turns a key drawn from a private field (Key.Hashed) into what
	// the ledger keeps; NewKeyHash builds it from a secret the process holds,
	// which is never part of the contract.
	HashKey func(key string) string `json:"-"`

	// ContractVersion identifies this exact contract (a hash of the route as
	// loaded), so evidence says which rules it was produced under.
	ContractVersion string `json:"contract_version"`
}

// ReconcilePolicy paces the lookups that settle a lookup route's
// indeterminate operations: the first check waits Interval after the
// previous one, each unavailable answer doubles the wait up to MaxInterval,
// and the route's lookups are spread to at most RatePerSecond, so a lane of
// thousands does not become a burst at a provider that is already failing.
type ReconcilePolicy struct {
	Interval      time.Duration `json:"interval"`
	MaxInterval   time.Duration `json:"max_interval"`
	RatePerSecond float64       `json:"rate_per_second"`
}

// LocalSpec is a local route's effect: one statement, run in the ledger's
// database inside the transaction that records it. Its parameters are
// bound, in order, never spliced into the text; its one returned value is
// the effect's evidence (the result id).
type LocalSpec struct {
	SQL    string       `json:"sql"`
	Params []LocalParam `json:"params"`
	// Role, when set, is taken with SET LOCAL ROLE for the statement only,
	// so it runs with the privileges an operator granted that role and not
	// the gateway's.
	Role    string        `json:"role,omitempty"`
	Timeout time.Duration `json:"timeout"`
}

// LocalParamKind names what a statement parameter is bound to.
type LocalParamKind string

const (
	// ParamDataJSON: the message data as jsonb (it must be JSON).
	ParamDataJSON LocalParamKind = "data_json"
	// ParamDataBytes: the message data as bytea.
	ParamDataBytes LocalParamKind = "data_bytes"
	// ParamIdempotencyKey, ParamOperationID and ParamMessageID: text.
	ParamIdempotencyKey LocalParamKind = "idempotency_key"
	ParamOperationID    LocalParamKind = "operation_id"
	ParamMessageID      LocalParamKind = "message_id"
	// ParamAttribute: the named attribute as text. An absent attribute is
	// a malformed message unless the parameter is Optional (then NULL).
	ParamAttribute LocalParamKind = "attribute"
)

// LocalParam is one bound parameter; Name is the attribute's, for
// ParamAttribute only. Optional binds NULL for an absent attribute instead
// of refusing the message.
type LocalParam struct {
	Kind     LocalParamKind `json:"kind"`
	Name     string         `json:"name,omitempty"`
	Optional bool           `json:"optional,omitempty"`
}

// HandoffSpec paces a handoff route's relay: a documented failure or a
// busy downstream is tried again after a wait that doubles from RetryMin
// up to RetryMax, with jitter, so an outage is absorbed by the outbox and
// not hammered.
type HandoffSpec struct {
	RetryMin time.Duration `json:"retry_min"`
	RetryMax time.Duration `json:"retry_max"`
}

// RelayShape is how the relay treats a handoff route's downstream after a
// lost response: asked by lookup when it can be, retried under the same key
// inside the provider's dedupe window when it deduplicates, and otherwise
// parked in the indeterminate lane, never blindly resent.
func (r *Route) RelayShape() Shape {
	switch {
	case r.Effect.LookupURL != "":
		return ShapeLookup
	case r.DedupeWindow > 0:
		return ShapeIdempotent
	}
	return ShapeUnsafe
}
