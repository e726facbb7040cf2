package soak

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Every process the soak starts is its own: a redis-server and (for restarts)
// a Postgres cluster that nothing else uses, so killing them disturbs no one
// else on the machine. All of them listen on loopback only.

const startTimeout = 60 * time.Second

// child is a process the soak started and watches.
type child struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
}

func startChild(cmd *exec.Cmd) (*child, error) {
	setParentDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// signal sends sig and waits up to grace for the exit; then it kills.
func (c *child) signal(sig os.Signal, grace time.Duration) {
	if !c.running() {
		return
	}
	_ = c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
		return
	case <-time.After(grace):
	}
	_ = c.cmd.Process.Kill()
	<-c.done
}

// running reports whether the process has not exited yet.
func (c *child) running() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitFor polls ok until it holds, the child exits, or the timeout passes.
func waitFor(ctx context.Context, what string, c *child, ok func() error) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		err := ok()
		if err == nil {
			return nil
		}
		if c != nil && !c.running() {
			return fmt.Errorf("%s exited before it was ready: %v", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %v", what, startTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ------------------------------------------------------------------ Redis --

// redisServer is a private redis-server without persistence: a restart is a
// restart that loses every key, as the gateway must survive.
type redisServer struct {
	bin, dir string
	host     string
	port     int
	log      io.Writer
	proc     *child
}

func startRedis(ctx context.Context, bin, host, dir string, log io.Writer) (*redisServer, error) {
	var lastErr error
	for range 3 { // another process may take the free port first
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		r := &redisServer{bin: bin, dir: dir, host: host, port: port, log: log}
		if lastErr = r.start(ctx); lastErr == nil {
			return r, nil
		}
	}
	return nil, fmt.Errorf("redis-server (%s): %w", bin, lastErr)
}

func (r *redisServer) addr() string { return net.JoinHostPort(r.host, strconv.Itoa(r.port)) }

func (r *redisServer) start(ctx context.Context) error {
	// Protected mode refuses every address but loopback without a
	// password; the drill's private link is such an address.
	cmd := exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", r.host, "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--dir", r.dir)
	cmd.Stdout, cmd.Stderr = r.log, r.log
	p, err := startChild(cmd)
	if err != nil {
		return err
	}
	r.proc = p
	if err := waitFor(ctx, "redis-server", p, func() error { return redisPing(r.addr()) }); err != nil {
		p.signal(syscall.SIGKILL, 0)
		return err
	}
	return nil
}

// restart kills the server (no shutdown save: there is nothing to save) and
// starts an empty one on the same port.
func (r *redisServer) restart(ctx context.Context) error {
	r.proc.signal(syscall.SIGKILL, 0)
	var err error
	for range 20 { // the port can take a moment to be free again
		if err = r.start(ctx); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("redis restart on port %d: %w", r.port, err)
}

func (r *redisServer) stop() {
	if r.proc != nil {
		r.proc.signal(syscall.SIGKILL, 0)
	}
}

func redisPing(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
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

// --------------------------------------------------------------- Postgres --

// pgCluster is a Postgres cluster of the soak's own, in a temporary
// directory, run as a child process so that it can be crashed and restarted
// without touching any other cluster on the machine.
type pgCluster struct {
	binDir string
	root   string // holds data/ and the socket
	host   string
	port   int
	cred   *syscall.Credential
	// log is opened by the soak and inherited, so the server can write it
	// whoever it runs as.
	log  *os.File
	proc *child
}

// pgBinDir finds the directory with initdb and postgres: the one given, or
// pg_config's, or the newest under /usr/lib/postgresql (Debian's layout).
func pgBinDir(given string) (string, error) {
	if given != "" {
		return given, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) < pgVersion(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries (initdb, postgres) found; install postgresql or pass -pg-bin")
}

func pgVersion(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// postgresCredential is who runs the cluster: Postgres refuses to run as
// root, so a root soak runs it as the postgres user.
func postgresCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and there is no postgres user to run a private cluster as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func startPostgres(ctx context.Context, binDir, host string, log *os.File) (*pgCluster, error) {
	cred, err := postgresCredential()
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", "ackgate-soak-pg-")
	if err != nil {
		return nil, err
	}
	p := &pgCluster{binDir: binDir, root: root, host: host, cred: cred, log: log}
	if cred != nil {
		if err := os.Chown(root, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(root)
			return nil, err
		}
	}
	initdb := p.command("initdb", "-D", filepath.Join(root, "data"), "-U", "ackgate", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		p.cleanup()
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	if host != "127.0.0.1" {
		// initdb trusts loopback only; a cluster on another address (the
		// drill's private link) trusts whoever reaches it there.
		f, err := os.OpenFile(filepath.Join(root, "data", "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
		if err == nil {
			_, err = f.WriteString("host all all 0.0.0.0/0 trust\n")
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			p.cleanup()
			return nil, fmt.Errorf("pg_hba.conf: %w", err)
		}
	}
	if p.port, err = freePort(); err != nil {
		p.cleanup()
		return nil, err
	}
	if err := p.start(ctx); err != nil {
		p.cleanup()
		return nil, err
	}
	return p, nil
}

func (p *pgCluster) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(p.binDir, name), args...)
	cmd.Dir = p.root
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C"}
	if p.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	}
	return cmd
}

func (p *pgCluster) start(ctx context.Context) error {
	cmd := p.command("postgres", "-D", filepath.Join(p.root, "data"), "-p", strconv.Itoa(p.port),
		"-c", "listen_addresses="+p.host, "-c", "unix_socket_directories="+p.root,
		"-c", "max_connections=60", "-c", "fsync=on")
	cmd.Stdout, cmd.Stderr = p.log, p.log
	proc, err := startChild(cmd)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	p.proc = proc
	return waitFor(ctx, "postgres", proc, func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		conn, err := pgx.Connect(cctx, p.url("postgres"))
		if err != nil {
			return err
		}
		return conn.Close(cctx)
	})
}

func (p *pgCluster) url(db string) string {
	return fmt.Sprintf("postgres://ackgate@%s/%s?sslmode=disable", net.JoinHostPort(p.host, strconv.Itoa(p.port)), db)
}

// restart is an immediate shutdown (SIGQUIT: no checkpoint, crash recovery
// at the next start, as after a crash) and a start on the same port.
func (p *pgCluster) restart(ctx context.Context) error {
	p.proc.signal(syscall.SIGQUIT, 30*time.Second)
	return p.start(ctx)
}

func (p *pgCluster) cleanup() {
	if p.proc != nil {
		p.proc.signal(syscall.SIGQUIT, 30*time.Second)
	}
	os.RemoveAll(p.root)
}

// createDatabase makes an empty database on a server and returns its URL.
func createDatabase(ctx context.Context, serverURL, name string) (string, error) {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", err
	}
	cfg := conn.Config()
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", cfg.User,
		net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), name), nil
}

// --------------------------------------------------------------- gateways --

// gatewayProc is one `gateway serve` process that the soak kills and starts
// again on the same ports.
type gatewayProc struct {
	name   string
	bin    string
	prefix []string // a command the gateway runs under (ip netns exec NAME)
	env    []string
	listen string
	log    io.Writer
	proc   *child
}

func (g *gatewayProc) start(ctx context.Context) error {
	args := append(append([]string(nil), g.prefix...), g.bin, "serve")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = g.env
	cmd.Stdout, cmd.Stderr = g.log, g.log
	p, err := startChild(cmd)
	if err != nil {
		return fmt.Errorf("%s: %w", g.name, err)
	}
	g.proc = p
	client := &http.Client{Timeout: 2 * time.Second}
	return waitFor(ctx, g.name, p, func() error {
		resp, err := client.Get("http://" + g.listen + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz answered %s", resp.Status)
		}
		return nil
	})
}

// kill is SIGKILL: no shutdown, no bookkeeping, connections cut mid-request.
func (g *gatewayProc) kill() { g.proc.signal(syscall.SIGKILL, 0) }

// stop is the orderly SIGTERM shutdown, so that work after the last answers
// (marking acks as sent) is written before the ledger is read.
func (g *gatewayProc) stop() {
	if g.proc != nil {
		g.proc.signal(syscall.SIGTERM, 30*time.Second)
	}
}

// gatewayEnv is the process's own environment without any GATEWAY_ or OTEL_
// setting of the caller's, plus the soak's.
func gatewayEnv(settings map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GATEWAY_") || strings.HasPrefix(kv, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+settings[k])
	}
	return env
}

func runGateway(ctx context.Context, bin string, env []string, args ...string) error {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("gateway %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}
