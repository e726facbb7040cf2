package gate

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// JSON pointers (RFC 6901) select an operation key or fingerprint fields in a
// message's data, and a result id in a downstream answer.

// pointerValue resolves pointer in the JSON document doc and returns the value
// as text the identity can be built from: a string as itself, anything else
// re-encoded (object keys sorted), so that whitespace and key order never make
// one intent look like two.
func pointerValue(doc []byte, pointer string) (string, error) {
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return "", fmt.Errorf("data is not JSON, pointer %s cannot apply", pointer)
	}
	got, err := ResolvePointer(v, pointer)
	if err != nil {
		return "", err
	}
	if s, ok := got.(string); ok {
		return s, nil
	}
	b, err := json.Marshal(got) // map keys come out sorted
	if err != nil {
		return "", fmt.Errorf("pointer %s: %w", pointer, err)
	}
	return string(b), nil
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
