package downstream

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"

	"github.com/ackgate/ackgate/gate"
)

const (
	// maxBodyBytes bounds what is read to find a result id: evidence is a small
	// document, and a provider must not be able to make the gate buffer more.
	maxBodyBytes = 1 << 20
	// maxDrainBytes is how much of an unread body is discarded so the
	// connection can be reused; beyond it, closing the connection is cheaper.
	maxDrainBytes = 64 << 10
	// maxResultIDLen bounds a result id the ledger is asked to keep as evidence.
	maxResultIDLen = 1024
	// maxReasonLen keeps reasons fit for a ledger column and a log line.
	maxReasonLen = 200
)

// classifyStatus sorts a non-2xx answer by the route's lists. A status the
// route does not list says nothing about whether the effect happened, so it is
// unknown rather than retryable.
func classifyStatus(spec *gate.EffectSpec, code int) (gate.Outcome, string) {
	switch {
	case slices.Contains(spec.TerminalStatuses, code):
		return gate.OutcomeTerminal, fmt.Sprintf("status %d is terminal for this route", code)
	case slices.Contains(spec.RetryableStatuses, code):
		return gate.OutcomeRetryable, fmt.Sprintf("status %d is retryable for this route", code)
	default:
		return gate.OutcomeUnknown, fmt.Sprintf("status %d is not listed for this route; the effect may have been applied", code)
	}
}

func is2xx(code int) bool { return code >= 200 && code <= 299 }

// resultID extracts the provider's result id from a 2xx. ok is false when the
// route requires an id and the answer does not carry a usable one; reason then
// says which. A route that configures neither header nor pointer accepts the
// status alone.
func resultID(spec *gate.EffectSpec, resp *http.Response) (id string, ok bool, reason string) {
	if spec.ResultIDHeader == "" && spec.ResultIDPointer == "" {
		return "", true, ""
	}
	if spec.ResultIDHeader != "" {
		if v := strings.TrimSpace(resp.Header.Get(spec.ResultIDHeader)); v != "" {
			return checkID(v, "header ", spec.ResultIDHeader)
		}
		if spec.ResultIDPointer == "" {
			return "", false, "no result id in header " + spec.ResultIDHeader
		}
	}
	v, err := pointerID(resp.Body, spec.ResultIDPointer)
	if err != nil {
		return "", false, "no result id at " + spec.ResultIDPointer + ": " + err.Error()
	}
	return checkID(v, "pointer ", spec.ResultIDPointer)
}

// checkID accepts v as a result id unless it is too long. The reason names
// where it came from, kind and name; they are put together only for that
// reason, not for every id accepted.
func checkID(v, kind, name string) (string, bool, string) {
	if len(v) > maxResultIDLen {
		return "", false, fmt.Sprintf("result id in %s%s is longer than %d bytes", kind, name, maxResultIDLen)
	}
	return v, true, ""
}

// pointerID reads at most maxBodyBytes of a JSON body and resolves the
// pointer. Errors describe the shape of the failure, never the body's content.
func pointerID(body io.Reader, pointer string) (string, error) {
	b, err := io.ReadAll(io.LimitReader(body, maxBodyBytes+1))
	if err != nil {
		return "", fmt.Errorf("body unreadable (%s)", describe(err))
	}
	if len(b) > maxBodyBytes {
		return "", fmt.Errorf("body larger than %d bytes", maxBodyBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // a numeric id must keep every digit
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return "", errors.New("body is not JSON")
	}
	v, err := gate.ResolvePointer(doc, pointer)
	if err != nil {
		// ResolvePointer names pointer tokens from our configuration only.
		return "", errors.New("pointer does not resolve")
	}
	switch v := v.(type) {
	case string:
		if strings.TrimSpace(v) == "" {
			return "", errors.New("value is empty")
		}
		return v, nil
	case json.Number:
		return v.String(), nil
	default:
		return "", errors.New("value is not a string or number")
	}
}

// describe names a transport error in a few words. The error's own text is
// not used: a *url.Error carries the full URL, whose query may hold a secret.
func describe(err error) string {
	var (
		dnsErr  *net.DNSError
		certErr *tls.CertificateVerificationError
		unkAuth x509.UnknownAuthorityError
		netErr  net.Error
	)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &dnsErr):
		if dnsErr.IsNotFound {
			return "host not found"
		}
		return "dns lookup failed"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	case errors.As(err, &certErr), errors.As(err, &unkAuth):
		return "tls certificate rejected"
	case errors.As(err, &netErr) && netErr.Timeout():
		return "timed out"
	default:
		return "transport error"
	}
}

// bound keeps a reason within maxReasonLen bytes without splitting a rune.
func bound(s string) string { return gate.Bound(s, maxReasonLen) }

// drainClose discards a little of what is left of a body so the connection can
// go back to the pool, then closes it. http.NoBody, which the Transport gives
// an answer with Content-Length: 0 (a 201 or 204 without content, most
// confirmations), has nothing to discard, and skipping it skips the
// LimitReader the discarding allocates.
func drainClose(body io.ReadCloser) {
	if body == http.NoBody {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(body, maxDrainBytes))
	_ = body.Close()
}
