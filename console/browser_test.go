package console_test

import (
	"bytes"
	"context"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ackgate/ackgate/gate"
)

// findChromium returns the browser the end-to-end test drives. It fails,
// never skips: a green run must mean a real browser clicked through.
func findChromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("ACKGATE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome-stable", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium found on PATH (nor ACKGATE_CHROMIUM): run scripts/chromium.sh, which `make test` runs, to install Debian's chromium")
	return ""
}

// screenshotDir is where the test leaves its pictures: the directory
// ACKGATE_CONSOLE_SCREENSHOTS names (`make console-screenshots` points it at
// docs/console, the pictures docs/console.md shows), or a temporary one, so
// that an ordinary test run does not rewrite tracked files.
func screenshotDir(t *testing.T) string {
	if d := os.Getenv("ACKGATE_CONSOLE_SCREENSHOTS"); d != "" {
		return d
	}
	return t.TempDir()
}

// The viewport an operator's laptop browser gives a page: what must be
// readable without scrolling is checked against it.
const viewW, viewH = 1280, 900

func saveScreenshot(t *testing.T, dir, name string, buf []byte) {
	t.Helper()
	cfg, err := png.DecodeConfig(bytes.NewReader(buf))
	if err != nil || cfg.Width != viewW || cfg.Height != viewH {
		t.Fatalf("screenshot %s: %v, %dx%d", name, err, cfg.Width, cfg.Height)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

// An operator in a real browser logs in, reads an operation's evidence card,
// works the indeterminate lane and settles an operation from it; the ledger
// records the intervention under the operator's name.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	bin := findChromium(t)
	e := newEnv(t, map[string]string{"GATEWAY_CONSOLE_ALLOW_HTTP": "true"})
	okID := e.confirmed("order-1001")
	lost := e.indeterminate("charge-2001")
	second := e.indeterminate("charge-2002")
	// A third one abandoned, for the terminal lane and its dead letter.
	abandoned := e.indeterminate("charge-2003")
	if _, _, err := e.gw.Gate.Resolve(context.Background(), abandoned, gate.Resolution{
		Kind: gate.ResolveAbandon, Reason: "provider cannot tell after 30 days", Actor: "test:setup"}); err != nil {
		t.Fatal(err)
	}
	ok := e.record(okID)
	shipment := e.handedOff("ship-3001")
	parcel := e.handedOff("ship-3002")
	const email = "ana@example.com"
	refund, status := e.push("refunds", "refund-4001", `{"amount": 990}`, map[string]string{"customer_email": email})
	if status != http.StatusNoContent {
		t.Fatalf("refund: %d", status)
	}
	e.pushPoison("refunds", "refund-no-customer")

	// A bound on the whole walk (the browser lives as long as this
	// context), so a stuck browser fails the test with its own message
	// instead of hanging the suite; not a speed check.
	bound, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	alloc, cancel := chromedp.NewExecAllocator(bound, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(viewW, viewH))...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	get := func(a chromedp.Action[string]) string {
		t.Helper()
		v, err := chromedp.Run(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	text := func(sel string) string { t.Helper(); return get(chromedp.Text(chromedp.CSS(sel))) }
	attr := func(sel, name string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(sel), name))
		if err != nil {
			t.Fatal(err)
		}
		return v.Value
	}
	shots := screenshotDir(t)
	screenshot := func(name string) {
		t.Helper()
		buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatal(err)
		}
		saveScreenshot(t, shots, name, buf)
	}
	base := e.admin.URL

	// Log in: the console sends a browser without a session to the form.
	do("open", chromedp.EmulateViewport(viewW, viewH), chromedp.Navigate(base+"/console/lanes"),
		chromedp.WaitVisible(chromedp.ID("login")))
	if loc := get(chromedp.Location()); !strings.HasSuffix(loc, "/console/login") {
		t.Fatalf("without a session the console showed %s", loc)
	}
	do("log in",
		chromedp.SendKeys(chromedp.ID("token"), tokenOf("alice")),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.ID("entries")),
	)

	// The indeterminate lane, oldest first, with the route's counts.
	do("lanes", chromedp.Navigate(base+"/console/lanes?state=effect_indeterminate"), chromedp.WaitVisible(chromedp.ID("entries")))
	entries := text("#entries")
	if !strings.Contains(entries, lost) || strings.Contains(entries, abandoned) || strings.Index(entries, lost) > strings.Index(entries, second) {
		t.Fatalf("indeterminate lane (want %s before %s, without %s):\n%s", lost, second, abandoned, entries)
	}
	if n := strings.TrimSpace(text(`td[data-route="payments"][data-lane="effect_indeterminate"]`)); n != "2" {
		t.Fatalf("payments' indeterminate count = %q, want 2", n)
	}
	screenshot("lanes.png")

	do("terminal lane", chromedp.Navigate(base+"/console/lanes?state=terminal_failure"), chromedp.WaitVisible(chromedp.ID("entries")))
	if terminal := text("#entries"); !strings.Contains(terminal, abandoned) || !strings.Contains(terminal, "dead-lettered") {
		t.Fatalf("terminal lane:\n%s", terminal)
	}

	// The evidence card of a confirmed operation: every node, with its ids.
	do("confirmed operation", chromedp.Navigate(base+"/console/operations/"+okID), chromedp.WaitVisible(chromedp.ID("card")))
	op := ok.Operation
	want := map[string][]string{
		"deliveries":  {"order-1001", "ack"},
		"intent":      {op.ID, op.Fingerprint, op.ContractVersion},
		"reservation": {"fence " + strconv.FormatInt(op.Fence, 10)},
		"attempts":    {op.IdempotencyKey, "confirmed", "HTTP 201"},
		"evidence":    {op.ResultID},
		"committed":   {"acknowledged"},
		"ack":         {"written to broker"},
	}
	for _, k := range []string{"deliveries", "intent", "reservation", "attempts", "evidence", "committed", "ack"} {
		sel := `[data-node="` + k + `"]`
		if cls := attr(sel, "class"); !strings.Contains(cls, "done") {
			t.Errorf("node %s is %q, want done", k, cls)
		}
		got := text(sel)
		for _, w := range want[k] {
			if w == "" || !strings.Contains(got, w) {
				t.Errorf("node %s lacks %q:\n%s", k, w, got)
			}
		}
	}
	if st := strings.TrimSpace(text("#statement")); st != gate.Statement(&op) {
		t.Errorf("statement %q, want %q", st, gate.Statement(&op))
	}
	if href := attr("#trace", "href"); op.TraceID == "" || href != strings.ReplaceAll(traceURL, "{trace_id}", op.TraceID) {
		t.Errorf("trace link %q for trace %q", href, op.TraceID)
	}
	if t.Failed() {
		t.FailNow()
	}

	// The indeterminate operation: the answer and the form first, without
	// scrolling, then its branch; the attempt whose outcome is unknown is
	// amber, not green.
	do("indeterminate operation", chromedp.Navigate(base+"/console/operations/"+lost), chromedp.WaitVisible(chromedp.ID("resolve")))
	for _, sel := range []string{"#statement", "#resolve-submit", "#card"} {
		box, err := chromedp.Run(ctx, chromedp.Dimensions(chromedp.CSS(sel)))
		if err != nil {
			t.Fatal(err)
		}
		if top := box.Border[1]; top < 0 || top >= viewH-40 {
			t.Errorf("%s starts at y=%.0f: below the fold of a %dx%d window", sel, top, viewW, viewH)
		}
	}
	if branch := text(`[data-node="indeterminate"]`); !strings.Contains(branch, "blocked") {
		t.Fatalf("indeterminate branch:\n%s", branch)
	}
	if cls := attr(`[data-node="attempts"]`, "class"); !strings.Contains(cls, "warn") {
		t.Fatalf("attempts node of an unknown outcome is %q, want warn", cls)
	}
	if d := text(`[data-edge="indeterminate"]`); d == "" {
		t.Fatal("the edge into the indeterminate branch shows no duration")
	}
	screenshot("operation.png")

	do("resolve",
		chromedp.Click(chromedp.ID("kind-happened")),
		chromedp.SendKeys(chromedp.ID("result-id"), "prov-991"),
		chromedp.SendKeys(chromedp.ID("reason"), "provider dashboard shows charge prov-991"),
		chromedp.Click(chromedp.ID("resolve-submit")),
		chromedp.WaitVisible(chromedp.ID("done")),
	)
	if iv := text("#interventions"); !strings.Contains(iv, "console:alice") || !strings.Contains(iv, "prov-991") {
		t.Fatalf("interventions on the page:\n%s", iv)
	}

	// The ledger changed: the state, and an interventions row naming who
	// did it and why.
	rec := e.record(lost)
	if rec.Operation.State != gate.StateEffectConfirmed || rec.Operation.ResultID != "prov-991" {
		t.Fatalf("after the resolution: %s, result %q", rec.Operation.State, rec.Operation.ResultID)
	}
	var actor, kind, reason, resultID string
	var n int
	err := e.gw.Pool.QueryRow(context.Background(), `SELECT count(*) OVER (), actor, kind, reason, result_id
		FROM interventions WHERE operation_id = $1`, lost).Scan(&n, &actor, &kind, &reason, &resultID)
	if err != nil || n != 1 || actor != "console:alice" || kind != "happened" || resultID != "prov-991" ||
		reason != "provider dashboard shows charge prov-991" {
		t.Fatalf("interventions: %v: %d %q %q %q %q", err, n, actor, kind, reason, resultID)
	}

	// The outbox: an entry made due now from its row, recorded under the
	// operator's name.
	// A second entry cancelled beforehand, to show how an ended one is listed.
	if _, _, err := e.gw.Gate.Resolve(context.Background(), parcel, gate.Resolution{
		Kind: gate.ResolveCancel, Reason: "parcel recalled", Actor: "test:setup"}); err != nil {
		t.Fatal(err)
	}
	row := `tr[data-op="` + shipment + `"]`
	do("outbox", chromedp.Navigate(base+"/console/outbox"), chromedp.WaitVisible(chromedp.CSS(row)))
	screenshot("outbox.png")
	do("retry now",
		chromedp.SendKeys(chromedp.CSS(row+` input[name="reason"]`), "carrier API answers again"),
		chromedp.Click(chromedp.CSS(row+` button:first-of-type`)),
		chromedp.WaitVisible(chromedp.ID("done")),
	)
	err = e.gw.Pool.QueryRow(context.Background(), `SELECT count(*) OVER (), actor, kind, reason
		FROM interventions WHERE operation_id = $1`, shipment).Scan(&n, &actor, &kind, &reason)
	if err != nil || n != 1 || actor != "console:alice" || kind != "retry_now" || reason != "carrier API answers again" {
		t.Fatalf("outbox retry: %v: %d %q %q %q", err, n, actor, kind, reason)
	}

	// Search by a private key, typed in clear from the header's box.
	do("search",
		chromedp.SendKeys(chromedp.CSS(`form.quick input[name="q"]`), email+"\n"),
		chromedp.WaitVisible(chromedp.ID("results")),
	)
	if got := text("#results"); !strings.Contains(got, refund) {
		t.Fatalf("search by key %s:\n%s", email, got)
	}
	screenshot("search.png")

	do("poison", chromedp.Navigate(base+"/console/poison"), chromedp.WaitVisible(chromedp.ID("entries")))
	if got := text("#entries"); !strings.Contains(got, "refund-no-customer") {
		t.Fatalf("poison page:\n%s", got)
	}
	screenshot("poison.png")

	do("routes", chromedp.Navigate(base+"/console/routes"), chromedp.WaitVisible(chromedp.ID("contracts")))
	if got := text(`td[data-route="payments"][data-field="dedupe_window"]`); !strings.Contains(got, "not used by this shape") || strings.Contains(got, `"`) {
		t.Fatalf("payments' dedupe window row: %q", got)
	}
	screenshot("routes.png")
}
