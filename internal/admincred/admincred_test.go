package admincred_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/internal/admincred"
)

func TestParseAndMatch(t *testing.T) {
	t.Parallel()
	bobSum := sha256.Sum256([]byte("bob-token-0123456789"))
	entries, err := admincred.Parse("# operators\nalice=alice-token-0123456789, bob=sha256:" + hex.EncodeToString(bobSum[:]) + "\n\n  carol.ops = carol-token-0123456789  \n")
	if err != nil {
		t.Fatal(err)
	}
	set, err := admincred.New(append(entries, admincred.FromToken(admincred.AdminName, "admin-token-0123456789"))...)
	if err != nil {
		t.Fatal(err)
	}
	for token, want := range map[string]string{
		"alice-token-0123456789": "alice", "bob-token-0123456789": "bob", "carol-token-0123456789": "carol.ops",
		"admin-token-0123456789": "admin", "": "", "alice-token-012345678": "", "sha256:" + hex.EncodeToString(bobSum[:]): "",
	} {
		if got, ok := set.Match(token); got != want || ok != (want != "") {
			t.Errorf("Match(%q) = %q, %v; want %q", token, got, ok, want)
		}
	}
	if set.Len() != 4 || set.Version("bob") == "" || set.Version("nobody") != "" {
		t.Fatalf("set: %d, %q", set.Len(), set.Version("bob"))
	}
	rotated, _ := admincred.New(admincred.FromToken("bob", "bob-new-token-0123456789"))
	if rotated.Version("bob") == set.Version("bob") {
		t.Fatal("a rotated token keeps its version")
	}
}

func TestParseRefusals(t *testing.T) {
	t.Parallel()
	const secret = "short-secret"
	for text, want := range map[string]string{
		"alice":                              "entry 1: must be NAME=TOKEN",
		"Alice=alice-token-0123456789":       "entry 1: name must be",
		"alice=" + secret:                    "entry 1 (alice): the token must be at least 16",
		"a=ok-token-0123456789,b=sha256:abc": "entry 2 (b): sha256: must be followed by 64 hex digits",
	} {
		_, err := admincred.Parse(text)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), secret) {
			t.Errorf("Parse(%q) = %v, want %q", text, err, want)
		}
	}
	if _, err := admincred.New(admincred.FromToken("a", "same-token-0123456789"), admincred.FromToken("b", "same-token-0123456789")); err == nil ||
		!strings.Contains(err.Error(), "same token") {
		t.Errorf("one token under two names: %v", err)
	}
	if _, err := admincred.New(admincred.FromToken("a", "one-token-0123456789"), admincred.FromToken("a", "two-token-0123456789")); err == nil {
		t.Error("one name twice was accepted")
	}
}
