package handlers

import (
	"testing"
	"time"
)

// The first refusal is logged at once, the rest of the interval only
// counted, and the next line carries that count.
func TestRefusalLogSpacesItsLines(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	l := newRefusalLog(func() time.Time { return now })
	if ok, n := l.admit(); !ok || n != 0 {
		t.Fatalf("first refusal: logged %v, %d left out", ok, n)
	}
	for i := range 99 {
		now = now.Add(refusalLogInterval / 200)
		if ok, _ := l.admit(); ok {
			t.Fatalf("refusal %d inside the interval was logged", i+2)
		}
	}
	now = now.Add(refusalLogInterval)
	if ok, n := l.admit(); !ok || n != 99 {
		t.Fatalf("after the interval: logged %v, %d left out; want true, 99", ok, n)
	}
}

func TestAuthFailureReason(t *testing.T) {
	t.Parallel()
	for header, want := range map[string]string{
		"":                authMissing,
		"Basic YTpi":      authNotBearer,
		"Bear":            authNotBearer,
		"Bearer ":         authWrongToken,
		"bearer guess":    authWrongToken,
		"Bearer guessing": authWrongToken,
	} {
		if got := authFailureReason(header); got != want {
			t.Errorf("authFailureReason(%q) = %s, want %s", header, got, want)
		}
	}
}
