package gate

import "unicode/utf8"

// MaxReason is the longest reason, in bytes, that is recorded in the ledger or
// sent back to a broker. Reasons quote what a downstream, a message or a
// configuration said, so they are cut to a size fit for a column, a log line
// and a response body.
const MaxReason = 300

// Bound cuts s to at most n bytes. It never splits a UTF-8 sequence: Postgres
// refuses text that is not valid UTF-8, so a reason cut in the middle of a
// character would turn a recordable outcome into a ledger error.
func Bound(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	cut := n
	// s[cut] is the first byte left out. If it continues a sequence, the
	// sequence starts at most UTFMax-1 bytes earlier; stepping back no further
	// keeps a run of stray continuation bytes from eating the whole prefix.
	for i := 1; i < utf8.UTFMax && cut > 0 && !utf8.RuneStart(s[cut]); i++ {
		cut--
	}
	return s[:cut]
}
