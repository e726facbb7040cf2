package gate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
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
	if s, ok := got.(string); ok {
		return s, nil
	}
	b, err := json.Marshal(canonicalNumbers(got)) // map keys come out sorted
	if err != nil {
		return "", fmt.Errorf("pointer %s: %w", pointer, err)
	}
	return string(b), nil
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
