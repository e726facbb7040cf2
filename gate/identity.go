package gate

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Message is a broker delivery after its envelope has been decoded: the same
// shape whichever broker or body form it came in, so identity and fingerprint do
// not depend on the transport.
type Message struct {
	Broker Broker `json:"broker"`
	// Source is the Pub/Sub subscription or the SNS topic ARN.
	Source      string            `json:"source"`
	MessageID   string            `json:"message_id"`
	Data        []byte            `json:"-"`
	Attributes  map[string]string `json:"-"`
	PublishTime time.Time         `json:"publish_time"`
	OrderingKey string            `json:"ordering_key,omitempty"`
	// BrokerAttempt is Pub/Sub's deliveryAttempt, when the subscription has a
	// dead-letter policy; 0 when absent.
	BrokerAttempt int `json:"broker_attempt,omitempty"`
	// Envelope is the request body as received, for BodyEnvelope routes.
	Envelope []byte `json:"-"`
	// TraceParent and TraceState are the W3C trace context the publisher
	// attached to the message (Pub/Sub's googclient_traceparent and
	// googclient_tracestate attributes, SNS's traceparent message attribute),
	// so the gateway's spans can continue the publisher's trace.
	TraceParent string `json:"-"`
	TraceState  string `json:"-"`
}

// Identity is what binds repeated deliveries to one intent.
type Identity struct {
	// Key is the value taken from the route's key source.
	Key string
	// ScopeKey is tenant + route + key source + key: the ledger's unique key.
	ScopeKey string
	// OperationID is derived from ScopeKey, so every gateway replica names the
	// same operation the same way without coordination.
	OperationID string
	Fingerprint string
	// IdempotencyKey is bound to the fingerprint: a conflicting payload can
	// never reuse the original's key at the provider.
	IdempotencyKey string
}

// IdentityError says why a message has no usable identity. It is a bounded,
// client-facing reason.
type IdentityError struct{ Reason string }

func (e *IdentityError) Error() string { return "no usable identity: " + e.Reason }

// idEncoding is the standard base32 alphabet in lower case, without
// padding: ids are spelled in lower case, and encoding them so directly
// saves lower-casing a copy.
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// digest is prefix and the first 26 base32 digits (130 bits) of the SHA-256
// of parts, each preceded by its length as 8 big-endian bytes. It hashes
// one buffer, on the stack for the short parts of an id, rather than
// streaming each part into a hash.Hash, which cost an allocation for the
// hash, one per part converted to bytes and two for the sum and its
// encoding.
func digest(prefix string, parts ...string) string {
	n := 0
	for _, p := range parts {
		n += 8 + len(p)
	}
	var stack [512]byte
	buf := stack[:0]
	if n > len(stack) {
		buf = make([]byte, 0, n)
	}
	for _, p := range parts {
		buf = appendPart(buf, p)
	}
	var pre [32]byte
	return idOf(append(pre[:0], prefix...), buf)
}

// appendPart appends p to a digest's input as digest does: its length,
// then its bytes.
func appendPart[T string | []byte](buf []byte, p T) []byte {
	buf = binary.BigEndian.AppendUint64(buf, uint64(len(p)))
	return append(buf, p...)
}

// idOf is prefix followed by the first 26 base32 digits of the SHA-256 of
// in: the id digest makes of the parts in holds.
func idOf(prefix, in []byte) string {
	sum := sha256.Sum256(in)
	// 20 bytes are four whole base32 blocks, 32 digits: the 26 kept are
	// those of the whole sum's encoding.
	var enc [32]byte
	idEncoding.Encode(enc[:], sum[:20])
	return string(append(prefix, enc[:26]...))
}

