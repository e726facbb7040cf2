package storage

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for goose
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// The schema ships inside the binary, so a gateway can never run against
// migrations other than the ones it was built and tested with.
//
//go:embed migrations/*.sql
var embedded embed.FS

func migrations() fs.FS {
	sub, err := fs.Sub(embedded, "migrations")
	if err != nil {
		panic(err) // the directory is embedded at build time
	}
	return sub
}

// Migrate brings the database at databaseURL up to this build's schema. Safe to
// run from every replica at once: an advisory lock makes them take turns, and
// the ones that come second find nothing to do.
func Migrate(ctx context.Context, databaseURL string) error {
	_, err := MigrateReport(ctx, databaseURL)
	return err
}

// ErrPreBaseline is a ledger from before the migrations were folded into
// one baseline: its tables are not this build's, and no migration turns
// them into it. It is drained (every operation settled, then dropped) or
// recreated.
var ErrPreBaseline = errors.New("the ledger predates the baseline migration: drain it or recreate it (README, Upgrading)")

// MigrateReport is Migrate, and names the migrations it applied, oldest
// first (none when the schema was current).
func MigrateReport(ctx context.Context, databaseURL string) ([]string, error) {
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return nil, fmt.Errorf("storage: migrate: %w", err)
	}
	defer db.Close()
	var old bool
	if err := db.QueryRowContext(ctx, preBaselineSQL).Scan(&old); err != nil {
		return nil, fmt.Errorf("storage: migrate: %w", err)
	}
	if old {
		return nil, fmt.Errorf("storage: migrate: %w", ErrPreBaseline)
	}
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("storage: migrate: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations(),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("storage: migrate: %w", err)
	}
	results, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("storage: migrate: %w", err)
	}
	applied := make([]string, len(results))
	for i, r := range results {
		applied[i] = filepath.Base(r.Source.Path)
	}
	return applied, nil
}

// preBaselineSQL recognizes a ledger from before the baseline by the write
// function every one of them had.
const preBaselineSQL = `SELECT to_regproc('public.ackgate_write') IS NOT NULL`

// schemaVersions lists the migration versions embedded in this build.
func schemaVersions() ([]int64, error) {
	names, err := fs.Glob(migrations(), "*.sql")
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(names))
	for i, name := range names {
		if out[i], err = goose.NumericComponent(name); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return out, nil
}

// SchemaCurrent reports whether every migration this build embeds has been
// applied, for readiness: a replica must not take traffic against a schema
// older than its code. A newer schema is fine; migrations only add.
func SchemaCurrent(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	versions, err := schemaVersions()
	if err != nil {
		return false, fmt.Errorf("storage: schema versions: %w", err)
	}
	var current bool
	err = pool.QueryRow(ctx, `
		SELECT NOT (`+preBaselineSQL+`) AND NOT EXISTS (
			SELECT unnest($1::bigint[])
			EXCEPT
			SELECT version_id FROM `+goose.DefaultTablename+` WHERE is_applied
		)`, versions).Scan(&current)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: never migrated
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("storage: schema current: %w", err)
	}
	return current, nil
}

// OpenPool connects to Postgres and checks the connection once, so a wrong URL
// or a down server fails at start-up rather than on the first delivery.
func OpenPool(ctx context.Context, databaseURL string, opts ...PoolOption) (*pgxpool.Pool, error) {
	pool, err := NewPool(ctx, databaseURL, opts...)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("storage: open pool: %w", err)
	}
	return pool, nil
}

// NewPool is the gateway's pool for databaseURL, configured as every
// gateway session is (PlanAsLookups, then opts), without connecting: the
// gateway serves, and answers readiness, while Postgres is away.
func NewPool(ctx context.Context, databaseURL string, opts ...PoolOption) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("storage: open pool: %w", err)
	}
	PlanAsLookups(cfg.ConnConfig.RuntimeParams)
	for _, o := range opts {
		o(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("storage: open pool: %w", err)
	}
	return pool, nil
}

// PlanAsLookups sets a session's planner to prefer index reads and nested
// loops, and to plan each prepared statement once, because every statement
// the gateway sends is designed as a lookup by key or a walk of an index
// that stops after a page.
//
// Left to its costs, the planner gets this wrong exactly when it matters:
// a ledger starts empty, and a connection caches the generic plan of each
// statement after its fifth run. Planned against a table of a few pages,
// the claim, the evidence and the ack mark join their batch to operations
// by hashing a sequential scan of it, and the cached plan keeps scanning
// as the table grows, until an ANALYZE happens to invalidate it (minutes
// away on a busy server). With the other strategies priced out (a
// statement with no index to use still runs), the generic plan is the
// lookup it should be, and planning the ledger's statements again for each
// run, as Postgres otherwise does at first, costs more than running them.
//
// Pricing a strategy out adds a constant of ten billion to any plan that
// still has to use it, and past a cost of 100,000 Postgres compiles the
// plan with LLVM on every run: the sweep of open work into the lanes and
// the poison purge, which scan tables of a few rows, took 0.3 to 1 s of the
// server's CPU each time they ran. None of the gateway's statements runs long enough to
// repay a compilation, so JIT is off in its sessions.
func PlanAsLookups(params map[string]string) {
	for p, v := range map[string]string{"enable_seqscan": "off", "enable_hashjoin": "off", "enable_mergejoin": "off",
		"plan_cache_mode": "force_generic_plan", "jit": "off"} {
		if _, set := params[p]; !set {
			params[p] = v
		}
	}
}

// PoolOption adjusts the pool's configuration before it connects.
type PoolOption func(*pgxpool.Config)

// WithTracing gives every query a client span under the caller's span, via
// otelpgx. Query parameters are left out of the spans: they carry message
// keys and evidence, which belong in the ledger, not in a tracing backend.
//
// The connection's address, user and database are the same for every query,
// so they are computed once here; otelpgx would otherwise copy the whole
// connection configuration for every traced query to read them.
func WithTracing(tp trace.TracerProvider) PoolOption {
	return func(c *pgxpool.Config) {
		cc := c.ConnConfig
		c.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(tp),
			otelpgx.WithDisableConnectionDetailsInAttributes(),
			otelpgx.WithTracerAttributes(
				semconv.DBSystemNamePostgreSQL,
				semconv.ServerAddress(cc.Host),
				semconv.ServerPort(int(cc.Port)),
				semconv.UserName(cc.User),
				semconv.DBNamespace(cc.Database),
			))
	}
}
