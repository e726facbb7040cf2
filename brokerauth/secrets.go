package brokerauth

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"log/slog"
	"strings"
)

// Secret is a shared credential (a verification token, a basic-auth user or
// password). Only its SHA-256 is kept, and comparisons run in constant time
// over the digests, so neither the value nor its length leaks through timing.
// It never prints.
type Secret struct {
	sum [sha256.Size]byte
	set bool
}

// NewSecret wraps a value; an empty value is an unset secret that matches
// nothing.
func NewSecret(value string) Secret {
	if value == "" {
		return Secret{}
	}
	return Secret{sum: sha256.Sum256([]byte(value)), set: true}
}

// IsSet reports whether the secret has a value.
func (s Secret) IsSet() bool { return s.set }

// Matches compares candidate with the secret in constant time.
func (s Secret) Matches(candidate string) bool {
	c := sha256.Sum256([]byte(candidate))
	eq := subtle.ConstantTimeCompare(s.sum[:], c[:]) == 1
	return eq && s.set
}

func (Secret) String() string               { return "[redacted]" }
func (Secret) GoString() string             { return "brokerauth.Secret([redacted])" }
func (Secret) LogValue() slog.Value         { return slog.StringValue("[redacted]") }
func (Secret) MarshalJSON() ([]byte, error) { return []byte(`"[redacted]"`), nil }

// Credentials are a route's shared secrets, resolved from the environment at
// start. Routes name the variables; the values live only here.
type Credentials struct {
	// VerificationToken is Pub/Sub's legacy ?token= value.
	VerificationToken Secret
	// BasicUser and BasicPassword are HTTP basic credentials (SNS endpoints
	// can carry user:password in the subscribed URL).
	BasicUser     Secret
	BasicPassword Secret
}

// CheckVerificationToken compares a push request's token query parameter with
// the route's. Missing or wrong is Unauthenticated.
func CheckVerificationToken(want Secret, got string) error {
	if got == "" {
		return fail(Unauthenticated, nil, "verification token is missing")
	}
	if !want.Matches(got) {
		return fail(Unauthenticated, nil, "verification token does not match")
	}
	return nil
}

// CheckBasic checks an Authorization header carrying HTTP basic credentials.
// User and password are both compared whatever the first comparison says.
func CheckBasic(user, password Secret, authorization string) error {
	scheme, value, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return fail(Unauthenticated, nil, "basic credentials are missing")
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(value))
	if err != nil {
		return fail(Unauthenticated, nil, "basic credentials are not base64")
	}
	u, p, ok := strings.Cut(string(raw), ":")
	userOK := user.Matches(u)
	passOK := password.Matches(p)
	if !ok || !userOK || !passOK {
		return fail(Unauthenticated, nil, "basic credentials do not match")
	}
	return nil
}
