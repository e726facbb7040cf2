package charts

// No container engine runs where these tests run, so the image itself is
// never built here. What can be checked without one is checked: the
// Dockerfile's stages and instructions, that its build flags really produce a
// static binary, that the .dockerignore keeps every file that build needs, and
// that the image agrees with the chart (user id, ports, arguments).

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	"helm.sh/helm/v3/pkg/chartutil"
)

const repoRoot = ".."

// instruction is one Dockerfile instruction with its continuation lines joined.
type instruction struct {
	cmd   string   // upper-cased: FROM, RUN, ...
	flags []string // leading --flag=value arguments
	args  string   // the rest
	line  int
}

// stage is the instructions from one FROM to the next.
type stage struct {
	from instruction
	// image is the FROM's image with the global ARGs' defaults put in;
	// imageArg is the ARG it came from, if any.
	image    string
	imageArg string
	name     string
	body     []instruction
}

// parseDockerfile reads instructions the way the Dockerfile frontend does for
// the subset this repository uses: comments and blank lines skipped,
// backslash continuations joined, leading --flags split off. Heredocs are not
// supported and are reported as an error by the tests below (a RUN ending in
// <<EOF would show up as an unknown instruction).
func parseDockerfile(t *testing.T, text string) []stage {
	t.Helper()
	var ins []instruction
	var cur strings.Builder
	start := 0
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cur.Len() > 0 && strings.HasPrefix(line, "#") {
			continue // comment lines inside a continuation are dropped too
		}
		if cur.Len() == 0 {
			start = n
		}
		if body, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(line)
		fields := strings.Fields(cur.String())
		cur.Reset()
		in := instruction{cmd: strings.ToUpper(fields[0]), line: start}
		rest := fields[1:]
		for len(rest) > 0 && strings.HasPrefix(rest[0], "--") {
			in.flags = append(in.flags, rest[0])
			rest = rest[1:]
		}
		in.args = strings.Join(rest, " ")
		ins = append(ins, in)
	}
	if cur.Len() > 0 {
		t.Fatal("Dockerfile ends inside a continuation")
	}
	known := []string{"FROM", "ARG", "WORKDIR", "COPY", "RUN", "ENV", "USER", "EXPOSE", "ENTRYPOINT", "CMD", "LABEL"}
	var stages []stage
	globals := map[string]string{} // ARGs before the first FROM, with their defaults
	for _, in := range ins {
		if !slices.Contains(known, in.cmd) {
			t.Fatalf("line %d: instruction %s is not one this test understands", in.line, in.cmd)
		}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			s := stage{from: in, image: f[0]}
			if m := regexp.MustCompile(`^\$\{?(\w+)\}?$`).FindStringSubmatch(f[0]); m != nil {
				s.imageArg, s.image = m[1], globals[m[1]]
			}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("line %d: %s before the first FROM", in.line, in.cmd)
			}
			name, def, _ := strings.Cut(in.args, "=")
			globals[name] = def
			continue
		}
		stages[len(stages)-1].body = append(stages[len(stages)-1].body, in)
	}
	return stages
}

func readDockerfile(t *testing.T) []stage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	return parseDockerfile(t, string(b))
}

