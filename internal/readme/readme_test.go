// Package readme holds no code. Its test runs the README's shell blocks, in
// order, against the stack `make run` starts (the example downstream and a
// gateway serving examples/routes.yaml, on a fresh database and a Redis of
// its own), so that a command in the README that stops working fails the
// suite instead of the next new user.
package readme

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ackgate/ackgate/internal/testenv"
)

// block is one fenced shell block of the README and the section it is in.
type block struct {
	section string
	text    string
}

var fence = regexp.MustCompile("(?ms)^```([a-z]*)\n(.*?)^```\n")

// shellBlocks returns the README's ```sh blocks in order.
func shellBlocks(readme string) []block {
	var out []block
	for _, m := range fence.FindAllStringSubmatchIndex(readme, -1) {
		if readme[m[2]:m[3]] != "sh" {
			continue
		}
		before := readme[:m[0]]
		section := ""
		if i := strings.LastIndex(before, "\n## "); i >= 0 {
			section = strings.TrimSpace(strings.SplitN(before[i+4:], "\n", 2)[0])
		}
		out = append(out, block{section: section, text: readme[m[4]:m[5]]})
	}
	return out
}

// expectation is what one runnable block must print: match identifies the
// block (it must appear in it), want are strings its output must hold.
type expectation struct {
	match string
	want  []string
}

