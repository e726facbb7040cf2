// Package seal encrypts the values a route lists as private inside a JSON
// document, so that a store which must keep the document (the handoff
// outbox, until its relay delivers it) never holds them in clear.
//
// Each value is sealed on its own with XChaCha20-Poly1305
// (golang.org/x/crypto/chacha20poly1305): a random 192-bit nonce per value
// is safe for any number of values under one key, which AES-GCM's 96-bit
// nonces are not. The value's JSON text is replaced in the document by a
// JSON string, Prefix + key id + ":" + base64url(nonce || ciphertext), and
// nothing else in the document changes, byte for byte; Unseal puts the
// original text back exactly. The additional data binds each value to its
// key id, to the caller's context (the outbox entry's operation id) and to
// its pointer, so a sealed value copied to another entry or field does not
// open.
//
// Keys rotate: a Keyring seals with its current key and opens with it or
// any older key it was given, so entries sealed before a rotation stay
// readable until they are delivered or purged, after which the old key can
// be dropped.
package seal

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/crypto/chacha20poly1305"
)

// Prefix starts every sealed value.
const Prefix = "ackgate:sealed:v1:"

// KeySize is the size of a key: 32 bytes.
const KeySize = chacha20poly1305.KeySize

var (
	// ErrNotJSON: the document is not JSON, so its pointers cannot be
	// found; a caller must not keep it in clear (see SealBytes).
	ErrNotJSON = errors.New("seal: document is not JSON")
	// ErrNotSealed: Unseal found a value at a pointer that is not sealed.
	ErrNotSealed = errors.New("seal: value is not sealed")
	// ErrOpen: a sealed value does not open under the key it names (an
	// unknown or wrong key, another context or pointer, altered bytes).
	ErrOpen = errors.New("seal: sealed value does not open")
)

// keyIDRE is a key id: short, and without the ":" that ends it in a value.
var keyIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// Key is one named key.
type Key struct {
	ID     string
	Secret []byte
}

// ParseKey reads a key as the settings write it: ID:BASE64, where BASE64
// is 32 bytes in standard base64 (openssl rand -base64 32). Errors never
// quote the secret.
func ParseKey(s string) (Key, error) {
	id, b64, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok || !keyIDRE.MatchString(id) {
		return Key{}, errors.New("must be ID:BASE64 with an ID of 1 to 32 letters, digits, - or _")
	}
	secret, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(secret) != KeySize {
		return Key{}, fmt.Errorf("key %q: the secret must be %d bytes in standard base64 (openssl rand -base64 32)", id, KeySize)
	}
	return Key{ID: id, Secret: secret}, nil
}

// Keyring seals with one key and opens with it and older ones.
type Keyring struct {
	current string
	aeads   map[string]cipherAEAD
}

type cipherAEAD interface {
	Seal(dst, nonce, plaintext, additionalData []byte) []byte
	Open(dst, nonce, ciphertext, additionalData []byte) ([]byte, error)
	NonceSize() int
}

// NewKeyring seals with current and opens with current and old. Key ids
// must be distinct.
func NewKeyring(current Key, old ...Key) (*Keyring, error) {
	k := &Keyring{current: current.ID, aeads: map[string]cipherAEAD{}}
	for _, key := range append([]Key{current}, old...) {
		if !keyIDRE.MatchString(key.ID) {
			return nil, fmt.Errorf("seal: key id %q is not 1 to 32 letters, digits, - or _", key.ID)
		}
		if _, dup := k.aeads[key.ID]; dup {
			return nil, fmt.Errorf("seal: key id %q is given twice", key.ID)
		}
		a, err := chacha20poly1305.NewX(key.Secret)
		if err != nil {
			return nil, fmt.Errorf("seal: key %q: %w", key.ID, err)
		}
		k.aeads[key.ID] = a
	}
	return k, nil
}

// CurrentID is the id of the key new values are sealed with.
func (k *Keyring) CurrentID() string { return k.current }

func additional(keyID, context, pointer string) []byte {
	return []byte("ackgate seal v1\x00" + keyID + "\x00" + context + "\x00" + pointer)
}

// sealValue seals plain under the current key for (context, pointer).
func (k *Keyring) sealValue(plain []byte, context, pointer string) string {
	a := k.aeads[k.current]
	nonce := make([]byte, a.NonceSize(), a.NonceSize()+len(plain)+chacha20poly1305.Overhead)
	if _, err := io.ReadFull(rand.Reader, nonce); err != nil {
		panic("seal: no randomness: " + err.Error()) // crypto/rand does not fail on supported systems
	}
	out := a.Seal(nonce, nonce, plain, additional(k.current, context, pointer))
	return Prefix + k.current + ":" + base64.RawURLEncoding.EncodeToString(out)
}

// openValue opens a sealed value made by sealValue for (context, pointer).
func (k *Keyring) openValue(sealed, context, pointer string) ([]byte, error) {
	rest, ok := strings.CutPrefix(sealed, Prefix)
	if !ok {
		return nil, ErrNotSealed
	}
	id, b64, ok := strings.Cut(rest, ":")
	a, known := k.aeads[id]
	if !ok || !known {
		return nil, fmt.Errorf("%w: key %q is not in the keyring", ErrOpen, id)
	}
	raw, err := base64.RawURLEncoding.DecodeString(b64)
	if err != nil || len(raw) < a.NonceSize()+chacha20poly1305.Overhead {
		return nil, ErrOpen
	}
	plain, err := a.Open(nil, raw[:a.NonceSize()], raw[a.NonceSize():], additional(id, context, pointer))
	if err != nil {
		return nil, ErrOpen
	}
	return plain, nil
}

