// Package wiring builds a gateway from its settings and routes: the Postgres
// pool and ledger, the Redis client and reservations, the effects client, the
// gate, broker authentication, the ingest and admin handlers, and the
// background workers (package recovery) that serve runs beside them.
//
// It exists so that there is one construction path. `gateway serve` runs it,
// and so do the HTTP tests, which therefore exercise the wiring production
// uses rather than a copy of it that can drift. It is also where the adapters
// meet the ports their consumers declare (see the checks below): storage,
// downstream and handlers never import one another.
package wiring

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/downstream"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/handlers"
	"github.com/ackgate/ackgate/internal/authlimit"
	"github.com/ackgate/ackgate/recovery"
	"github.com/ackgate/ackgate/storage"
	"github.com/ackgate/ackgate/telemetry"
)

// storage cannot state that it satisfies the interfaces handlers declares
// without importing handlers, so the package that joins them states it.
var (
	_ handlers.EvidenceStore   = (*storage.Ledger)(nil)
	_ handlers.SubscriptionLog = (*storage.Subscriptions)(nil)
	_ handlers.Deliverer       = (*gate.Gate)(nil)
	_ handlers.Afterward       = (*gate.AfterAnswer)(nil)
	_ handlers.PoisonLog       = (*storage.PoisonLog)(nil)
	_ handlers.PoisonStore     = (*storage.PoisonLog)(nil)

	_ recovery.DueClaimer      = (*storage.Maintenance)(nil)
	_ recovery.ExpiredStore    = (*storage.Maintenance)(nil)
	_ recovery.Forgetter       = (*storage.Reservations)(nil)
	_ recovery.Settler         = (*gate.Gate)(nil)
	_ recovery.Outbox          = (*storage.Ledger)(nil)
	_ recovery.Relayer         = (*gate.Gate)(nil)
	_ handlers.Resolver        = (*gate.Gate)(nil)
	_ handlers.DeadLetterStore = (*storage.Ledger)(nil)
)

// Options is what New takes from its caller; everything else is built from it.
type Options struct {
	Settings config.Settings
	// Routes are bound to this gateway: a route that keys on a private field
	// gets its HashKey from Settings.KeyHashSecret.
	Routes []*gate.Route
	// Getenv supplies the secrets the routes name (verification tokens, basic
	// credentials); nil supplies none. A missing secret fails New: a route
	// must not start without the credential it says it checks.
	Getenv func(string) string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Telemetry supplies the tracer provider, propagators and instruments.
	// It belongs to the caller, which shuts it down after Close.
	Telemetry *telemetry.Telemetry
	// Now is the gate's clock; nil means time.Now. Tests move it to cross a
	// dedupe window without waiting.
	Now func() time.Time
}

// Gateway is an assembled gateway: the two listeners' handlers and the parts
// behind them, which tests read directly (the ledger's rows, Redis's keys).
type Gateway struct {
	Ingest http.Handler
	Admin  http.Handler
	// IngestOptions is what Ingest was built from, so that a variant (other
	// authenticators) can be built around the same gate.
	IngestOptions handlers.IngestOptions

	Gate *gate.Gate
	// After runs deliveries' post-response work (ack marks, lease
	// releases) off their connections' goroutines; Drain finishes it.
	After         *gate.AfterAnswer
	Ledger        *storage.Ledger
	Subscriptions *storage.Subscriptions
	Poison        *storage.PoisonLog
	Pool          *pgxpool.Pool
	Redis         redis.UniversalClient
	Reservations  *storage.Reservations

	// The background work RunBackground runs: the lane gauges' count, the
	// reconciler of lookup routes, the retention purge, and the relay of
	// handoff routes with its outbox gauges' count.
	Maintenance *storage.Maintenance
	Lanes       *recovery.Lanes
	Reconciler  *recovery.Reconciler
	Purger      *recovery.Purger
	Relay       *recovery.Relay
	Outbox      *recovery.OutboxDepth

	effects      *downstream.Client
	lanesRefresh time.Duration
	// handedOff carries the ledger's word that an outbox entry committed
	// to the relay (storage.OnHandoff, RelayOptions.Wake).
	handedOff chan struct{}
}

// redisBufferSize sizes each Redis connection's read and write buffers.
const redisBufferSize = 4 << 10

// Instrumentation scopes of the spans the gateway's own packages start.
const (
	gateTracer     = "github.com/ackgate/ackgate/gate"
	handlersTracer = "github.com/ackgate/ackgate/handlers"
)

