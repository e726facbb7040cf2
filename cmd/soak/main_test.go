package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/internal/testenv"
)

// asMain makes the test binary act as the soak command itself, so a test can
// observe the real exit status without building another binary.
const asMain = "ACKGATE_SOAK_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMain) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func buildGateway(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gateway")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/ackgate/ackgate/cmd/gateway").CombinedOutput()
	if err != nil {
		t.Fatalf("build gateway: %v\n%s", err, out)
	}
	return bin
}

// brokenRunArgs is a small run with no fault but the breakage: whatever the
// checker reports comes from the lying downstream alone.
func brokenRunArgs(t *testing.T, gateway, breakage string) []string {
	return []string{
		"-short", "-gateway", gateway, "-postgres", testenv.DatabaseURL(t), "-workdir", t.TempDir(),
		"-messages", "30", "-rate", "100", "-kills", "0", "-redis-restarts", "0",
		"-fail-rate", "0", "-lose-rate", "0", "-slow-rate", "0", "-lookup-down-rate", "0",
		"-poison-rate", "0", "-reuse-rate", "0", "-duplicate-rate", "0", "-redeliver-rate", "0",
		"-break", breakage,
	}
}

// invariant reads one invariant's count from the printed report.
func invariant(t *testing.T, report, name string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(name) + `\s+(\d+)$`).FindStringSubmatch(report)
	if m == nil {
		t.Fatalf("report has no line for %q:\n%s", name, report)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// A downstream that applies every effect twice must fail the soak: the
// command prints the double effects and exits 1.
func TestSoakExitsNonZeroWhenEffectsAreDoubled(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], brokenRunArgs(t, buildGateway(t), "double-apply")...)
	cmd.Env = append(os.Environ(), asMain+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("soak with a double-applying downstream ended with %v, want exit status 1\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	report := stdout.String()
	if n := invariant(t, report, "keys with two effects"); n != 30 {
		t.Fatalf("keys with two effects = %d, want all 30:\n%s", n, report)
	}
	// The local route's five messages (one in six routes) each left a
	// second row that no evidence names.
	if n := invariant(t, report, "local rows without evidence"); n != 5 {
		t.Fatalf("local rows without evidence = %d, want 5:\n%s", n, report)
	}
	if !bytes.Contains(stdout.Bytes(), []byte("FAIL")) || !bytes.Contains(stderr.Bytes(), []byte("invariants violated")) {
		t.Fatalf("no FAIL verdict:\nstdout:\n%s\nstderr:\n%s", report, stderr.String())
	}
}

// A downstream that answers success without applying anything: every ack is
// an ack without an effect.
func TestSoakFailsWhenTheDownstreamLies(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), brokenRunArgs(t, buildGateway(t), "lie"), &stdout, &stderr)
	if !errors.Is(err, errViolated) {
		t.Fatalf("run = %v, want %v\nstdout:\n%s\nstderr:\n%s", err, errViolated, stdout.String(), stderr.String())
	}
	report := stdout.String()
	if n := invariant(t, report, "acks without an effect"); n != 30 {
		t.Fatalf("acks without an effect = %d, want all 30:\n%s", n, report)
	}
	if n := invariant(t, report, "keys with two effects"); n != 0 {
		t.Fatalf("keys with two effects = %d from a downstream that applies nothing", n)
	}
}

func TestFlagsAreChecked(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-break", "sometimes"},
		{"-broker", "kafka", "-gateway", os.Args[0]},
		{"-broker", "emulator", "-max-delivery-attempts", "3", "-gateway", os.Args[0]},
		{"-messages", "0", "-gateway", os.Args[0]},
		{"-gateway", filepath.Join(t.TempDir(), "missing")},
		{"-postgres", testenv.DefaultDatabaseURL, "-gateway", os.Args[0]},
		{"stray"},
	} {
		if err := run(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || errors.Is(err, errViolated) {
			t.Errorf("run %q = %v, want a usage error", args, err)
		}
	}
}

func TestShortPicksTheShortDefaults(t *testing.T) {
	t.Parallel()
	for args, want := range map[string]bool{
		"-short": true, "--short": true, "-short=true": true, "-short=false": false,
		"-messages 5": false, "-- -short": false, "-shortish": false,
	} {
		if got := wantsShort(strings.Fields(args)); got != want {
			t.Errorf("wantsShort(%q) = %v, want %v", args, got, want)
		}
	}
}
