package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ackgate/ackgate/internal/soak"
)

// Bad arguments stop the drill before it starts anything.
func TestFlagsAreChecked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-stages", "patroni,kafka", "-gateway", os.Args[0]}, `unknown stage "kafka"`},
		{[]string{"-gateway", filepath.Join(t.TempDir(), "missing")}, "gateway binary"},
		{[]string{"-gateway", os.Args[0], "stray"}, "unexpected arguments"},
	} {
		err := run(context.Background(), tc.args, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || errors.Is(err, errViolated) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run %q = %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}

// The summary names each event with what it cost, and an event that
// failed says so.
func TestSummaryLine(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e := soak.EventRecord{Name: "patroni switchover", Start: start, End: start.Add(2 * time.Second),
		Nacked: 40, NackedBefore: 38, Recovered: 3500 * time.Millisecond, Unready: []time.Duration{600 * time.Millisecond, 0}}
	got := summaryLine("patroni", e)
	for _, want := range []string{"patroni switchover", "took     2s", "38 nacked, acked again from +3.5s (2 later)", "600ms / 0s"} {
		if !strings.Contains(got, want) {
			t.Errorf("summary %q lacks %q", got, want)
		}
	}
	e.Err, e.Nacked = "no running leader", 0
	if got := summaryLine("patroni", e); !strings.Contains(got, "no delivery nacked") || !strings.Contains(got, "EVENT FAILED: no running leader") {
		t.Errorf("summary of a failed event: %q", got)
	}
}
