// Package admincred holds the admin credentials: named bearer tokens, so
// that every resolution, replay and console action is recorded under the
// name of the credential that made it, never under a name the caller
// chose.
//
// A credential is kept only as the SHA-256 of its token, and may be
// configured that way (name=sha256:HEX), so that the configuration need not
// hold a token at all. Tokens are random secrets of at least MinTokenLen
// characters, not passwords: a fast hash is enough, and what makes a guess
// expensive is the rate limit on checks (package authlimit).
package admincred

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// AdminName is the name GATEWAY_ADMIN_TOKEN is known by.
const AdminName = "admin"

// MinTokenLen is the shortest token accepted in clear.
const MinTokenLen = 16

// nameRE is a credential name: it becomes part of every actor it records
// ("api:NAME", "console:NAME"), so it is short and plain.
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// Entry is one configured credential.
type Entry struct {
	Name string
	Sum  [32]byte
}

// FromToken is the entry of a token given in clear.
func FromToken(name, token string) Entry {
	return Entry{Name: name, Sum: sha256.Sum256([]byte(token))}
}

// Parse reads credentials as GATEWAY_ADMIN_TOKENS and its file write them:
// NAME=TOKEN or NAME=sha256:HEX (the token's SHA-256 in hex), separated by
// commas or new lines; blank lines and lines starting with # are skipped.
// Errors name the entry by its position and name, never a token.
func Parse(text string) ([]Entry, error) {
	var out []Entry
	var errs []error
	n := 0
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for item := range strings.SplitSeq(line, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			n++
			name, secret, ok := strings.Cut(item, "=")
			name, secret = strings.TrimSpace(name), strings.TrimSpace(secret)
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("entry %d: must be NAME=TOKEN or NAME=sha256:HEX", n))
				continue
			case !nameRE.MatchString(name):
				errs = append(errs, fmt.Errorf("entry %d: name must be 1 to 64 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit", n))
				continue
			}
			if h, hashed := strings.CutPrefix(secret, "sha256:"); hashed {
				sum, err := hex.DecodeString(h)
				if err != nil || len(sum) != sha256.Size {
					errs = append(errs, fmt.Errorf("entry %d (%s): sha256: must be followed by 64 hex digits", n, name))
					continue
				}
				out = append(out, Entry{Name: name, Sum: [32]byte(sum)})
				continue
			}
			if err := CheckToken(secret); err != nil {
				errs = append(errs, fmt.Errorf("entry %d (%s): the token %w", n, name, err))
				continue
			}
			out = append(out, FromToken(name, secret))
		}
	}
	return out, errors.Join(errs...)
}

// CheckToken says what is wrong with a token given in clear.
func CheckToken(token string) error {
	switch {
	case len(token) < MinTokenLen:
		return fmt.Errorf("must be at least %d characters", MinTokenLen)
	case strings.TrimSpace(token) != token:
		return errors.New("has leading or trailing white space")
	}
	return nil
}

// Set is the credentials the admin listener accepts.
type Set struct {
	entries []Entry
}

// New builds a set. Names must be distinct, and so must tokens: one token
// under two names would make the actor a guess.
func New(entries ...Entry) (*Set, error) {
	names := map[string]bool{}
	sums := map[[32]byte]string{}
	var errs []error
	for _, e := range entries {
		if names[e.Name] {
			errs = append(errs, fmt.Errorf("credential %q is given twice", e.Name))
		}
		if other, dup := sums[e.Sum]; dup {
			errs = append(errs, fmt.Errorf("credentials %q and %q have the same token", other, e.Name))
		}
		names[e.Name], sums[e.Sum] = true, e.Name
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Set{entries: append([]Entry(nil), entries...)}, nil
}

// Len is how many credentials there are.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.entries)
}

// Names lists the credentials' names, for logs.
func (s *Set) Names() []string {
	if s == nil {
		return nil
	}
	out := make([]string, len(s.entries))
	for i, e := range s.entries {
		out[i] = e.Name
	}
	return out
}

// Match returns the name of the credential whose token this is. It hashes
// the token once and compares the hash with every credential's, each in
// constant time and all of them, so that neither which credential matched
// nor how much of a guess was right shows in the time it takes. An empty
// token never matches.
func (s *Set) Match(token string) (string, bool) {
	if s == nil || token == "" {
		return "", false
	}
	sum := sha256.Sum256([]byte(token))
	found := -1
	for i := range s.entries {
		if subtle.ConstantTimeCompare(sum[:], s.entries[i].Sum[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return "", false
	}
	return s.entries[found].Name, true
}

// Has reports whether token is one of the set's, whatever its name.
func (s *Set) Has(token string) bool {
	_, ok := s.Match(token)
	return ok
}

// Version is a value that changes when the named credential's token does,
// and is "" when there is no such credential: a console session records it
// at login, and a rotated or removed token ends the session. It is a hash
// of the token's hash, so it reveals nothing a stored session could be
// used for.
func (s *Set) Version(name string) string {
	if s == nil {
		return ""
	}
	for _, e := range s.entries {
		if e.Name == name {
			v := sha256.Sum256(append([]byte("ackgate credential version\x00"), e.Sum[:]...))
			return hex.EncodeToString(v[:16])
		}
	}
	return ""
}
