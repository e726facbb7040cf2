package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/downstream"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/handlers"
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
	if err := storage.Migrate(ctx, s.DatabaseURL); err != nil {
		return fmt.Errorf("migrate: %w", err)
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

func serve(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) error {
	s, routes, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	if err := s.ValidateServe(); err != nil {
		return fmt.Errorf("settings: %w", err)
	}
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: s.LogLevel})))
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

	pool, err := storage.OpenPool(ctx, s.DatabaseURL, storage.WithTracing(tel.TracerProvider))
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	defer pool.Close()
	ropts, err := s.RedisOptions()
	if err != nil {
		return fmt.Errorf("settings: %w", err)
	}
	rdb := redis.NewUniversalClient(ropts)
	defer rdb.Close()
	if err := redisotel.InstrumentTracing(rdb, redisotel.WithTracerProvider(tel.TracerProvider)); err != nil {
		return fmt.Errorf("redis tracing: %w", err)
	}

	ledger := storage.NewLedger(pool)
	err = tel.Metrics.ObserveLanes(routes, func(ctx context.Context) ([]telemetry.Lane, error) {
		counts, err := ledger.LaneCounts(ctx)
		lanes := make([]telemetry.Lane, len(counts))
		for i, c := range counts {
			lanes[i] = telemetry.Lane{Route: c.Route, State: c.State, N: c.N}
		}
		return lanes, err
	})
	if err != nil {
		return err
	}
	effects := downstream.New(downstream.Options{TracerProvider: tel.TracerProvider, Propagators: tel.Propagators})
	defer effects.CloseIdleConnections()
	g := &gate.Gate{
		Ledger: ledger, Reservations: storage.NewReservations(rdb), Effects: effects,
		Owner: s.InstanceID, Now: time.Now, NewToken: token,
		Tracer: tel.TracerProvider.Tracer("github.com/ackgate/ackgate/gate"), Recorder: tel.Metrics,
	}
	byName := make(map[string]*gate.Route, len(routes))
	for _, r := range routes {
		byName[r.Name] = r
	}
	ready := func(ctx context.Context) error {
		if err := pool.Ping(ctx); err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		if err := rdb.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis: %w", err)
		}
		current, err := storage.SchemaCurrent(ctx, pool)
		if err != nil {
			return fmt.Errorf("schema: %w", err)
		}
		if !current {
			return errors.New("schema: migrations pending (run gateway migrate)")
		}
		return nil
	}
	auth, err := brokerAuth(s, routes, getenv, pool, log)
	if err != nil {
		return err
	}
	ingest := &http.Server{
		Handler: handlers.NewIngest(handlers.IngestOptions{
			Gate: g, Routes: byName, MaxBodyBytes: s.MaxBodyBytes, Ready: ready, Logger: log, Auth: auth,
			Tracer:      tel.TracerProvider.Tracer("github.com/ackgate/ackgate/handlers"),
			Propagators: tel.Propagators, Metrics: tel.Metrics,
		}),
		ReadHeaderTimeout: s.ReadHeaderTimeout, ReadTimeout: s.ReadTimeout,
		WriteTimeout: s.WriteTimeout, IdleTimeout: s.IdleTimeout, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	admin := &http.Server{
		Handler: handlers.NewAdmin(handlers.AdminOptions{
			Token: s.AdminToken, Evidence: ledger, Routes: routes, Logger: log,
			Metrics: tel.MetricsHandler, MetricsToken: s.MetricsToken, AuthFailures: tel.Metrics,
		}),
		ReadHeaderTimeout: s.ReadHeaderTimeout, ReadTimeout: s.ReadTimeout,
		WriteTimeout: s.WriteTimeout, IdleTimeout: s.IdleTimeout, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	ingestLn, err := net.Listen("tcp", s.ListenAddr)
	if err != nil {
		return fmt.Errorf("ingest listener: %w", err)
	}
	adminLn, err := net.Listen("tcp", s.AdminAddr)
	if err != nil {
		ingestLn.Close()
		return fmt.Errorf("admin listener: %w", err)
	}
	log.Info("gateway serving", "ingest", ingestLn.Addr().String(), "admin", adminLn.Addr().String(),
		"routes", len(routes), "instance", s.InstanceID)
	fmt.Fprintf(stdout, "ingest %s admin %s\n", ingestLn.Addr(), adminLn.Addr())

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
	err = ingest.Shutdown(sctx)
	if err != nil {
		ingest.Close()
	}
	if aerr := admin.Shutdown(sctx); aerr != nil {
		admin.Close()
	}
	return err
}

// token is a fresh random owner token for one delivery's lease.
func token() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