// SealBytes seals a whole value (a document that is not JSON, say) for
// context; OpenBytes opens it.
func (k *Keyring) SealBytes(plain []byte, context string) string {
	return k.sealValue(plain, context, "")
}

// OpenBytes opens what SealBytes sealed for context.
func (k *Keyring) OpenBytes(sealed, context string) ([]byte, error) {
	return k.openValue(sealed, context, "")
}

// Seal returns doc with the value at each pointer sealed for context. A
// pointer that selects nothing in doc is skipped (there is nothing to
// keep). Where a member name appears twice in one object, every copy is
// sealed. A pointer inside another's value is covered by the outer seal.
// doc must be JSON (ErrNotJSON otherwise); with no pointers it is returned
// as is.
func (k *Keyring) Seal(doc []byte, pointers []string, context string) ([]byte, error) {
	if len(pointers) == 0 {
		return doc, nil
	}
	spans, err := findAll(doc, pointers)
	if err != nil {
		return nil, err
	}
	return splice(doc, spans, func(s span) ([]byte, error) {
		return json.Marshal(k.sealValue(doc[s.start:s.end], context, s.pointer))
	})
}

// Unseal returns doc with the value at each pointer opened: the document
// Seal was given, byte for byte. A value at a pointer that is not sealed is
// ErrNotSealed; one that does not open is ErrOpen. Pointers that select
// nothing are skipped, as in Seal.
func (k *Keyring) Unseal(doc []byte, pointers []string, context string) ([]byte, error) {
	if len(pointers) == 0 {
		return doc, nil
	}
	spans, err := findAll(doc, pointers)
	if err != nil {
		return nil, err
	}
	return splice(doc, spans, func(s span) ([]byte, error) {
		var v string
		if err := json.Unmarshal(doc[s.start:s.end], &v); err != nil {
			return nil, fmt.Errorf("%w (at %s)", ErrNotSealed, s.pointer)
		}
		plain, err := k.openValue(v, context, s.pointer)
		if err != nil {
			return nil, fmt.Errorf("%w (at %s)", err, s.pointer)
		}
		return plain, nil
	})
}

// span is where one pointer's value lies in a document: [start, end).
type span struct {
	start, end int
	pointer    string
}

// findAll finds every value the pointers select, outermost only, in
// document order.
func findAll(doc []byte, pointers []string) ([]span, error) {
	if !json.Valid(doc) {
		return nil, ErrNotJSON
	}
	var all []span
	for _, p := range pointers {
		tokens, err := parsePointer(p)
		if err != nil {
			return nil, err
		}
		dec := json.NewDecoder(bytes.NewReader(doc))
		found, err := find(dec, doc, tokens, p)
		if err != nil {
			return nil, err
		}
		all = append(all, found...)
	}
	slices.SortFunc(all, func(a, b span) int {
		if a.start != b.start {
			return a.start - b.start
		}
		return b.end - a.end // the outer first
	})
	var out []span
	for _, s := range all {
		if n := len(out); n > 0 && s.start < out[n-1].end {
			continue // inside (or equal to) the previous span: already covered
		}
		out = append(out, s)
	}
	return out, nil
}

func parsePointer(p string) ([]string, error) {
	if p == "" || !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("seal: pointer %q must start with /", p)
	}
	tokens := strings.Split(p[1:], "/")
	for i, t := range tokens {
		tokens[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return tokens, nil
}

// find reads the value the decoder is at and returns the spans of what
// tokens select inside it. doc is the whole document, for offsets.
func find(dec *json.Decoder, doc []byte, tokens []string, pointer string) ([]span, error) {
	if len(tokens) == 0 {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		end := int(dec.InputOffset())
		return []span{{start: end - len(raw), end: end, pointer: pointer}}, nil
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	delim, ok := tok.(json.Delim)
	if !ok || (delim != '{' && delim != '[') {
		return nil, nil // a scalar: the pointer goes no further
	}
	var out []span
	for i := 0; dec.More(); i++ {
		match := false
		if delim == '{' {
			key, err := dec.Token()
			if err != nil {
				return nil, err
			}
			match = key.(string) == tokens[0]
		} else {
			n, err := strconv.Atoi(tokens[0])
			match = err == nil && n == i && strconv.Itoa(n) == tokens[0]
		}
		if !match {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, err
			}
			continue
		}
		found, err := find(dec, doc, tokens[1:], pointer)
		if err != nil {
			return nil, err
		}
		out = append(out, found...)
	}
	if _, err := dec.Token(); err != nil { // the closing delimiter
		return nil, err
	}
	return out, nil
}

// splice replaces each span (sorted, not overlapping) by what replace
// makes of it.
func splice(doc []byte, spans []span, replace func(span) ([]byte, error)) ([]byte, error) {
	var b bytes.Buffer
	b.Grow(len(doc))
	last := 0
	for _, s := range spans {
		r, err := replace(s)
		if err != nil {
			return nil, err
		}
		b.Write(doc[last:s.start])
		b.Write(r)
		last = s.end
	}
	b.Write(doc[last:])
	return b.Bytes(), nil
}
