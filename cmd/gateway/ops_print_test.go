package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
)

// hostile are values a publisher (or a compromised admin API) could put in
// anything gateway ops prints: ANSI CSI (clear the screen), OSC 0 (set
// the terminal's title), OSC 8 (a hyperlink that hides its target), an
// 8-bit CSI, BEL, DEL, and a right-to-left override.
var hostile = []string{
	"\x1b[2J\x1b[Hcleared",
	"\x1b]0;pwned\x07title",
	"\x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\",
	"\u009b31mred",
	"del\x7fbel\x07",
	"abc\u202egnp.exe",
}

// rawControls reports the first terminal control character in s, which
// must never reach a terminal as it came.
func rawControls(s string) (rune, bool) {
	for _, r := range s {
		if r == '\n' || r == '\t' {
			continue
		}
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == '\u202e' {
			return r, true
		}
	}
	return 0, false
}

func TestCleanQuotesOnlyWhatTerminalsWouldObey(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"op_kmlfowz3wphm6xf5zsvk7v7orb", "order 17: ünïcödé, 日本", "fenced: lease lost"} {
		if got := clean(s); got != s {
			t.Errorf("clean(%q) = %q, want it untouched", s, got)
		}
	}
	for _, s := range append(hostile, "bad utf-8 \xff") {
		got := clean(s)
		if r, bad := rawControls(got); bad {
			t.Errorf("clean(%q) = %q still holds %U", s, got, r)
		}
		if !strings.HasPrefix(got, `"`) {
			t.Errorf("clean(%q) = %q, want it visibly quoted", s, got)
		}
	}
	// -json output stays JSON and decodes to the very same values.
	var buf bytes.Buffer
	if err := writeJSON(&buf, map[string]any{"v": hostile}); err != nil {
		t.Fatal(err)
	}
	if r, bad := rawControls(buf.String()); bad {
		t.Errorf("-json output holds %U:\n%s", r, buf.String())
	}
	var back struct{ V []string }
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil || strings.Join(back.V, "|") != strings.Join(hostile, "|") {
		t.Errorf("-json output does not decode to the values (%v):\n%s", err, buf.String())
	}
	if got := cleanJSON("tag \U000E0001"); got != `tag \udb40\udc01` {
		t.Errorf("a format character beyond the BMP: %q", got)
	}
}

