package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	startTimeout = 30 * time.Second
	stopTimeout  = 30 * time.Second
)

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// createDatabase creates an empty database for this run on the server of
// base, and returns its URL and a function that drops it. A database of its
// own keeps the run's transaction counts apart from everything else on the
// server, and its tables from any other run's.
func createDatabase(ctx context.Context, base, name string) (string, func(context.Context) error, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, err
	}
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", nil, fmt.Errorf("postgres at %s: %w (start it with scripts/services.sh)", u.Redacted(), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// The name is ours, a prefix and hex, so quoting it is enough.
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w (the role needs CREATEDB)", name, err)
	}
	drop := func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		// FORCE ends any connection still open, such as a gateway that
		// could not be stopped.
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		return err
	}
	u.Path = "/" + name
	return u.String(), drop, nil
}

// withQuery adds raw query parameters to a database URL.
func withQuery(dbURL, params string) (string, error) {
	if params == "" {
		return dbURL, nil
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", err
	}
	q := u.Query()
	extra, err := url.ParseQuery(params)
	if err != nil {
		return "", err
	}
	for k, vs := range extra {
		q.Del(k)
		for _, v := range vs {
			q.Add(k, v)
		}
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func databaseName(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", err
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" {
		return "", fmt.Errorf("no database name in %s", u.Redacted())
	}
	return name, nil
}

// process is a child process this tool started and must stop.
type process struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // once exited is closed
	log    string
}

func startProcess(name string, cmd *exec.Cmd, logPath string) (*process, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, exited: make(chan struct{}), log: logPath}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop asks the process to end (SIGTERM, so a gateway shuts down as it
// would in a deployment) and kills it if it has not within the timeout.
func (p *process) stop() error {
	if !p.running() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s (pid %d) did not stop within %s and was killed", p.name, p.pid(), stopTimeout)
	}
}

// tail is the end of the process's log, for an error message.
func (p *process) tail() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return ""
	}
	const keep = 2000
	if len(b) > keep {
		b = b[len(b)-keep:]
	}
	return string(b)
}

// freeAddr reserves nothing: it finds a loopback port free right now. A
// process that then fails to bind it is reported, not retried.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startRedis starts a private redis-server on loopback without persistence,
// so that its command counts are the gateway's alone.
func startRedis(ctx context.Context, dir string) (*process, string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "", fmt.Errorf("redis-server not found (install it, or pass -redis-addr): %w", err)
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	p, err := startProcess("redis-server", cmd, filepath.Join(dir, "redis.log"))
	if err != nil {
		return nil, "", err
	}
	err = waitFor(ctx, startTimeout, p, func() error { return redisPing(addr) })
	if err != nil {
		_ = p.stop()
		return nil, "", fmt.Errorf("redis-server on %s: %w\n%s", addr, err, p.tail())
	}
	return p, addr, nil
}

func redisPing(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(conn, "PING\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// waitFor polls ready every 50 ms until it succeeds, the process exits, or
// the timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, p *process, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if p != nil && !p.running() {
			return fmt.Errorf("exited (%v)", p.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// buildGateway builds ./cmd/gateway into dir. The package path is the
// module's, so this works from anywhere inside the repository.
func buildGateway(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "gateway")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/ackgate/ackgate/cmd/gateway")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/gateway: %w (run from the repository, or pass -gateway-bin)\n%s", err, out)
	}
	return bin, nil
}

// routesYAML is the route file of the started gateway: one Pub/Sub route and
// one SNS route, both without authentication (a broker's token or signature
// is not part of what is measured), shape idempotent, calling the in-process
// downstream, whose 201 carries the result id in X-Result-Id.
func routesYAML(downstreamURL string) string {
	const route = `  - name: %s
    broker: %s
    auth: none
    operation_key:
      kind: message_id
    fingerprint:
      version: 1
      data: true
    effect:
      method: POST
      url: %s/effects
      body_mode: raw
      timeout: 5s
      result_id_header: X-Result-Id
    shape: idempotent
    dedupe_window: 24h
`
	return "# Written by cmd/loadgen for one run.\nroutes:\n" +
		fmt.Sprintf(route, "loadgen", "pubsub", downstreamURL) +
		fmt.Sprintf(route, "loadgen-sns", "sns", downstreamURL)
}

