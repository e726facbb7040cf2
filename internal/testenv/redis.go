package testenv

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

const redisStartTimeout = 10 * time.Second

// Redis starts a redis-server of this test's own on a free loopback port and
// returns its address. A private server, rather than a shared one with key
// prefixes, is what lets a test FLUSHALL to simulate losing Redis, or count
// commands with MONITOR, without disturbing its neighbours. Nothing is
// persisted, so a FLUSHALL is as good as a restart without persistence.
func Redis(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		bin = "/usr/bin/redis-server"
	}
	// Another process may take the port between our probe and redis-server's
	// bind; a couple of fresh ports make that race harmless.
	var lastErr error
	for range 3 {
		addr, err := startRedis(t, bin)
		if err == nil {
			return addr
		}
		lastErr = err
	}
	t.Fatalf("testenv: cannot start redis-server (%s): %v\n"+
		"Install it (apt-get install redis-server) or run scripts/services.sh / `make test`.", bin, lastErr)
	return ""
}

func startRedis(t testing.TB, bin string) (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	out := &SyncBuffer{}
	cmd := exec.Command(bin,
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", t.TempDir(),
	)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	deadline := time.Now().Add(redisStartTimeout)
	for {
		if err := ping(addr); err == nil {
			break
		}
		select {
		case err := <-exited:
			return "", fmt.Errorf("redis-server exited (%v): %s", err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return "", fmt.Errorf("no PING answer on %s within %s: %s", addr, redisStartTimeout, out.String())
		}
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return addr, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func ping(addr string) error {
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

// CountRedisCommands watches addr with MONITOR and returns a function that
// reports how many top-level commands the server has executed since the watch
// began. Commands a Lua script runs inside itself are not counted: a script
// call is one round trip however much it does. Nor is a new connection's
// handshake (HELLO, CLIENT, AUTH, SELECT): whether the client's pool had a
// connection free is timing, not the work measured, as a Postgres
// connection's set-up is left out of the ledger's budget.
//
// Each call of the returned function first sends a marker through a separate
// connection and waits until MONITOR shows it. Redis executes commands one at a
// time and MONITOR reports them in that order, so every command completed before
// the call has been counted when it returns: no sleeping, no flakiness. The
// markers themselves are not counted. The function is for one goroutine.
func CountRedisCommands(t testing.TB, addr string) func() int {
	t.Helper()
	mon, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("testenv: monitor %s: %v", addr, err)
	}
	monR := bufio.NewReader(mon)
	if _, err := mon.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatalf("testenv: MONITOR: %v", err)
	}
	// Once +OK is back the server feeds us every later command.
	if line, err := monR.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("testenv: MONITOR answered %q, %v", line, err)
	}
	marker, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("testenv: monitor marker connection: %v", err)
	}
	markerR := bufio.NewReader(marker)
	t.Cleanup(func() {
		mon.Close()
		marker.Close()
	})

	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "testenv-monitor-mark-" + hex.EncodeToString(b[:]) + "-"

	type mark struct {
		id    string
		count int
	}
	marks := make(chan mark, 16)
	go func() {
		defer close(marks)
		count := 0
		for {
			line, err := monR.ReadString('\n')
			if err != nil {
				return
			}
			if monitorClient(line) == "lua" || connectionSetup(line) {
				continue
			}
			if i := strings.Index(line, `"`+prefix); i >= 0 {
				id, _, _ := strings.Cut(line[i+1:], `"`)
				marks <- mark{id: id, count: count}
				continue
			}
			count++
		}
	}()

	seq := 0
	return func() int {
		t.Helper()
		seq++
		id := prefix + strconv.Itoa(seq)
		_ = marker.SetDeadline(time.Now().Add(redisStartTimeout))
		fmt.Fprintf(marker, "*2\r\n$4\r\nECHO\r\n$%d\r\n%s\r\n", len(id), id)
		if _, err := markerR.ReadString('\n'); err != nil {
			t.Fatalf("testenv: monitor marker: %v", err)
		}
		if _, err := markerR.ReadString('\n'); err != nil {
			t.Fatalf("testenv: monitor marker: %v", err)
		}
		timeout := time.After(redisStartTimeout)
		for {
			select {
			case m, ok := <-marks:
				if !ok {
					t.Fatalf("testenv: MONITOR connection to %s closed", addr)
				}
				if m.id == id {
					return m.count
				}
			case <-timeout:
				t.Fatalf("testenv: MONITOR did not show marker %s within %s", id, redisStartTimeout)
			}
		}
	}
}

// monitorClient extracts the client part of a MONITOR line such as
// `+1700000000.000001 [0 127.0.0.1:50000] "GET" "k"`; it is "lua" for commands
// run by a script.
func monitorClient(line string) string {
	_, rest, ok := strings.Cut(line, "[")
	if !ok {
		return ""
	}
	inside, _, _ := strings.Cut(rest, "]")
	_, client, _ := strings.Cut(inside, " ")
	return client
}

// connectionSetup reports whether a MONITOR line is one of the commands a
// client sends when it opens a connection.
func connectionSetup(line string) bool {
	_, rest, ok := strings.Cut(line, "] \"")
	if !ok {
		return false
	}
	cmd, _, _ := strings.Cut(rest, "\"")
	switch strings.ToUpper(cmd) {
	case "HELLO", "CLIENT", "AUTH", "SELECT":
		return true
	}
	return false
}

// RedisProc is a private redis-server that a test can stop and start again
// on the same port, to take Redis away from a running gateway. Like Redis,
// it persists nothing: a start after a stop is an empty server.
type RedisProc struct {
	t      testing.TB
	bin    string
	dir    string
	port   int
	log    *SyncBuffer
	cmd    *exec.Cmd
	exited chan struct{}
}

// RedisServer starts a private redis-server; it is killed when the test
// ends.
func RedisServer(t testing.TB) *RedisProc {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		bin = "/usr/bin/redis-server"
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	r := &RedisProc{t: t, bin: bin, dir: t.TempDir(), port: port, log: &SyncBuffer{}}
	r.Start()
	t.Cleanup(r.Stop)
	return r
}

// Addr is host:port.
func (r *RedisProc) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Start starts the server on its port and waits for PONG.
func (r *RedisProc) Start() {
	r.t.Helper()
	deadline := time.Now().Add(redisStartTimeout)
	for {
		cmd := exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", r.dir)
		cmd.Stdout, cmd.Stderr = r.log, r.log
		if err := cmd.Start(); err != nil {
			r.t.Fatalf("testenv: redis-server: %v", err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		for {
			if ping(r.Addr()) == nil {
				r.cmd, r.exited = cmd, exited
				return
			}
			select {
			case <-exited:
			case <-time.After(20 * time.Millisecond):
				if time.Now().Before(deadline) {
					continue
				}
				_ = cmd.Process.Kill()
				<-exited
			}
			break
		}
		// Exited (the port can take a moment to be free again after a
		// stop), or no answer in time.
		if time.Now().After(deadline) {
			r.t.Fatalf("testenv: redis-server on %s did not start: %s", r.Addr(), r.log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop kills the server and waits for its exit; its keys are gone.
// Stopping a stopped server does nothing.
func (r *RedisProc) Stop() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.exited
	r.cmd = nil
}