func flag(in instruction, name string) string {
	for _, f := range in.flags {
		if v, ok := strings.CutPrefix(f, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// chartDefaults are the chart's values.yaml, for the checks that the image and
// the chart agree.
func chartDefaults(t *testing.T) chartutil.Values {
	t.Helper()
	v, err := chartutil.ReadValuesFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func intValue(t *testing.T, v chartutil.Values, p string) int {
	t.Helper()
	x, err := v.PathValue(p)
	if err != nil {
		t.Fatalf("values %s: %v", p, err)
	}
	switch n := x.(type) {
	case float64:
		return int(n)
	case int64:
		return int(n)
	case json.Number:
		i, err := n.Int64()
		if err != nil {
			t.Fatal(err)
		}
		return int(i)
	}
	t.Fatalf("values %s is %T", p, x)
	return 0
}

var goBuild = regexp.MustCompile(`\bgo build\b`)

func TestDockerfile(t *testing.T) {
	t.Parallel()
	stages := readDockerfile(t)
	if len(stages) < 2 {
		t.Fatalf("%d stage(s), want a multi-stage build", len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]

	// The builder's Go matches go.mod's language version.
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	if want := "golang:" + string(m[1]); !strings.HasPrefix(build.image, want) {
		t.Errorf("builder image %s, want %s to match go.mod", build.image, want)
	}
	if build.name == "" {
		t.Error("the builder stage has no name for COPY --from")
	}

	// The build: static (no cgo), trimmed paths, no symbol tables, the
	// gateway command.
	var buildRun instruction
	for _, in := range build.body {
		if in.cmd == "RUN" && goBuild.MatchString(in.args) {
			buildRun = in
		}
	}
	if buildRun.cmd == "" {
		t.Fatal("the builder stage has no RUN go build")
	}
	cgoOff := strings.Contains(buildRun.args, "CGO_ENABLED=0")
	for _, in := range build.body {
		if in.cmd == "ENV" && strings.Contains(in.args, "CGO_ENABLED=0") {
			cgoOff = true
		}
	}
	if !cgoOff {
		t.Error("CGO_ENABLED=0 is not set for go build: the binary would need libc, which distroless/static lacks")
	}
	for _, want := range append(staticBuildFlags, "./cmd/gateway") {
		if !strings.Contains(buildRun.args, want) {
			t.Errorf("go build lacks %s: %s", want, buildRun.args)
		}
	}
	out := regexp.MustCompile(`-o\s+(\S+)`).FindStringSubmatch(buildRun.args)
	if out == nil {
		t.Fatal("go build has no -o")
	}

	// The version is a build argument stamped into the binary (what
	// `gateway version` prints, service.version) and into the image's OCI
	// labels; the base images are arguments a release build pins by digest.
	if !slices.ContainsFunc(build.body, func(in instruction) bool { return in.cmd == "ARG" && strings.HasPrefix(in.args, "VERSION") }) {
		t.Error("the builder stage declares no ARG VERSION")
	}
	for _, s := range []stage{build, final} {
		if s.imageArg == "" {
			t.Errorf("FROM %s (line %d) is not a build argument a release build can pin by digest", s.from.args, s.from.line)
		}
	}
	labels := map[string]string{}
	for _, in := range final.body {
		if in.cmd == "LABEL" {
			for _, m := range regexp.MustCompile(`([\w.-]+)="([^"]*)"`).FindAllStringSubmatch(in.args, -1) {
				labels[m[1]] = m[2]
			}
		}
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.title":    "ackgate",
		"org.opencontainers.image.source":   "https://github.com/ackgate/ackgate",
		"org.opencontainers.image.version":  "${VERSION}",
		"org.opencontainers.image.revision": "${REVISION}",
		// The base the image was built on, as passed: with a digest when
		// a release build pinned one, so a scanner knows exactly what it is.
		"org.opencontainers.image.base.name": "${RUNTIME_IMAGE}",
	} {
		if labels[k] != want {
			t.Errorf("LABEL %s=%q, want %q", k, labels[k], want)
		}
	}
	for _, arg := range []string{"VERSION", "REVISION", "RUNTIME_IMAGE"} {
		if !slices.ContainsFunc(final.body, func(in instruction) bool { return in.cmd == "ARG" && strings.HasPrefix(in.args, arg) }) {
			t.Errorf("the final stage declares no ARG %s for its labels", arg)
		}
	}

	// The final stage: distroless static or scratch, the binary only, a
	// numeric non-root user that is the one the chart runs as.
	if !strings.HasPrefix(final.image, "gcr.io/distroless/static") && final.image != "scratch" {
		t.Errorf("final image %s, want distroless/static or scratch", final.image)
	}
	var copies, users, exposes []instruction
	var entrypoint, cmd, godebug string
	for _, in := range final.body {
		switch in.cmd {
		case "ENV":
			if v, ok := strings.CutPrefix(in.args, "GODEBUG="); ok {
				godebug = v
			}
		case "COPY":
			copies = append(copies, in)
		case "USER":
			users = append(users, in)
		case "EXPOSE":
			exposes = append(exposes, in)
		case "ENTRYPOINT":
			entrypoint = in.args
		case "CMD":
			cmd = in.args
		case "RUN":
			t.Errorf("line %d: RUN in the final stage (it has no shell)", in.line)
		}
	}
	if len(copies) != 1 || flag(copies[0], "from") != build.name || copies[0].args != out[1]+" /gateway" {
		t.Errorf("final stage copies %+v, want only %s from %s to /gateway", copies, out[1], build.name)
	}
	if len(users) == 0 {
		t.Fatal("no USER in the final stage")
	}
	user := users[len(users)-1].args
	uid, gid, _ := strings.Cut(user, ":")
	defaults := chartDefaults(t)
	for what, id := range map[string]string{"uid": uid, "gid": gid} {
		n, err := strconv.Atoi(id)
		if err != nil || n == 0 {
			t.Errorf("USER %s: %s %q must be numeric and not 0 (Kubernetes verifies runAsNonRoot only for numeric users)", user, what, id)
		}
	}
	if want := strconv.Itoa(intValue(t, defaults, "podSecurityContext.runAsUser")); uid != want {
		t.Errorf("USER uid %s, the chart runs as %s", uid, want)
	}
	// An image run without the chart gets the chart's runtime settings too.
	if want, err := defaults.PathValue("gateway.godebug"); err != nil || godebug == "" || godebug != want {
		t.Errorf("final stage GODEBUG %q, the chart's gateway.godebug %v (%v)", godebug, want, err)
	}
	var ports []string
	for _, e := range exposes {
		ports = append(ports, strings.Fields(e.args)...)
	}
	for _, p := range []string{"ports.ingest", "ports.admin"} {
		if want := strconv.Itoa(intValue(t, defaults, p)); !slices.Contains(ports, want) {
			t.Errorf("EXPOSE %v lacks the chart's %s %s", ports, p, want)
		}
	}
	var ep, args []string
	if err := json.Unmarshal([]byte(entrypoint), &ep); err != nil || !slices.Equal(ep, []string{"/gateway"}) {
		t.Errorf("ENTRYPOINT %s, want the exec form [\"/gateway\"]", entrypoint)
	}
	if err := json.Unmarshal([]byte(cmd), &args); err != nil || !slices.Equal(args, []string{"serve"}) {
		t.Errorf("CMD %s, want [\"serve\"]", cmd)
	}
}

// staticBuildFlags are the Dockerfile's go build flags that
// TestStaticBuildFlagsMakeAStaticBinary builds with.
var staticBuildFlags = []string{"-trimpath", `-ldflags="-s -w ` + versionFlag + `${VERSION}"`}

// versionFlag stamps the version `gateway version` prints.
const versionFlag = "-X github.com/ackgate/ackgate/telemetry.version="

// TestStaticBuildFlagsMakeAStaticBinary builds cmd/gateway the way the
// Dockerfile does (TestDockerfile checks it still says so) and looks inside
// the result: no ELF interpreter and no shared libraries, so it runs on
// distroless/static; no symbol table.
func TestStaticBuildFlagsMakeAStaticBinary(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "gateway")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w "+versionFlag+"1.2.3-test", "-o", bin, "./cmd/gateway")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary names an ELF interpreter: it is dynamically linked")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("the binary imports shared libraries %v (%v)", libs, err)
	}
	if f.Section(".symtab") != nil {
		t.Error("the binary keeps its symbol table: -s did not apply")
	}
	wd, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(wd+"/")) {
		t.Errorf("the binary contains the build directory %s: -trimpath did not apply", wd)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || strings.TrimSpace(string(out)) != "1.2.3-test" {
		t.Errorf("gateway version printed %q (%v), want the stamped 1.2.3-test", out, err)
	}
}

// TestDockerignoreKeepsBuildInputs: every file `go build ./cmd/gateway`
// reads (Go files of the module's packages, embedded files, go.mod, go.sum)
// is in the build context, and what the image does not need is not.
func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	t.Parallel()
	f, err := os.Open(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	excluded := func(rel string) bool {
		ok, err := pm.MatchesOrParentMatches(filepath.ToSlash(rel))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	list := exec.Command("go", "list", "-deps", "-json=Dir,Module,GoFiles,EmbedFiles", "./cmd/gateway")
	list.Dir = repoRoot
	list.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	needed := []string{"go.mod", "go.sum"}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			Dir                 string
			Module              *struct{ Path string }
			GoFiles, EmbedFiles []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Module == nil || p.Module.Path != "github.com/ackgate/ackgate" {
			continue
		}
		rel, err := filepath.Rel(root, p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range append(p.GoFiles, p.EmbedFiles...) {
			needed = append(needed, filepath.Join(rel, name))
		}
	}
	if len(needed) < 10 {
		t.Fatalf("go list found only %v", needed)
	}
	for _, file := range needed {
		if excluded(file) {
			t.Errorf("%s is needed by the build but .dockerignore excludes it", file)
		}
	}
	for _, file := range []string{".git/HEAD", "bin/gateway", "charts/ackgate/values.yaml", "docs/deploy.md", "README.md", "config/routes_test.go"} {
		if !excluded(file) {
			t.Errorf("%s is sent to the build context, which does not need it", file)
		}
	}
}
