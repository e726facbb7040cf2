package brokerauth

import (
	"errors"
	"fmt"
)

// Kind sorts authentication failures by what the caller may answer.
type Kind int

const (
	// Unauthenticated: the credential is missing or does not verify.
	Unauthenticated Kind = iota + 1
	// Forbidden: the credential verifies but is not accepted here, or the
	// message points at a URL outside the allow-list.
	Forbidden
	// Malformed: not a message of the broker's format.
	Malformed
	// Unavailable: cannot be checked right now (a certificate or key set
	// cannot be fetched); the sender should try again later.
	Unavailable
)

func (k Kind) String() string {
	switch k {
	case Unauthenticated:
		return "unauthenticated"
	case Forbidden:
		return "forbidden"
	case Malformed:
		return "malformed"
	case Unavailable:
		return "unavailable"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Error is every failure this package returns. Reason is bounded and safe to
// send back to the broker: it never holds a credential or message content.
type Error struct {
	Kind   Kind
	Reason string
	// Err is the underlying cause, for logs only.
	Err error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Kind.String() + ": " + e.Reason + ": " + e.Err.Error()
	}
	return e.Kind.String() + ": " + e.Reason
}

func (e *Error) Unwrap() error { return e.Err }

// KindOf returns the Kind of err, or 0 when err is not an *Error.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return 0
}

func fail(k Kind, cause error, format string, args ...any) *Error {
	return &Error{Kind: k, Reason: fmt.Sprintf(format, args...), Err: cause}
}
