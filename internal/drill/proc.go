// Package drill runs the highly available services a failover drill needs,
// each as child processes of the drill on this host: an etcd member and
// Postgres under Patroni (a primary and a replica), a Redis Cluster of three
// primaries with a replica each, a Redis primary and replica under three
// Sentinels, and a network namespace that can be cut off from them. Each
// can be failed over on purpose. cmd/drill drives the gateway through them
// with the soak's machinery (internal/soak); docs/reliability.md keeps its
// figures.
//
// Everything listens on loopback (or on the namespace's link), on free
// ports, with its files in one directory, so a drill disturbs no one else
// on the machine; every process dies with the drill.
package drill

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
	"time"
)

// proc is a child process with its output in a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// startProc starts args as name, its output appended to log, as cred when
// given. It dies with the drill.
func startProc(name string, log *os.File, cred *syscall.Credential, args ...string) (*proc, error) {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop sends sig, waits up to grace, then kills.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	if p == nil || !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// waitFor polls ok every 100 ms until it holds, or fails after timeout with
// the last error.
func waitFor(ctx context.Context, what string, timeout time.Duration, ok func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := ok()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not after %s: %w", what, timeout, err)
		case <-time.After(100 * time.Millisecond):
		}
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

func freePorts(n int) ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for len(out) < n {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out, nil
}

func addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// postgresUser is who runs Postgres (it refuses root), with that user's ids.
func postgresUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New("running as root, and there is no postgres user to run Postgres as")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func openLog(dir, name string) (*os.File, error) {
	return os.OpenFile(dir+"/"+name, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
}
