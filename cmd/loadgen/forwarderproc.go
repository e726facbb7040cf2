package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// forwarderTargetEnv, when set, makes this binary a forwarder and nothing
// else. The memory phase runs the forwarder in a process of its own because
// a peak RSS only means something against a baseline: the same load, the
// same Go runtime and net/http, with no ledger, no Redis and no telemetry.
// Whatever that process needs at 1,000 in flight, no gateway built on
// net/http needs less.
const forwarderTargetEnv = "LOADGEN_FORWARDER_TARGET"

// serveForwarderIfAsked serves a forwarder to the downstream named by
// forwarderTargetEnv, writes its URL as the first line on stdout and serves
// until stdin closes. It returns false at once when the variable is unset.
func serveForwarderIfAsked() bool {
	target := os.Getenv(forwarderTargetEnv)
	if target == "" {
		return false
	}
	f, err := startForwarder(target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen forwarder:", err)
		os.Exit(1)
	}
	fmt.Println(f.url)
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it or exits
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = f.close(ctx)
	return true
}

// childProcess is this binary started again as a forwarder
// (serveForwarderIfAsked) or as the bare pipeline (serveBareIfAsked).
type childProcess struct {
	cmd   *exec.Cmd
	stdin io.Closer
	url   string
	pid   int
	done  chan error
}

func startForwarderProcess(ctx context.Context, target string) (*childProcess, error) {
	return startChild(ctx, "forwarder", forwarderTargetEnv+"="+target)
}

// startChild starts this binary with env added and waits for the URL it
// prints first.
func startChild(ctx context.Context, what, env string) (*childProcess, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(withImageGodebug(os.Environ()), env)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &childProcess{cmd: cmd, stdin: stdin, pid: cmd.Process.Pid, done: make(chan error, 1)}
	first := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		first <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, stdout)
		p.done <- cmd.Wait()
	}()
	select {
	case p.url = <-first:
	case <-time.After(30 * time.Second):
		err = errors.New("no URL within 30s")
	case <-ctx.Done():
		err = context.Cause(ctx)
	}
	if err == nil && !strings.HasPrefix(p.url, "http://") {
		err = fmt.Errorf("first line %q is not its URL", p.url)
	}
	if err != nil {
		_ = p.stop()
		return nil, fmt.Errorf("%s process: %w", what, err)
	}
	return p, nil
}

// stop closes the child's stdin, which ends it, and kills it if it has not
// ended within a few seconds.
func (p *childProcess) stop() error {
	_ = p.stdin.Close()
	select {
	case err := <-p.done:
		return err
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		return <-p.done
	}
}
