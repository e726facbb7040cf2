package gate_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ackgate/ackgate/gate"
)

func TestBound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		s    string
		n    int
		want string
	}{
		{"shorter than the bound", "abc", 5, "abc"},
		{"exactly the bound", "abcde", 5, "abcde"},
		{"ascii cut", "abcdef", 5, "abcde"},
		{"empty", "", 3, ""},
		{"zero bound", "abc", 0, ""},
		{"negative bound", "abc", -1, ""},
		{"two-byte rune across the bound", "abcdé", 5, "abcd"},
		{"two-byte rune ending at the bound", "abcé!", 5, "abcé"},
		{"three-byte rune across the bound", "ab€cd", 3, "ab"},
		{"three-byte rune, one byte in", "ab€cd", 4, "ab"},
		{"three-byte rune ending at the bound", "ab€cd", 5, "ab€"},
		{"four-byte rune across the bound", "a😀b", 4, "a"},
		{"four-byte rune ending at the bound", "a😀b", 5, "a😀"},
		{"bound inside the first rune", "😀b", 2, ""},
		{"stray continuation bytes are cut, not backed over", "ab" + strings.Repeat("\x80", 10), 6, "ab\x80"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := gate.Bound(tc.s, tc.n); got != tc.want {
				t.Errorf("Bound(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
			}
		})
	}
}

// Every bound of a string mixing one- to four-byte runes gives a valid prefix
// that is as long as it can be.
func TestBoundKeepsValidTextValid(t *testing.T) {
	t.Parallel()
	s := strings.Repeat("a é € 😀 ", 8)
	for n := range len(s) + 2 {
		got := gate.Bound(s, n)
		if !strings.HasPrefix(s, got) || len(got) > n || !utf8.ValidString(got) {
			t.Fatalf("Bound(s, %d) = %q: not a valid prefix within the bound", n, got)
		}
		if n < len(s) && len(got) < n-utf8.UTFMax+1 {
			t.Fatalf("Bound(s, %d) kept %d bytes: cut more than one rune", n, len(got))
		}
	}
	if got := gate.Bound(strings.Repeat("x", 400), gate.MaxReason); len(got) != gate.MaxReason {
		t.Fatalf("Bound to MaxReason kept %d bytes", len(got))
	}
}