// gatewayProcess is a gateway this tool started: migrated, serving, ready.
type gatewayProcess struct {
	*process
	ingest string // base URL
}

// startGateway migrates the database at dbURL and serves from serveURL, the
// same database with the pool parameters (pool_max_conns...) that only the
// serving pool understands: migrate passes the URL's parameters to the
// server, which refuses them.
//
// memoryLimit, when set, is the gateway's GATEWAY_MEMORY_LIMIT; it replaces
// one from this process's environment. extraRoutes are added to the routes
// file (the handoff phase's gateway has its handoff route there).
func startGateway(ctx context.Context, bin, dir, dbURL, serveURL, redisAddr, downstreamURL, logLevel, memoryLimit, extraRoutes string) (*gatewayProcess, error) {
	routes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routes, []byte(routesYAML(downstreamURL)+extraRoutes), 0o600); err != nil {
		return nil, err
	}
	ingest, err := freeAddr()
	if err != nil {
		return nil, err
	}
	admin, err := freeAddr()
	if err != nil {
		return nil, err
	}
	env := append(withImageGodebug(os.Environ()),
		"GATEWAY_REDIS_URL=redis://"+redisAddr+"/0",
		"GATEWAY_ROUTES_FILE="+routes,
		"GATEWAY_LISTEN_ADDR="+ingest,
		"GATEWAY_ADMIN_ADDR="+admin,
		"GATEWAY_ADMIN_TOKEN=loadgen-"+randomHex(12),
		"GATEWAY_INSTANCE_ID=loadgen",
		"GATEWAY_LOG_LEVEL="+logLevel,
		// The background work (lane count, purge) runs once at start and
		// then not again for the run: its queries would be counted as the
		// deliveries' and would reopen connections the phases end.
		"GATEWAY_LANES_REFRESH=1h",
		"GATEWAY_PURGE_INTERVAL=24h",
	)
	if memoryLimit != "" {
		// exec keeps the last of two values of one variable.
		env = append(env, "GATEWAY_MEMORY_LIMIT="+memoryLimit)
	}
	mig := exec.CommandContext(ctx, bin, "migrate")
	mig.Env = append(env, "GATEWAY_DATABASE_URL="+dbURL)
	if out, err := mig.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("gateway migrate: %w\n%s", err, out)
	}
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(env, "GATEWAY_DATABASE_URL="+serveURL)
	p, err := startProcess("gateway", cmd, filepath.Join(dir, "gateway.log"))
	if err != nil {
		return nil, err
	}
	g := &gatewayProcess{process: p, ingest: "http://" + ingest}
	err = waitFor(ctx, startTimeout, p, func() error {
		resp, err := probe.Get(g.ingest + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
	if err != nil {
		_ = p.stop()
		return nil, fmt.Errorf("gateway on %s: %w\n%s", ingest, err, p.tail())
	}
	return g, nil
}

func pidString(pid int) string {
	if pid <= 0 {
		return "-"
	}
	return strconv.Itoa(pid)
}

// probe asks /readyz; a gateway that does not answer within its timeout is
// not ready, rather than a wait without end.
var probe = &http.Client{Timeout: 2 * time.Second}

// imageGodebug is the GODEBUG the gateway's image and chart set
// (Dockerfile, charts/ackgate/values.yaml gateway.godebug), so that a run
// measures the gateway, and the forwarder beside it, as deployed.
const imageGodebug = "adaptivestackstart=0"

// withImageGodebug is env with GODEBUG=imageGodebug added, unless env sets
// GODEBUG already, as a deployment's own replaces the image's.
func withImageGodebug(env []string) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, "GODEBUG=") {
			return env
		}
	}
	return append(slices.Clip(env), "GODEBUG="+imageGodebug)
}

// godebugOf is the GODEBUG a process started with env runs under.
func godebugOf(env []string) string {
	for _, kv := range slices.Backward(env) {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			return v
		}
	}
	return ""
}
