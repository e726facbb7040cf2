package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// What gateway ops prints comes from messages a broker delivered: keys,
// message ids, reasons that quote them. A publisher can put terminal
// escape sequences in any of them (ESC [ 2 J, an OSC 8 link, a title
// change, bidirectional overrides that reorder what an operator reads),
// and a terminal obeys them. So every such value goes through clean (text
// output) or cleanJSON (-json output) before it reaches the terminal.

// clean returns s as it is when every rune in it is printable, and
// strconv.Quote of it otherwise, so that an escape sequence shows as
// "\x1b[2J" instead of clearing the screen. A quoted value is visibly
// quoted; an ordinary one is not touched.
func clean(s string) string {
	if printable(s) {
		return s
	}
	return strconv.Quote(s)
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r != ' ' && !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// cleanf is fmt.Fprintf with every string argument cleaned; the format
// itself is ours.
func cleanf(w io.Writer, format string, args ...any) {
	for i, a := range args {
		// Named string types too (states, decisions, kinds): they hold
		// what the API sent.
		if v := reflect.ValueOf(a); v.Kind() == reflect.String {
			args[i] = clean(v.String())
		} else if st, ok := a.(fmt.Stringer); ok {
			args[i] = clean(st.String())
		}
	}
	fmt.Fprintf(w, format, args...)
}

// writeJSON prints v indented. encoding/json already escapes the C0
// controls (ESC among them) inside strings; DEL and the C1 controls
// (U+0080 to U+009F, which some terminals read as CSI and OSC) and the
// bidirectional formatting characters it leaves as they are, so they are
// escaped here too. Outside strings JSON has none of them, so the result
// stays valid JSON that decodes to the same values.
func writeJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := io.WriteString(w, cleanJSON(buf.String()))
	return err
}

func cleanJSON(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r == 0x7f || (r >= 0x80 && r <= 0x9f) || unicode.Is(unicode.Cf, r) {
			if hi, lo := utf16.EncodeRune(r); hi != utf8.RuneError {
				fmt.Fprintf(&b, `\u%04x\u%04x`, hi, lo)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
