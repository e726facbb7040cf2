package gate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// JSON pointers (RFC 6901) select an operation key or fingerprint fields in a
// message's data, and a result id in a downstream answer.

// pointerValue resolves pointer in the JSON document doc and returns the value
// as text the identity can be built from: a string as itself, anything else
// re-encoded canonically (object keys sorted, numbers by canonicalNumber), so
// that whitespace and key order never make one intent look like two.
func pointerValue(doc []byte, pointer string) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	// Numbers stay text until canonicalNumber decides: a float64 would merge
	// two large integer ids into one key.
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", fmt.Errorf("data is not JSON, pointer %s cannot apply", pointer)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("data is not JSON, pointer %s cannot apply", pointer)
	}
	got, err := ResolvePointer(v, pointer)
	if err != nil {
		return "", err
	}
	s, ok := got.(string)
	if !ok {
		b, err := json.Marshal(canonicalNumbers(got)) // map keys come out sorted
		if err != nil {
			return "", fmt.Errorf("pointer %s: %w", pointer, err)
		}
		s = string(b)
	}
	// The decoder turned every byte that is not UTF-8, and every unpaired
	// surrogate escape, into U+FFFD: two different values would be one key
	// or one fingerprint. Only a value that now holds U+FFFD can have been
	// changed so, and only then are its raw bytes looked at.
	if strings.ContainsRune(s, utf8.RuneError) {
		raw, err := rawAt(doc, pointer)
		if err != nil {
			return "", err
		}
		if why := ExactJSON(raw); why != "" {
			return "", fmt.Errorf("pointer %s: value %s", pointer, why)
		}
	}
	return s, nil
}

// rawAt is the JSON text at pointer in doc, as it was written. doc has
// already been decoded whole, so it is valid JSON and pointer resolves.
func rawAt(doc []byte, pointer string) ([]byte, error) {
	raw := bytes.TrimSpace(doc)
	if pointer == "" {
		return raw, nil
	}
	for _, tok := range strings.Split(pointer[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		var next json.RawMessage
		switch {
		case len(raw) > 0 && raw[0] == '{':
			var m map[string]json.RawMessage
			if err := json.Unmarshal(raw, &m); err != nil {
				return nil, fmt.Errorf("pointer %s: %w", pointer, err)
			}
			next = m[tok]
		case len(raw) > 0 && raw[0] == '[':
			var a []json.RawMessage
			if err := json.Unmarshal(raw, &a); err != nil {
				return nil, fmt.Errorf("pointer %s: %w", pointer, err)
			}
			if i, err := strconv.Atoi(tok); err == nil && i >= 0 && i < len(a) {
				next = a[i]
			}
		}
		if next == nil {
			return nil, fmt.Errorf("pointer %s: %q cannot be found again", pointer, tok)
		}
		raw = bytes.TrimSpace(next)
	}
	return raw, nil
}

// ExactJSON says why the strings of the JSON text doc would not decode into
// Go strings byte for byte ("is not valid UTF-8", "holds an unpaired
// surrogate escape"), or "" when they would. encoding/json replaces either
// with U+FFFD without an error, so two texts that differ only there decode
// to one value: two message ids, keys or reasons would become one. Anything
// from outside whose strings are compared or kept is checked with it
// before it is decoded.
func ExactJSON(doc []byte) string {
	if !utf8.Valid(doc) {
		return "is not valid UTF-8"
	}
	if bytes.IndexByte(doc, '\\') < 0 {
		return ""
	}
	for i := 0; i < len(doc); i++ {
		if doc[i] != '\\' {
			continue
		}
		if i+1 >= len(doc) || doc[i+1] != 'u' {
			i++ // a two-byte escape such as \\ or \"; its second byte is no escape
			continue
		}
		r, ok := hex4(doc[i+2:])
		if !ok {
			continue // not JSON at all; the decoder says so
		}
		switch {
		case r >= 0xD800 && r < 0xDC00:
			if len(doc) >= i+12 && doc[i+6] == '\\' && doc[i+7] == 'u' {
				if lo, ok := hex4(doc[i+8:]); ok && lo >= 0xDC00 && lo < 0xE000 {
					i += 11
					continue
				}
			}
			return "holds an unpaired surrogate escape"
		case r >= 0xDC00 && r < 0xE000:
			return "holds an unpaired surrogate escape"
		}
		i += 5
	}
	return ""
}

// hex4 reads the four hex digits of a \u escape.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// canonicalNumbers rewrites every number inside v with canonicalNumber.
func canonicalNumbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		return canonicalNumber(v)
	case map[string]any:
		for k, e := range v {
			v[k] = canonicalNumbers(e)
		}
	case []any:
		for i, e := range v {
			v[i] = canonicalNumbers(e)
		}
	}
	return v
}

// canonicalNumber spells a number the way encoding/json writes a float64, so
// that 1, 1.0 and 1e0 are one value in keys and fingerprints, as they were
// when numbers were decoded as float64. Two kinds of number keep their own
// text instead: an integer whose digits a float64 does not give back (most
// beyond 2^53), because rounding would give two different ids one key; and a
// number beyond float64's range, which has no float64 spelling.
func canonicalNumber(n json.Number) json.Number {
	s := n.String()
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return n
	}
	integer := strings.TrimLeft(strings.TrimPrefix(s, "-"), "0123456789") == ""
	if integer && strconv.FormatFloat(f, 'f', -1, 64) != s {
		return n
	}
	b, err := json.Marshal(f)
	if err != nil {
		return n
	}
	return json.Number(b)
}

// ResolvePointer walks an RFC 6901 JSON pointer through a decoded document.
// Errors name the pointer and its tokens, which come from configuration,
// never a value from the document.
func ResolvePointer(v any, pointer string) (any, error) {
	if pointer == "" {
		return v, nil
	}
	if !strings.HasPrefix(pointer, "/") {
		return nil, fmt.Errorf("pointer %q must start with /", pointer)
	}
	cur := v
	for _, tok := range strings.Split(pointer[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch node := cur.(type) {
		case map[string]any:
			next, ok := node[tok]
			if !ok {
				return nil, fmt.Errorf("pointer %s: no member %q", pointer, tok)
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(node) {
				return nil, fmt.Errorf("pointer %s: no element %q", pointer, tok)
			}
			cur = node[i]
		default:
			return nil, fmt.Errorf("pointer %s: %q is not inside an object or array", pointer, tok)
		}
	}
	if cur == nil {
		return nil, fmt.Errorf("pointer %s: value is null", pointer)
	}
	return cur, nil
}