// Identify derives the operation identity and semantic fingerprint of m under
// route r.
func Identify(r *Route, m *Message) (Identity, error) {
	key, err := operationKey(r, m)
	if err != nil {
		return Identity{}, err
	}
	// The key is checked as the message carries it, before any hash: a
	// private key with a NUL byte is as unusable as any other, and its hash
	// would hide that.
	for _, f := range []struct{ name, value string }{{"operation key", key}, {"message id", m.MessageID}, {"source", m.Source}} {
		if err := storableText(f.name, f.value); err != nil {
			return Identity{}, err
		}
	}
	if r.Key.Hashed {
		if r.HashKey == nil {
			// A wiring fault, not the message's: it must not be refused as one.
			return Identity{}, fmt.Errorf("route %s keys on private field %q but has no key hash", r.Name, r.Key.Name)
		}
		key = r.HashKey(key)
	}
	fp, err := Fingerprint(&r.Fingerprint, m)
	if err != nil {
		return Identity{}, err
	}
	scope := r.scope(key)
	return Identity{
		Key:            key,
		ScopeKey:       scope,
		OperationID:    digest("op_", scope),
		Fingerprint:    fp,
		IdempotencyKey: digest("ik_", scope, fp),
	}, nil
}

// scope is the scope key of key on r. Each part is escaped so that no "/"
// inside a pointer or key can make two different (source, key) pairs spell
// the same scope.
func (r *Route) scope(key string) string {
	return strings.Join([]string{r.Tenant, r.Name, string(r.Key.Kind) + ":" + url.PathEscape(r.Key.Name), url.PathEscape(key)}, "/")
}

// OperationID is the id of the operation key names on r, as Identify
// derives it: what lets an operator's "which operation has key K?" be a
// lookup by id. A key drawn from a private field is the keyed hash the
// ledger holds: given in the clear, it is hashed first.
func (r *Route) OperationID(key string) string {
	if r.Key.Hashed && r.HashKey != nil && !strings.HasPrefix(key, HashedKeyPrefix) {
		key = r.HashKey(key)
	}
	return digest("op_", r.scope(key))
}

// HashedKeyPrefix starts every key kept as a keyed hash.
const HashedKeyPrefix = "hmac-sha256:"

// NewKeyHash returns the keyed hash of keys drawn from private fields:
// HMAC-SHA256 under secret, hex-encoded after HashedKeyPrefix. It is
// deterministic, so redeliveries still find their operation, and without the
// secret a stored key cannot be checked against guesses (an email address, a
// payment id), as a plain hash could. Changing the secret changes every such
// key: a message redelivered after the change looks new.
func NewKeyHash(secret []byte) func(key string) string {
	secret = slices.Clone(secret)
	return func(key string) string {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(key))
		return HashedKeyPrefix + hex.EncodeToString(m.Sum(nil))
	}
}

// storableText refuses a value the ledger keeps as text that Postgres cannot
// store: a NUL byte or invalid UTF-8 (a JSON string can carry \u0000). Such
// a message is a bad message, rejected before anything is recorded; left to
// the ledger, every write would fail and every redelivery would be answered
// as if the ledger were down.
func storableText(name, v string) error {
	if why := Unstorable(v); why != "" {
		return &IdentityError{Reason: name + " " + why}
	}
	return nil
}

// Unstorable says why Postgres text cannot hold v ("contains a NUL byte", "is
// not valid UTF-8"), or "" when it can. Anything from outside that becomes a
// text column or a text query parameter is checked with it first, so that
// input alone is a client error and never a failed statement.
func Unstorable(v string) string {
	switch {
	case strings.IndexByte(v, 0) >= 0:
		return "contains a NUL byte"
	case !utf8.ValidString(v):
		return "is not valid UTF-8"
	}
	return ""
}

// ConflictID names the conflicting record for a scope and fingerprint, so a
// redelivered conflicting message finds its record instead of adding another.
func ConflictID(scopeKey, fingerprint string) string {
	return digest("cf_", scopeKey, fingerprint)
}

const maxKeyLen = 512

func operationKey(r *Route, m *Message) (string, error) {
	var key string
	switch r.Key.Kind {
	case KeyMessageID, "":
		key = m.MessageID
		if m.Broker == BrokerSNS && key != "" {
			// SNS names a message by its topic and id together; a route fed
			// by several topics must not merge two topics' messages.
			if m.Source == "" {
				return "", &IdentityError{Reason: "SNS message without a TopicArn"}
			}
			key = m.Source + "/" + key
		}
	case KeyAttribute:
		key = m.Attributes[r.Key.Name]
	case KeyJSONPointer:
		v, err := pointerValue(m.Data, r.Key.Name)
		if err != nil {
			return "", &IdentityError{Reason: "operation key: " + err.Error()}
		}
		key = v
	default:
		return "", &IdentityError{Reason: fmt.Sprintf("unknown key source %q", r.Key.Kind)}
	}
	if key == "" {
		return "", &IdentityError{Reason: fmt.Sprintf("operation key (%s %s) is empty", r.Key.Kind, r.Key.Name)}
	}
	if len(key) > maxKeyLen {
		return "", &IdentityError{Reason: fmt.Sprintf("operation key longer than %d bytes", maxKeyLen)}
	}
	return key, nil
}