// New connects to Postgres and Redis and builds the gateway on them. The
// schema is not migrated here (that is `gateway migrate`); Ready reports it.
// Neither service has to answer yet: see openPool. Close releases what New
// opened, also when New fails half-way.
func New(ctx context.Context, o Options) (_ *Gateway, err error) {
	if o.Telemetry == nil {
		return nil, errors.New("wiring: Telemetry is required")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Getenv == nil {
		o.Getenv = func(string) string { return "" }
	}
	s, tel, log := o.Settings, o.Telemetry, o.Logger
	// Secrets and settings first: a start that cannot succeed should not
	// open connections before it says so.
	auth, err := brokerAuth(s, o.Routes, o.Getenv, log)
	if err != nil {
		return nil, err
	}
	if err := s.CheckKeyHashSecret(o.Routes); err != nil {
		return nil, fmt.Errorf("settings: %w", err)
	}
	if err := s.CheckOutboxKey(o.Routes); err != nil {
		return nil, err
	}
	ring, err := s.OutboxKeyring()
	if err != nil {
		return nil, err
	}
	if err := s.CheckFenceTTL(o.Routes); err != nil {
		return nil, fmt.Errorf("settings: %w", err)
	}
	if s.KeyHashSecret != "" {
		hash := gate.NewKeyHash([]byte(s.KeyHashSecret))
		for _, r := range o.Routes {
			if r.Key.Hashed {
				r.HashKey = hash
			}
		}
	}
	ropts, err := s.RedisOptions()
	if err != nil {
		return nil, fmt.Errorf("settings: %w", err)
	}
	// A delivery's Redis commands are short script calls with short answers;
	// go-redis's default of 32 KiB per connection each way is room for
	// values the gateway never reads. (The purge's pipelines use a pool of
	// their own with larger buffers.)
	ropts.ReadBufferSize = redisBufferSize
	ropts.WriteBufferSize = redisBufferSize

	g := &Gateway{}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	var answered bool
	if g.Pool, answered, err = openPool(ctx, s.DatabaseURL, log, storage.WithTracing(tel.TracerProvider)); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	// A local route whose role or grants are wrong would nack every
	// delivery; it is refused here, before any is taken, when Postgres
	// answers at start (otherwise each such delivery is nacked as a
	// configuration fault until the route is fixed).
	if answered {
		if err = storage.CheckLocalRoutes(ctx, g.Pool, o.Routes); err != nil {
			return nil, fmt.Errorf("local routes: %w", err)
		}
	} else if hasLocal(o.Routes) {
		log.Warn("local routes not checked: postgres does not answer at start")
	}
	g.Redis = RedisClient(ropts)
	probeRedis(ctx, g.Redis, log)
	// Without the caller's file and line (a stack walk per command) and the
	// command text (keys and owner tokens, formatted per command whether or
	// not the span is sampled): the span's name already says which command.
	if err = redisotel.InstrumentTracing(g.Redis, redisotel.WithTracerProvider(tel.TracerProvider),
		redisotel.WithCallerEnabled(false), redisotel.WithDBStatement(false)); err != nil {
		return nil, fmt.Errorf("redis tracing: %w", err)
	}
	tel.Metrics.Routes(o.Routes)
	var ledgerOpts []storage.LedgerOption
	if ring != nil {
		ledgerOpts = append(ledgerOpts, storage.SealOutbox(ring))
	}
	// A handoff committed here wakes this process's relay; with the relay
	// busy or idle for want of handoff routes, the wake is dropped.
	g.handedOff = make(chan struct{}, 1)
	ledgerOpts = append(ledgerOpts, storage.OnHandoff(func() {
		select {
		case g.handedOff <- struct{}{}:
		default:
		}
	}))
	g.Ledger = storage.NewLedger(g.Pool, ledgerOpts...)
	g.Subscriptions = storage.NewSubscriptions(g.Pool)
	g.Poison = storage.NewPoisonLog(g.Pool, 0)
	g.Reservations = storage.NewReservations(g.Redis, storage.WithFenceTTL(s.FenceTTL))
	g.effects = downstream.New(downstream.Options{TracerProvider: tel.TracerProvider, Propagators: tel.Propagators})
	g.Gate = &gate.Gate{
		Ledger: g.Ledger, Reservations: g.Reservations, Effects: g.effects, Local: g.Ledger,
		Owner: s.InstanceID, Now: o.Now, NewToken: token,
		Tracer: tel.TracerProvider.Tracer(gateTracer), Recorder: tel.Metrics,
	}
	g.After = gate.NewAfterAnswer(g.Reservations, log, gate.AfterAnswerOptions{})
	if err = g.background(s, o.Routes, tel, log, o.Now); err != nil {
		return nil, err
	}

	byName := make(map[string]*gate.Route, len(o.Routes))
	for _, r := range o.Routes {
		byName[r.Name] = r
	}
	auth.Subscriptions = g.Subscriptions
	auth.SNS.ShareCerts(storage.NewSNSCerts(g.Redis))
	g.IngestOptions = handlers.IngestOptions{
		Gate: g.Gate, Routes: byName, MaxBodyBytes: s.MaxBodyBytes, Ready: g.Ready, Logger: log, Auth: auth,
		Tracer: tel.TracerProvider.Tracer(handlersTracer), Propagators: tel.Propagators, Metrics: tel.Metrics,
		MaxClockSkew: s.MaxClockSkew, Now: o.Now, Poison: g.Poison,
		MaxInFlight: s.MaxInFlight, MaxBodyBytesInFlight: s.MaxBodyBytesInFlight, AdmissionWait: s.AdmissionWait,
		After: g.After,
	}
	g.Ingest = handlers.NewIngest(g.IngestOptions)
	creds, err := s.AdminCredentials()
	if err != nil {
		return nil, fmt.Errorf("settings: %w", err)
	}
	// One limit on failed credential checks for the API and the console.
	limiter := authlimit.New(authlimit.DefaultLimits(), nil)
	admin := handlers.NewAdmin(handlers.AdminOptions{
		Credentials: creds, Evidence: g.Ledger, Routes: o.Routes, Logger: log, AuthLimiter: limiter,
		Metrics: tel.MetricsHandler, MetricsToken: s.MetricsToken, AuthFailures: tel.Metrics, Poison: g.Poison,
		Resolver: g.Gate, DeadLetters: g.Ledger, Outbox: g.Ledger,
	})
	if g.Admin, err = withConsole(s, o.Routes, log, tel.Metrics, g, admin, creds, limiter); err != nil {
		return nil, err
	}
	return g, nil
}

// Ready reports whether Postgres and Redis answer and the ledger's schema is
// current; it backs the ingest listener's /readyz.
func (g *Gateway) Ready(ctx context.Context) error {
	if err := g.Pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if err := g.Redis.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	current, err := storage.SchemaCurrent(ctx, g.Pool)
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	if !current {
		return errors.New("schema: migrations pending (run gateway migrate)")
	}
	return nil
}

// Drain finishes the post-response work queued so far, up to ctx's end;
// call it once the ingest listener has stopped. Work left at the deadline
// stays undone, which the evidence allows (see gate.AfterAnswer).
func (g *Gateway) Drain(ctx context.Context) error {
	if g.After == nil {
		return nil
	}
	return g.After.Close(ctx)
}

// drainOnClose bounds the drain Close does for a caller that did not drain.
const drainOnClose = 5 * time.Second

// Close releases the connections. Call it once the listeners have stopped:
// deliveries still running would lose their ledger and Redis. Queued
// post-response work not yet drained gets a short last chance first.
func (g *Gateway) Close() {
	if g.After != nil {
		ctx, cancel := context.WithTimeout(context.Background(), drainOnClose)
		if err := g.After.Close(ctx); err != nil {
			slog.Default().Warn("post-response work left undone", "err", err)
		}
		cancel()
	}
	if g.effects != nil {
		g.effects.CloseIdleConnections()
	}
	if g.Redis != nil {
		g.Redis.Close()
	}
	if g.Pool != nil {
		g.Pool.Close()
	}
}

// staleAfter is how long after its creation an operation still open is
// past every owner: the longest any route's delivery may hold it (its ack
// deadline and lease extension), or its relay's call, with a minute to
// spare.
func staleAfter(routes []*gate.Route) time.Duration {
	longest := time.Duration(0)
	for _, r := range routes {
		longest = max(longest, r.AckDeadline+r.Renewal.MaxExtension)
		if r.Shape == gate.ShapeHandoff {
			rr := gate.RelayRoute(r)
			longest = max(longest, rr.AckDeadline)
		}
	}
	return longest + time.Minute
}

// background builds the workers RunBackground runs and registers their
// metrics; the lane gauges read the workers' snapshot, never the ledger.
func (g *Gateway) background(s config.Settings, routes []*gate.Route, tel *telemetry.Telemetry, log *slog.Logger, now func() time.Time) error {
	g.Maintenance = storage.NewMaintenance(g.Pool)
	g.lanesRefresh = s.LanesRefresh
	var err error
	stale := staleAfter(routes)
	g.Lanes, err = recovery.NewLanes(func(ctx context.Context) ([]recovery.LaneStat, error) {
		// Open work no owner can still be at enters the lanes first, so
		// the count sees it.
		if _, err := g.Maintenance.Sweep(ctx, stale); err != nil {
			return nil, err
		}
		stats, err := g.Maintenance.LaneStats(ctx)
		out := make([]recovery.LaneStat, len(stats))
		for i, st := range stats {
			out[i] = recovery.LaneStat(st)
		}
		return out, err
	}, log)
	if err != nil {
		return err
	}
	if err := tel.Metrics.ObserveGroupCommit(func() telemetry.GroupCommit {
		batches, steps, out := g.Ledger.GroupCommitLoad()
		return telemetry.GroupCommit{Batches: batches, Steps: steps, Out: out}
	}); err != nil {
		return err
	}
	if err := tel.Metrics.ObserveLanes(routes, func() (time.Time, []telemetry.Lane) {
		snap := g.Lanes.Snapshot()
		lanes := make([]telemetry.Lane, len(snap.Stats))
		for i, st := range snap.Stats {
			lanes[i] = telemetry.Lane(st)
		}
		return snap.At, lanes
	}); err != nil {
		return err
	}
	names := make([]string, len(routes))
	for i, r := range routes {
		names[i] = r.Name
	}
	rm, err := tel.Metrics.NewRecoveryMetrics(names)
	if err != nil {
		return err
	}
	if g.Reconciler, err = recovery.NewReconciler(recovery.ReconcilerOptions{
		Claims: g.Maintenance, Settler: g.Gate, Routes: routes, Poll: s.ReconcilePoll, Recorder: rm, Logger: log,
	}); err != nil {
		return err
	}
	g.Purger, err = recovery.NewPurger(recovery.PurgerOptions{
		Store: g.Maintenance, Forget: g.Reservations, Routes: routes, Batch: int(s.PurgeBatch),
		Every: s.PurgeInterval, Recorder: rm, Logger: log, Now: now,
	})
	if err != nil {
		return err
	}
	return g.relay(s, routes, tel, log, now)
}

// relay builds the handoff relay and its outbox gauges; both idle when no
// route is handoff, and then no relay instruments are registered either.
func (g *Gateway) relay(s config.Settings, routes []*gate.Route, tel *telemetry.Telemetry, log *slog.Logger, now func() time.Time) error {
	var (
		recorder recovery.RelayRecorder
		err      error
	)
	if slices.ContainsFunc(routes, func(r *gate.Route) bool { return r.Shape == gate.ShapeHandoff }) {
		var rm *telemetry.RelayMetrics
		if rm, err = tel.Metrics.NewRelayMetrics(); err != nil {
			return err
		}
		rm.Routes(routes)
		recorder = rm
	}
	// The relay's passes go through a gate of their own whose effect calls
	// feed each route's adaptive limit; everything else is the push path's.
	limits := recovery.NewRelayLimits(routes, int(s.RelayConcurrency))
	relayGate := *g.Gate
	relayGate.Effects = limits.Observe(g.Gate.Effects)
	if g.Relay, err = recovery.NewRelay(recovery.RelayOptions{
		Outbox: g.Ledger, Relayer: &relayGate, Routes: routes, Poll: s.RelayPoll,
		Concurrency: int(s.RelayConcurrency), Limits: limits, Recorder: recorder, Logger: log, Now: now,
		Wake: g.handedOff,
	}); err != nil {
		return err
	}
	g.Outbox, err = recovery.NewOutboxDepth(func(ctx context.Context) ([]recovery.OutboxStat, error) {
		stats, err := g.Ledger.OutboxStats(ctx)
		out := make([]recovery.OutboxStat, len(stats))
		for i, st := range stats {
			out[i] = recovery.OutboxStat(st)
		}
		return out, err
	}, routes, log)
	if err != nil {
		return err
	}
	return tel.Metrics.ObserveOutbox(routes, func() (time.Time, []telemetry.OutboxDepth) {
		snap := g.Outbox.Snapshot()
		out := make([]telemetry.OutboxDepth, len(snap.Stats))
		for i, st := range snap.Stats {
			out[i] = telemetry.OutboxDepth(st)
		}
		return snap.At, out
	})
}

// RunBackground runs the background workers until ctx ends and returns
// once all of them have stopped. A worker's failing round is logged and
// tried again; none of them ends the process. Run it beside the listeners
// and stop it before Close.
func (g *Gateway) RunBackground(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { g.Lanes.Run(ctx, g.lanesRefresh) })
	wg.Go(func() { g.Reconciler.Run(ctx) })
	wg.Go(func() { g.Purger.Run(ctx) })
	wg.Go(func() { g.Relay.Run(ctx) })
	wg.Go(func() { g.Outbox.Run(ctx, g.lanesRefresh) })
	wg.Wait()
}

// token is a fresh random owner token for one delivery's lease.
func token() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
