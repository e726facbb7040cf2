package logsetup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"golang.org/x/time/rate"
)

func records(t *testing.T, out string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("not JSON: %q", line)
		}
		recs = append(recs, r)
	}
	return recs
}

func TestFormats(t *testing.T) {
	t.Parallel()
	var js, txt bytes.Buffer
	for _, c := range []struct {
		format string
		w      *bytes.Buffer
	}{{"json", &js}, {"", &js}, {"text", &txt}} {
		l, err := New(c.w, c.format, slog.LevelInfo)
		if err != nil {
			t.Fatal(err)
		}
		l.Info("hello", "route", "orders")
		l.Debug("not at info")
	}
	if recs := records(t, js.String()); len(recs) != 2 || recs[0]["msg"] != "hello" || recs[1]["route"] != "orders" {
		t.Errorf("json and the default: %s", js.String())
	}
	if got := txt.String(); !strings.Contains(got, "level=INFO msg=hello route=orders") || strings.Count(got, "\n") != 1 {
		t.Errorf("text: %q", got)
	}
	if _, err := New(&js, "yaml", slog.LevelInfo); err == nil || !strings.Contains(err.Error(), "json or text") {
		t.Errorf("format yaml: %v", err)
	}
}

// A library that fails in a loop gets its burst of lines, then none until
// the bucket refills; the next line says how many were left out.
func TestLibraryLinesAreLimited(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	l, _ := New(&out, "json", slog.LevelInfo)
	x := newLimited(l, "redis")
	x.limiter.SetLimit(0) // no refill: only the burst
	for range 3 * libraryBurst {
		redisLogger{x}.Printf(context.Background(), "pool: dial %s: %v", "10.0.0.1:6379", errors.New("refused"))
	}
	if recs := records(t, out.String()); len(recs) != libraryBurst {
		t.Fatalf("%d lines out of %d, want the burst of %d:\n%s", len(recs), 3*libraryBurst, libraryBurst, out.String())
	}
	x.limiter.SetLimit(rate.Inf)
	out.Reset()
	x.handler().Handle(context.Background(), slog.NewRecord(testTime, slog.LevelError, "export failed", 0))
	recs := records(t, out.String())
	if len(recs) != 1 || recs[0]["suppressed_since_last_line"] != float64(2*libraryBurst) || recs[0]["source"] != "redis" {
		t.Fatalf("the line after the gap: %s", out.String())
	}
	out.Reset()
	redisLogger{x}.Printf(context.Background(), "%s", strings.Repeat("é", maxLibraryText))
	if recs := records(t, out.String()); len(recs) != 1 || len(recs[0]["msg"].(string)) > maxLibraryText+len("…") {
		t.Fatalf("a long line is not bounded: %d bytes", len(out.String()))
	}
}

// Adopt routes the log package and the OpenTelemetry SDK's errors into the
// logger. It changes process globals, so this test does not run in
// parallel with the others that log through them.
func TestAdoptRoutesLibraries(t *testing.T) {
	var out syncBuffer
	l, _ := New(&out, "json", slog.LevelInfo)
	Adopt(l)
	t.Cleanup(func() {
		d, _ := New(discard{}, "json", slog.LevelInfo)
		Adopt(d)
	})
	log.Printf("a line from the log package")
	otel.Handle(errors.New("traces export: connection refused"))
	recs := records(t, out.String())
	if len(recs) != 2 {
		t.Fatalf("want 2 records:\n%s", out.String())
	}
	if recs[0]["source"] != "log" || recs[0]["msg"] != "a line from the log package" || recs[0]["level"] != "WARN" {
		t.Errorf("log package: %v", recs[0])
	}
	if recs[1]["source"] != "opentelemetry" || recs[1]["level"] != "ERROR" || !strings.Contains(recs[1]["msg"].(string), "export") {
		t.Errorf("opentelemetry: %v", recs[1])
	}
}
