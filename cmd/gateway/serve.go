package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/wiring"
	"github.com/ackgate/ackgate/storage"
	"github.com/ackgate/ackgate/telemetry"
)

func loadConfig(getenv func(string) string) (config.Settings, []*gate.Route, error) {
	s, err := config.LoadSettings(getenv)
	if err != nil {
		return s, nil, fmt.Errorf("settings: %w", err)
	}
	if err := s.ValidateRoutesFile(); err != nil {
		return s, nil, fmt.Errorf("settings: %w", err)
	}
	routes, err := config.LoadRoutes(s.RoutesFile)
	if err != nil {
		return s, nil, err
	}
	if err := s.CheckRoutes(routes); err != nil {
		return s, nil, fmt.Errorf("settings: %w", err)
	}
	return s, routes, nil
}

func checkConfig(getenv func(string) string, stdout io.Writer) error {
	_, routes, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	for _, r := range routes {
		fmt.Fprintf(stdout, "route %s: broker %s, shape %s, contract %s\n", r.Name, r.Broker, r.Shape, r.ContractVersion)
	}
	for _, w := range config.AuthNoneWarnings(routes) {
		fmt.Fprintln(stdout, "warning:", w)
	}
	fmt.Fprintf(stdout, "%d route(s) valid\n", len(routes))
	return nil
}

func migrate(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	s, err := config.LoadSettings(getenv)
	if err != nil {
		return fmt.Errorf("settings: %w", err)
	}
	applied, err := storage.MigrateReport(ctx, s.DatabaseURL)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for _, m := range applied {
		fmt.Fprintln(stdout, "applied", m)
	}
	fmt.Fprintln(stdout, "ledger schema is current")
	return nil
}

func help(args []string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "env" {
		return config.Usage(stdout)
	}
	_, err := fmt.Fprint(stdout, usage)
	return err
}

// serve runs the gateway until ctx ends: settings and routes, logging and
// telemetry, the gateway itself (package wiring), then the two listeners
// and the background workers.
func serve(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) error {
	s, routes, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	if err := s.ValidateServe(); err != nil {
		return fmt.Errorf("settings: %w", err)
	}
	log, err := processLogger(stderr, s)
	if err != nil {
		return err
	}
	if limit := s.SoftMemoryLimit(); limit > 0 {
		// Replaces GOMEMLIMIT, which the runtime read at start: the setting
		// is the operator's explicit word for this process.
		previous := debug.SetMemoryLimit(limit)
		defer debug.SetMemoryLimit(previous)
		log.Info("go runtime memory limit set", "bytes", limit, "of", s.MemoryLimit, "ratio", s.MemoryLimitRatio)
	}
	for _, w := range config.AuthNoneWarnings(routes) {
		log.Warn(w)
	}
	tel, err := telemetry.Setup(ctx, getenv)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			log.Warn("telemetry shutdown", "err", err)
		}
	}()

	gw, err := wiring.New(ctx, wiring.Options{Settings: s, Routes: routes, Getenv: getenv, Logger: log, Telemetry: tel})
	if err != nil {
		return err
	}
	defer gw.Close()

	ingestLn, adminLn, err := listen(s)
	if err != nil {
		return err
	}
	// The background workers (reconciler, purge, lane gauges, handoff
	// relay) run beside the listeners and stop with them, before the
	// connections close.
	bctx, stopBackground := context.WithCancel(ctx)
	background := make(chan struct{})
	go func() {
		defer close(background)
		gw.RunBackground(bctx)
	}()
	defer func() {
		stopBackground()
		<-background
	}()
	log.Info("gateway serving", "ingest", ingestLn.Addr().String(), "admin", adminLn.Addr().String(),
		"routes", len(routes), "instance", s.InstanceID)
	return serveListeners(ctx, s, log, newServer(s, gw.Ingest, log), ingestLn, newServer(s, gw.Admin, log), adminLn, gw.Drain)
}

// listen opens both listeners, or neither.
func listen(s config.Settings) (ingest, admin net.Listener, err error) {
	ingest, err = net.Listen("tcp", s.ListenAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("ingest listener: %w", err)
	}
	admin, err = net.Listen("tcp", s.AdminAddr)
	if err != nil {
		ingest.Close()
		return nil, nil, fmt.Errorf("admin listener: %w", err)
	}
	return ingest, admin, nil
}

// newServer puts h behind the settings' limits: timeouts and header size.
func newServer(s config.Settings, h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: s.ReadHeaderTimeout, ReadTimeout: s.ReadTimeout,
		WriteTimeout: s.WriteTimeout, IdleTimeout: s.IdleTimeout, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// serveListeners serves until ctx ends or a listener fails, then shuts both
// servers down and drains the post-response work, all within the shutdown
// deadline.
func serveListeners(ctx context.Context, s config.Settings, log *slog.Logger, ingest *http.Server, ingestLn net.Listener, admin *http.Server, adminLn net.Listener, drain func(context.Context) error) error {
	errc := make(chan error, 2)
	go func() { errc <- ingest.Serve(ingestLn) }()
	go func() { errc <- admin.Serve(adminLn) }()

	select {
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			ingest.Close()
			admin.Close()
			return fmt.Errorf("listener: %w", err)
		}
	case <-ctx.Done():
	}
	// Stop taking deliveries, let those in flight finish and commit. What is
	// still running at the deadline has its connection closed: the broker
	// reads that as a nack, so unfinished work is never acked.
	log.Info("shutting down", "deadline", s.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.ShutdownTimeout)
	defer cancel()
	err := ingest.Shutdown(sctx)
	if err != nil {
		ingest.Close()
	}
	if aerr := admin.Shutdown(sctx); aerr != nil {
		admin.Close()
	}
	// Every delivery has answered by now, so the queue only shrinks. What
	// the deadline leaves is left as it is: an unmarked ack stays
	// ack_pending, an unreleased lease lapses by its TTL.
	if derr := drain(sctx); derr != nil {
		log.Warn("post-response work left undone", "err", derr)
	}
	return err
}