// fakeAdmin answers every read of gateway ops with documents whose every
// string field holds h, as an admin API could if a publisher put h in a
// message id, a key or an attribute an operator's reason quotes.
func fakeAdmin(t *testing.T, h string) *httptest.Server {
	t.Helper()
	op := map[string]any{
		"id": "op_" + h, "route": "orders", "key": "key " + h, "state": "effect_indeterminate",
		"idempotency_key": "idem " + h, "result_id": "res " + h, "contract_version": "cv " + h,
		"updated_at": "2026-01-02T03:04:05Z", "retain_until": "2026-02-02T03:04:05Z", "trace_id": "trace " + h,
	}
	intervention := "resolve by " + h
	docs := map[string]any{
		"/v1/operations/op_1": map[string]any{
			"operation": op,
			"evidence": map[string]any{"trace_id": "trace " + h, "negative_ack_or_dead_letter_reason": "reason " + h,
				"manual_intervention": intervention},
			"completion_statement": "statement " + h,
			"transitions":          []any{map[string]any{"to": "received", "at": "2026-01-02T03:04:05Z", "reason": "transition " + h}},
			"attempts": []any{map[string]any{"n": 1, "kind": "effect", "outcome": "unknown", "reason": "attempt " + h,
				"started_at": "2026-01-02T03:04:05Z"}},
			"deliveries": []any{map[string]any{"message_id": "msg " + h, "decision": "nack", "reason": "delivery " + h,
				"anomaly": "anomaly " + h, "trace_id": "dtrace " + h, "received_at": "2026-01-02T03:04:05Z"}},
		},
		"/v1/operations": map[string]any{"operations": []any{op}, "next_cursor": "cursor " + h},
		"/v1/dead-letters": map[string]any{"dead_letters": []any{map[string]any{
			"operation_id": "op_" + h, "route": "orders", "state": "terminal_failure", "dead_lettered_by": "gateway",
			"message_id": "msg " + h, "reason": "reason " + h}}, "next_cursor": "cursor " + h},
		"/v1/poison": map[string]any{"poison": []any{map[string]any{
			"route": "orders", "message_id": "msg " + h, "reason": "reason " + h, "last_seen": "2026-01-02T03:04:05Z"}}},
		"/v1/routes":        map[string]any{"routes": []any{map[string]any{"name": "orders " + h, "contract_version": "cv " + h}}},
		"/v1/routes/orders": map[string]any{"name": "orders"},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		doc, ok := docs[r.URL.Path]
		if strings.HasSuffix(r.URL.Path, "/resolve") || strings.HasSuffix(r.URL.Path, "/replay") {
			doc, ok = docs["/v1/operations/op_1"], true
		}
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(map[string]string{"error": "no " + h})
			return
		}
		json.NewEncoder(w).Encode(doc)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// Everything gateway ops prints from the admin API reaches the terminal
// with its control characters escaped, in text and in -json output, and in
// the error an unknown id brings back.
func TestOpsEscapesWhatItPrints(t *testing.T) {
	t.Parallel()
	for _, h := range hostile {
		srv := fakeAdmin(t, h)
		env := gatewayEnv{"GATEWAY_ADMIN_URL": srv.URL, "GATEWAY_ADMIN_TOKEN": "t"}
		quoted := strings.Trim(clean(h), `"`)
		for _, args := range [][]string{
			{"show", "op_1"}, {"show", "-json", "op_1"}, {"list"}, {"list", "-q"}, {"list", "-route", "orders"},
			{"dead-letters"}, {"poison"}, {"routes"},
			{"resolve", "op_1", "--kind", "happened", "--result-id", "r", "--reason", "x", "--actor", "a"},
			{"replay", "op_1", "--reason", "x", "--actor", "a"},
		} {
			var out bytes.Buffer
			err := run(context.Background(), append([]string{"ops"}, args...), env.get, &out, io.Discard)
			if err != nil {
				t.Fatalf("ops %v: %v", args, err)
			}
			if r, bad := rawControls(out.String()); bad {
				t.Errorf("ops %v printed %U raw for %q:\n%s", args, r, h, out.String())
			}
			if !strings.Contains(out.String(), quoted) && !strings.Contains(out.String(), strings.Trim(mustJSON(h), `"`)) {
				t.Errorf("ops %v does not show %q escaped:\n%s", args, h, out.String())
			}
		}
		err := run(context.Background(), []string{"ops", "show", "op_missing"}, env.get, io.Discard, io.Discard)
		if err == nil {
			t.Fatal("ops show of an unknown id succeeded")
		}
		if r, bad := rawControls(err.Error()); bad {
			t.Errorf("the error holds %U raw: %q", r, err.Error())
		}
	}
}

func mustJSON(s string) string {
	var buf bytes.Buffer
	if err := writeJSON(&buf, s); err != nil {
		panic(err)
	}
	return strings.TrimSpace(buf.String())
}

// Exit statuses as docs/operations.md lists them, for what the command
// line alone decides and for an unknown route.
func TestOpsExitStatuses(t *testing.T) {
	t.Parallel()
	srv := fakeAdmin(t, "x")
	env := gatewayEnv{"GATEWAY_ADMIN_URL": srv.URL, "GATEWAY_ADMIN_TOKEN": "t"}
	noToken := gatewayEnv{"GATEWAY_ADMIN_URL": srv.URL}
	for _, c := range []struct {
		env  gatewayEnv
		args []string
		code int
		what string
	}{
		{env, nil, exitUsage, "no command"},
		{env, []string{"frobnicate"}, exitUsage, "unknown command"},
		{env, []string{"ops"}, exitUsage, "want show"},
		{env, []string{"ops", "frobnicate"}, exitUsage, "unknown subcommand"},
		{env, []string{"ops", "show"}, exitUsage, "exactly one operation id"},
		{env, []string{"ops", "show", "a", "b"}, exitUsage, "exactly one operation id"},
		{env, []string{"ops", "show", "-bogus", "op_1"}, exitUsage, "flag provided but not defined"},
		{env, []string{"ops", "list", "-bogus"}, exitUsage, "flag provided but not defined"},
		{env, []string{"ops", "list", "stray"}, exitUsage, "unexpected argument"},
		{env, []string{"ops", "dead-letters", "stray"}, exitUsage, "unexpected argument"},
		{env, []string{"ops", "poison", "-bogus"}, exitUsage, "flag provided but not defined"},
		{env, []string{"ops", "routes", "stray"}, exitUsage, "unexpected argument"},
		{noToken, []string{"ops", "list", "-bogus"}, exitUsage, "flag provided but not defined"},
		{noToken, []string{"ops", "list"}, 1, "GATEWAY_ADMIN_TOKEN is required"},
		{env, []string{"ops", "list", "-route", "nosuch"}, exitRequest, "no route nosuch"},
		{env, []string{"ops", "dead-letters", "-route", "nosuch"}, exitRequest, "no route nosuch"},
		{env, []string{"ops", "poison", "-route", "nosuch"}, exitRequest, "no route nosuch"},
		{env, []string{"ops", "show", "op_missing"}, exitRequest, "404"},
	} {
		err := run(context.Background(), c.args, c.env.get, io.Discard, io.Discard)
		code := 0
		if err != nil {
			code = 1
			var coded interface{ ExitCode() int }
			if errors.As(err, &coded) {
				code = coded.ExitCode()
			}
		}
		if code != c.code || err == nil || !strings.Contains(err.Error(), c.what) {
			t.Errorf("gateway %v: exit status %d (%v), want %d and %q", c.args, code, err, c.code, c.what)
		}
	}
	// -h prints the flags and is not a failure.
	if err := run(context.Background(), []string{"ops", "list", "-h"}, env.get, io.Discard, io.Discard); err != nil {
		t.Errorf("ops list -h: %v", err)
	}
}

// The exit-status table of docs/operations.md is what scripts are written
// against, so it is read here and held to the constants the code returns:
// a status renumbered in one place and not the other fails.
func TestExitStatusTableIsTheCodes(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "### Exit statuses of `gateway ops`")
	if !ok {
		t.Fatal("docs/operations.md has no exit-status table")
	}
	rows := map[int]string{}
	for line := range strings.Lines(table) {
		if strings.HasPrefix(line, "## ") || strings.HasPrefix(line, "### ") {
			break
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		if n, err := strconv.Atoi(strings.TrimSpace(cells[1])); err == nil {
			rows[n] = cells[2]
		}
	}
	for code, says := range map[int]string{
		0:               "done",
		1:               "GATEWAY_ADMIN_TOKEN",
		exitUsage:       "unknown one",
		exitRefused:     "409",
		exitRequest:     "names no route",
		exitUnavailable: "503",
	} {
		if !strings.Contains(rows[code], says) {
			t.Errorf("docs/operations.md: status %d reads %q, want it to cover %q", code, rows[code], says)
		}
	}
	if len(rows) != 6 {
		t.Errorf("docs/operations.md lists statuses %v, want 0 to 5", rows)
	}
}
