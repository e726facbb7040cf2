package handlers

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// readBody reads a body whole whether or not its length is declared, and
// refuses one over the limit (413) or shorter than it said (400) the same
// way in both cases.
func TestReadBody(t *testing.T) {
	t.Parallel()
	const limit = 64
	for _, tc := range []struct {
		name     string
		body     string
		declared int64 // -1: unknown, as for a chunked body
		status   int   // 0: read
	}{
		{"declared", strings.Repeat("a", 40), 40, 0},
		{"declared at the limit", strings.Repeat("a", limit), limit, 0},
		{"unknown length", strings.Repeat("a", 40), -1, 0},
		{"declared over the limit", strings.Repeat("a", limit+1), limit + 1, http.StatusRequestEntityTooLarge},
		{"unknown length over the limit", strings.Repeat("a", limit+1), -1, http.StatusRequestEntityTooLarge},
		{"shorter than declared", strings.Repeat("a", 10), 40, http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodPost, "/", io.NopCloser(strings.NewReader(tc.body)))
			r.ContentLength = tc.declared
			got, err := readBody(httptest.NewRecorder(), r, limit)
			if tc.status == 0 {
				if err != nil || !bytes.Equal(got, []byte(tc.body)) {
					t.Fatalf("read %q, %v; want the body", got, err)
				}
				return
			}
			var rej *Rejection
			if !errors.As(err, &rej) || rej.Status != tc.status {
				t.Fatalf("read %q, %v; want a %d refusal", got, err, tc.status)
			}
		})
	}
}