// Fingerprint hashes the fields that define equal intent. The encoding is
// canonical: parts are length-prefixed and attributes sorted, and JSON pointer
// values are re-encoded so that whitespace and key order do not matter.
func Fingerprint(spec *FingerprintSpec, m *Message) (string, error) {
	// The parts digest would take, appended straight into its input: the
	// data is hashed where it lies instead of copied into a string first.
	var stack [512]byte
	version := strconv.Itoa(spec.Version)
	buf := appendPart(appendPart(stack[:0], "fp"), version)
	if spec.Data {
		buf = appendPart(appendPart(buf, "data"), m.Data)
	}
	attrs := spec.Attributes
	if !slices.IsSorted(attrs) {
		attrs = slices.Sorted(slices.Values(attrs))
	}
	for _, a := range attrs {
		v, ok := m.Attributes[a]
		buf = appendPart(appendPart(appendPart(appendPart(buf, "attr"), a), strconv.FormatBool(ok)), v)
	}
	for _, p := range spec.Pointers {
		v, err := pointerValue(m.Data, p)
		if err != nil {
			return "", &IdentityError{Reason: "fingerprint: " + err.Error()}
		}
		buf = appendPart(appendPart(appendPart(buf, "ptr"), p), v)
	}
	var pre [32]byte
	return idOf(append(append(append(pre[:0], 'v'), version...), ':'), buf), nil
}

// Poison is what the gateway keeps of a message that can never be processed
// because it has no usable identity: no key, an identity field the ledger
// cannot store, or a body that is not the broker's message at all. It is not
// an operation (there is nothing to bind redeliveries to) and it is
// minimized: never the body, only a fingerprint of it, the message id only
// when the ledger can hold it, and a bounded reason.
type Poison struct {
	Route  string
	Broker Broker
	// Fingerprint tells one poison message from another on a route; a
	// redelivery of the same message has the same one.
	Fingerprint string
	MessageID   string
	Reason      string
	At          time.Time
	// Acked says the broker is told ack once the record is kept: the route
	// dead-letters in the gateway.
	Acked bool
}

// maxPoisonMessageID is the longest message id a poison record keeps; a
// longer one is not a broker's and is left out.
const maxPoisonMessageID = 256

// NewPoison minimizes a poison message of route r. m is the decoded message,
// or nil when the body could not be decoded; messageID is the id as far as
// it could be read. The fingerprint covers what a redelivery repeats: the
// decoded message's source, id, data and attributes, or else the raw body.
func NewPoison(r *Route, m *Message, body []byte, messageID, reason string, at time.Time) *Poison {
	var fp string
	if m != nil {
		parts := []string{"message", string(m.Broker), m.Source, m.MessageID, string(m.Data)}
		keys := make([]string, 0, len(m.Attributes))
		for k := range m.Attributes {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			parts = append(parts, k, m.Attributes[k])
		}
		fp = digest("px_", parts...)
		if messageID == "" {
			messageID = m.MessageID
		}
	} else {
		fp = digest("px_", "body", string(body))
	}
	if Unstorable(messageID) != "" || len(messageID) > maxPoisonMessageID {
		messageID = ""
	}
	return &Poison{
		Route: r.Name, Broker: r.Broker, Fingerprint: fp, MessageID: messageID,
		Reason: bound(StorableText(reason)), At: at, Acked: r.DeadLetter == DeadLetterGateway,
	}
}

// StorableText is s with every NUL byte and invalid UTF-8 sequence replaced
// by U+FFFD, for free text (a reason) that may quote what a request carried.
func StorableText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