// The README's runnable blocks, in order. A block added, removed or moved
// without an entry here fails the test.
var expectations = []expectation{
	{`"messageId": "demo-1"`, []string{"HTTP/1.1 204 No Content"}},
	{"curl -s localhost:9090/effects\n", []string{`"effects":1,`, `"repeats":0`}},
	{"export GATEWAY_ADMIN_URL", []string{"demo-1", "effect_confirmed", "effect evidence is result", "attempts:"}},
	{"v1/operations?message_id=demo-1", []string{`"key":"demo-1"`}},
	{"eyJvcmRlciI6IDk5fQ==", []string{"HTTP/1.1 503 Service Unavailable", "conflicting"}},
	{"orders-local", []string{"HTTP/1.1 204 No Content", "(1 row)"}},
	{"/metrics", []string{"ackgate_downstream_duration_seconds_bucket{", `le="0.05"`}},
	{"localhost:9090/faults\n", []string{`"fail_rate":0`, `"drop_rate":0`}},
	{"-state effect_indeterminate", []string{"HTTP/1.1 503 Service Unavailable", "effect_indeterminate", "unsafe-1"}},
	{`key=$(`, []string{`"key":"ik_`, `"repeats":0`}},
	{"--kind happened", []string{": recorded", "effect_confirmed", "confirmed by operator api:admin"}},
	{`"messageId": "unsafe-1"`, []string{"HTTP/1.1 204 No Content"}},
	{"refunds", []string{"HTTP/1.1 204 No Content", "sent, no answer", "lookup found the effect"}},
	{"faults?fail=422", []string{`"fail_status":422`, "HTTP/1.1 204 No Content", "terminal_failure", "status 422 is terminal"}},
	{"ops replay", []string{"One attempt is granted", "HTTP/1.1 204 No Content", "replay by api:admin", "effect evidence is result"}},
	{"eyJhbW91bnQiOiA1fQ==", []string{"HTTP/1.1 204 No Content", "pay-msg-2", "no usable identity"}},
	{"faults?fail=503", []string{"HTTP/1.1 204 No Content", "Effect evidence pending"}},
	{"seq 60", []string{"the relay then delivered it"}},
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// The Quickstart sets a fresh machine up in exactly two commands: one runs
// the gateway with its example routes and downstream, one runs every test.
func TestQuickstartIsTwoCommands(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	for _, b := range shellBlocks(string(raw)) {
		if b.section != "Quickstart" {
			continue
		}
		for _, line := range strings.Split(b.text, "\n") {
			if cmd, _, _ := strings.Cut(line, "#"); strings.TrimSpace(cmd) != "" {
				cmds = append(cmds, strings.TrimSpace(cmd))
			}
		}
	}
	if strings.Join(cmds, "; ") != "make run; make test" {
		t.Fatalf("Quickstart commands %q, want exactly make run and make test", cmds)
	}
}

// stack is what `make run` starts, on addresses of the test's own.
type stack struct {
	dir                 string
	ingest, admin, down string
	dbURL, token        string
}

// startStack builds the binaries and does what the Makefile's run target
// does: migrate, apply examples/local.sql with psql, start the example
// downstream, then the gateway with examples/routes.yaml and the
// development admin token.
func startStack(t *testing.T, root string) *stack {
	t.Helper()
	s := &stack{dir: t.TempDir(), ingest: freeAddr(t), admin: freeAddr(t), down: freeAddr(t), dbURL: testenv.DatabaseURL(t)}
	redisAddr := testenv.Redis(t)
	build := exec.Command("go", "build", "-o", filepath.Join(s.dir, "bin")+"/", "./cmd/gateway", "./cmd/exampledownstream")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	// The token make run gives the gateway, from the Makefile itself.
	cliEnv := exec.Command("make", "-s", "--no-print-directory", "cli-env")
	cliEnv.Dir = root
	cliEnv.Env = append(os.Environ(), "GATEWAY_ADMIN_ADDR=")
	out, err := cliEnv.Output()
	if err != nil {
		t.Fatalf("make cli-env: %v", err)
	}
	m := regexp.MustCompile(`GATEWAY_ADMIN_TOKEN=(\S+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("make cli-env printed %q", out)
	}
	s.token = string(m[1])

	examples := filepath.Join(s.dir, "examples")
	if err := os.MkdirAll(examples, 0o755); err != nil {
		t.Fatal(err)
	}
	routes, err := os.ReadFile(filepath.Join(root, "examples", "routes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(routes), "127.0.0.1:9090") {
		t.Fatal("examples/routes.yaml no longer calls the example downstream on 127.0.0.1:9090")
	}
	routes = []byte(strings.ReplaceAll(string(routes), "127.0.0.1:9090", s.down))
	if err := os.WriteFile(filepath.Join(examples, "routes.yaml"), routes, 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + s.dir,
		"GATEWAY_DATABASE_URL=" + s.dbURL, "GATEWAY_REDIS_URL=redis://" + redisAddr + "/0",
		"GATEWAY_ROUTES_FILE=examples/routes.yaml", "GATEWAY_LISTEN_ADDR=" + s.ingest, "GATEWAY_ADMIN_ADDR=" + s.admin,
		"GATEWAY_ADMIN_TOKEN=" + s.token, "EXAMPLEDOWNSTREAM_ADDR=" + s.down,
	}
	runIn := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = s.dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	runIn("bin/gateway", "migrate")
	runIn("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", s.dbURL, "-f", filepath.Join(root, "examples", "local.sql"))

	start := func(name string, args ...string) *testenv.SyncBuffer {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = s.dir, env
		logs := &testenv.SyncBuffer{}
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("%s logs:\n%s", name, logs.String())
			}
		})
		return logs
	}
	start("bin/exampledownstream")
	waitFor(t, "http://"+s.down+"/readyz")
	start("bin/gateway", "serve")
	waitFor(t, "http://"+s.ingest+"/readyz")
	return s
}

func waitFor(t *testing.T, url string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, func() string { return url + " never answered 200" })
}

// rewrite points a block at the test's stack instead of make run's fixed
// addresses and database.
func (s *stack) rewrite(text string) string {
	return strings.NewReplacer(
		"localhost:8080", s.ingest,
		"localhost:8081", s.admin, "127.0.0.1:8081", s.admin,
		"localhost:9090", s.down,
		"postgres://ackgate:ackgate@127.0.0.1:5432/ackgate", s.dbURL,
	).Replace(text)
}

const doneMarker = "__readme_block_done__"

// TestReadmeCommands runs every shell block of the README outside the
// Quickstart, in order, in one bash session (so that what one block exports
// or assigns the next can use), and fails on any command's non-zero exit or
// output that lacks what the expectations say the block shows.
func TestReadmeCommands(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	var blocks []block
	for _, b := range shellBlocks(readme) {
		if b.section != "Quickstart" {
			blocks = append(blocks, b)
		}
	}
	if len(blocks) != len(expectations) {
		t.Fatalf("the README has %d shell blocks to run, the test expects %d: update expectations", len(blocks), len(expectations))
	}
	for i, b := range blocks {
		if !strings.Contains(b.text, expectations[i].match) {
			t.Fatalf("block %d (in %q) does not contain %q; blocks and expectations are out of step:\n%s", i+1, b.section, expectations[i].match, b.text)
		}
	}
	for _, fixed := range []string{"localhost:8080", "localhost:8081", "localhost:9090", "127.0.0.1:8081", "postgres://ackgate:ackgate@127.0.0.1:5432/ackgate"} {
		if !strings.Contains(readme, fixed) {
			t.Errorf("the README no longer uses %s; rewrite() would leave a block pointing elsewhere", fixed)
		}
	}
	// The export line make run prints is the one the README has.
	cliEnv := exec.Command("make", "-s", "--no-print-directory", "cli-env")
	cliEnv.Dir = root
	cliEnv.Env = append(os.Environ(), "GATEWAY_ADMIN_ADDR=")
	line, err := cliEnv.Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(readme, strings.TrimSpace(string(line))) {
		t.Fatalf("the README does not show the line make run prints: %s", line)
	}

	s := startStack(t, root)
	sh := exec.Command("bash", "--noprofile", "--norc", "-e", "-o", "pipefail")
	sh.Dir = s.dir
	// Nothing of the test's environment but a path: what a block needs, it
	// (or a block before it) sets.
	sh.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + s.dir, "LC_ALL=C.UTF-8"}
	stdin, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	sh.Stdout, sh.Stderr = pw, pw
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { err := sh.Wait(); pw.CloseWithError(io.EOF); exited <- err }()
	t.Cleanup(func() {
		stdin.Close()
		_ = sh.Process.Kill()
		<-exited
	})
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()

	for i, b := range blocks {
		file := filepath.Join(s.dir, fmt.Sprintf("block-%02d.sh", i+1))
		if err := os.WriteFile(file, []byte(s.rewrite(b.text)), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Fprintf(stdin, "source %s </dev/null\necho %s\n", file, doneMarker); err != nil {
			t.Fatalf("block %d: the shell is gone: %v", i+1, err)
		}
		out, ok := readUntil(lines, doneMarker, 3*time.Minute)
		if !ok {
			t.Fatalf("block %d (in %q) failed or did not finish:\n%s\noutput:\n%s", i+1, b.section, b.text, out)
		}
		for _, want := range expectations[i].want {
			if !strings.Contains(out, want) {
				t.Errorf("block %d (in %q) printed no %q:\n%s\noutput:\n%s", i+1, b.section, want, b.text, out)
			}
		}
		if strings.Contains(out, "gateway: ") {
			t.Errorf("block %d (in %q) printed an error of gateway:\n%s", i+1, b.section, out)
		}
	}
}

// readUntil collects lines up to the marker; false when the shell ended
// (a command failed under -e) or the bound passed first.
func readUntil(lines <-chan string, marker string, bound time.Duration) (string, bool) {
	var out strings.Builder
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return out.String(), false
			}
			if l == marker {
				return out.String(), true
			}
			out.WriteString(l + "\n")
		case <-timer.C:
			return out.String() + "\n(no end after " + bound.String() + ")", false
		}
	}
}
