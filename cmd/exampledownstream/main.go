// Command exampledownstream is a stand-in for a provider that performs a side
// effect, for local runs and demos of the gateway. It keeps effects in memory,
// keyed by Idempotency-Key, so that a repeated request is recognised and never
// applied twice, and it can be told to fail or to lose its answers so that the
// gateway's handling of those cases can be watched.
//
//	POST /effects        apply; 201 {"id": ...} and X-Result-Id (200 for a repeat, 409 for a
//	                     reused key with a different body, 400 without a key)
//	GET  /effects/{key}  200 with the effect, or 404
//	GET  /effects        counts
//	GET  /readyz         200 once serving
//	GET, PUT, DELETE /faults
//	                     the faults applied to every effect call: show them,
//	                     replace them (PUT /faults?fail=422, ?drop=1,
//	                     ?fail_rate=0.3&fail_status=503, ?drop_rate=0.1), or go
//	                     back to those of the flags
//
// Faults, per request in the query string (so a route's URL can carry them),
// for every request through flags and environment, or at run time through
// /faults:
//
//	?fail=503   answer 503 without applying (-fail-rate, -fail-status)
//	?drop=1     apply, then close the connection without answering (-drop-rate)
//	?delay=3s   apply, then wait before answering
//
// A query knob decides for its request; otherwise the faults in force do.
// Lookups (GET /effects/{key}) honour only their own ?fail=.
//
// A drop or delay only hits a request that applies the effect; a repeat is
// answered at once, which is how a provider with dedupe behaves and what makes
// the gateway's retry after a lost answer visible.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/ackgate/ackgate/internal/logsetup"
)

func main() {
	if err := run(context.Background(), os.Args, os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "exampledownstream:", err)
		os.Exit(1)
	}
}

type config struct {
	addr      string
	logFormat string
	faults    faults
}

// faults are the failure rates applied to every effect call; query knobs
// override them per request.
type faults struct {
	failRate   float64
	failStatus int
	dropRate   float64
}

// run serves until ctx is done or a signal arrives, then shuts down. Logs go to
// stdout, one record per request in the -log-format; usage and flag errors to
// stderr.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	cfg, err := parseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	logger, err := logsetup.New(stdout, cfg.logFormat, slog.LevelInfo)
	if err != nil {
		return err
	}
	logsetup.Adopt(logger)

	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           newServer(newStore(), cfg.faults, logger),
		ReadHeaderTimeout: 5 * time.Second,
	}
	logger.Info("listening", "addr", ln.Addr().String(),
		"fail_rate", cfg.faults.failRate, "fail_status", cfg.faults.failStatus, "drop_rate", cfg.faults.dropRate)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	// A fresh context: the one that ended is what asked us to stop.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	logger.Info("stopped")
	return nil
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	env := func(name, def string) string {
		if v := getenv("EXAMPLEDOWNSTREAM_" + name); v != "" {
			return v
		}
		return def
	}
	fs := flag.NewFlagSet("exampledownstream", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg                          config
		failRate, failStatus, dropRt string
	)
	fs.StringVar(&cfg.addr, "addr", env("ADDR", ":9090"), "listen address (EXAMPLEDOWNSTREAM_ADDR)")
	// The gateway's setting is the default, so that one variable gives
	// `make run`'s two processes the same format.
	defFormat := getenv("GATEWAY_LOG_FORMAT")
	if defFormat == "" {
		defFormat = logsetup.FormatJSON
	}
	fs.StringVar(&cfg.logFormat, "log-format", env("LOG_FORMAT", defFormat), "json or text (EXAMPLEDOWNSTREAM_LOG_FORMAT, else GATEWAY_LOG_FORMAT)")
	fs.StringVar(&failRate, "fail-rate", env("FAIL_RATE", "0"), "fraction of effect calls answered with -fail-status, not applied (EXAMPLEDOWNSTREAM_FAIL_RATE)")
	fs.StringVar(&failStatus, "fail-status", env("FAIL_STATUS", "503"), "status for injected failures (EXAMPLEDOWNSTREAM_FAIL_STATUS)")
	fs.StringVar(&dropRt, "drop-rate", env("DROP_RATE", "0"), "fraction of effect calls applied and then left unanswered (EXAMPLEDOWNSTREAM_DROP_RATE)")
	if len(args) > 0 {
		args = args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	var err error
	if cfg.faults.failRate, err = parseRate("fail-rate", failRate); err != nil {
		return config{}, err
	}
	if cfg.faults.dropRate, err = parseRate("drop-rate", dropRt); err != nil {
		return config{}, err
	}
	if cfg.faults.failStatus, err = parseStatus(failStatus); err != nil {
		return config{}, fmt.Errorf("fail-status: %w", err)
	}
	return cfg, nil
}

func parseRate(name, s string) (float64, error) {
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || r < 0 || r > 1 {
		return 0, fmt.Errorf("%s: %q is not a fraction between 0 and 1", name, s)
	}
	return r, nil
}

// parseStatus accepts only error statuses: an injected "failure" that is a
// 2xx would be an effect that was never applied, claiming success.
func parseStatus(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 400 || n > 599 {
		return 0, fmt.Errorf("%q is not a status between 400 and 599", s)
	}
	return n, nil
}
