package testenv

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cluster is a Postgres server of one test's own: initdb into a temporary
// directory, run as a child process on a free loopback port. It exists for
// tests that stop and start the server under a running gateway, which the
// shared server on 5432 must never be. Trust authentication, role ackgate.
type Cluster struct {
	t      testing.TB
	binDir string
	root   string
	port   int
	cred   *syscall.Credential
	log    *SyncBuffer
	proc   *exec.Cmd
	exited chan struct{}
}

// PrivateCluster initdb's and starts a cluster; it is stopped and removed
// when the test ends. Postgres refuses to run as root, so a root test runs
// it as the postgres user. It fails the test, naming the package to
// install, when no server binaries are found.
func PrivateCluster(t testing.TB) *Cluster {
	t.Helper()
	binDir, err := postgresBinDir()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	c := &Cluster{t: t, binDir: binDir, log: &SyncBuffer{}}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("testenv: running as root, and there is no postgres user to run a private cluster as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// Not t.TempDir: its parent directories are the test's user's only.
	if c.root, err = os.MkdirTemp("", "ackgate-test-pg-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(c.root) })
	if c.cred != nil {
		if err := os.Chown(c.root, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	initdb := c.command("initdb", "-D", filepath.Join(c.root, "data"), "-U", "ackgate", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("testenv: initdb: %v\n%s", err, out)
	}
	if c.port, err = freePort(); err != nil {
		t.Fatal(err)
	}
	c.Start()
	t.Cleanup(c.Stop)
	return c
}

// postgresBinDir finds initdb and postgres: pg_config's directory, or the
// newest under /usr/lib/postgresql (Debian's layout).
func postgresBinDir() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(d string) int { n, _ := strconv.Atoi(filepath.Base(filepath.Dir(d))); return n }
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("no PostgreSQL server binaries (initdb, postgres) found: apt-get install postgresql, or run scripts/services.sh")
}

func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(c.binDir, name), args...)
	cmd.Dir = c.root
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C"}
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	return cmd
}

// Start starts the server on its port and waits until it accepts
// connections.
func (c *Cluster) Start() {
	c.t.Helper()
	cmd := c.command("postgres", "-D", filepath.Join(c.root, "data"), "-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+c.root,
		"-c", "max_connections=40", "-c", "fsync=off")
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("testenv: postgres: %v", err)
	}
	c.proc, c.exited = cmd, make(chan struct{})
	exited := c.exited
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(setupTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			conn.Close(ctx)
			cancel()
			return
		}
		cancel()
		select {
		case <-exited:
			c.t.Fatalf("testenv: postgres exited at start: %v\n%s", err, c.log.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("testenv: postgres not ready after %s: %v\n%s", setupTimeout, err, c.log.String())
		}
	}
}

// Stop is an immediate shutdown (SIGQUIT: every connection cut, crash
// recovery at the next start); it returns once the server has exited.
// Stopping a stopped cluster does nothing.
func (c *Cluster) Stop() {
	if c.proc == nil {
		return
	}
	select {
	case <-c.exited:
	default:
		_ = c.proc.Process.Signal(syscall.SIGQUIT)
		select {
		case <-c.exited:
		case <-time.After(setupTimeout):
			_ = c.proc.Process.Kill()
			<-c.exited
		}
	}
	c.proc = nil
}

// URL is a connection URL for database db.
func (c *Cluster) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.User("ackgate"), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// CreateDatabase makes an empty database and returns its URL.
func (c *Cluster) CreateDatabase(name string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn := connect(ctx, c.t, c.URL("postgres"))
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		c.t.Fatalf("testenv: create database %s: %v", name, err)
	}
	return c.URL(name)
}

// Log is what the server has written so far.
func (c *Cluster) Log() string { return c.log.String() }
