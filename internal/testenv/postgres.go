// Package testenv gives tests real backing services, each isolated per test:
// a fresh Postgres database, a private redis-server process. Tests that need
// them fail (never skip) when a service is missing, so a green run always means
// the real thing was exercised.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultDatabaseURL matches the role and database scripts/services.sh creates.
const DefaultDatabaseURL = "postgres://ackgate:ackgate@127.0.0.1:5432/ackgate?sslmode=disable"

const setupTimeout = 30 * time.Second

// DatabaseURL creates an empty database for this test alone and returns its
// URL. The database is dropped on cleanup, so tests may commit freely and run in
// parallel. The server comes from ACKGATE_TEST_DATABASE_URL, or
// DefaultDatabaseURL; its role needs CREATEDB, and membership in
// pg_signal_backend spares the cleanup a wait (see dropDatabase).
func DatabaseURL(t testing.TB) string {
	t.Helper()
	base := os.Getenv("ACKGATE_TEST_DATABASE_URL")
	if base == "" {
		base = DefaultDatabaseURL
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("testenv: ACKGATE_TEST_DATABASE_URL must be a postgres:// URL, got %q", base)
	}

	var b [8]byte
	_, _ = rand.Read(b[:])
	name := "ackgate_test_" + hex.EncodeToString(b[:])

	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	admin := connect(ctx, t, base)
	defer admin.Close(context.Background())
	// The name is ours and hex only, so quoting it is enough.
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("testenv: create database %s: %v (the role needs CREATEDB)", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		admin := connect(ctx, t, base)
		defer admin.Close(context.Background())
		if err := dropDatabase(ctx, admin, name, dropRetryFor); err != nil {
			t.Errorf("testenv: drop database %s: %v", name, err)
		}
	})

	u.Path = "/" + name
	return u.String()
}

// dropRetryFor bounds how long a drop refused for want of privilege is
// retried.
const dropRetryFor = 10 * time.Second

// execer is the part of a connection dropDatabase uses.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// dropDatabase drops the database name. FORCE ends the connections a test
// forgot to close, which would otherwise keep the database alive and fail the
// drop. But FORCE must be allowed to end every session inside, and a session
// of another role, most often an autovacuum worker that has just started on
// the fresh tables, makes it fail with insufficient_privilege (42501) unless
// the test role is a member of pg_signal_backend, which scripts/services.sh
// grants. Without that grant, the drop is retried with a growing pause for up
// to retryFor: such a worker is done within moments on a test's few tables.
func dropDatabase(ctx context.Context, conn execer, name string, retryFor time.Duration) error {
	stmt := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)"
	deadline := time.Now().Add(retryFor)
	pause := 20 * time.Millisecond
	for {
		_, err := conn.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != insufficientPrivilege || time.Now().Add(pause).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause = min(2*pause, 500*time.Millisecond)
	}
}

// insufficientPrivilege is SQLSTATE 42501.
const insufficientPrivilege = "42501"

func connect(ctx context.Context, t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("testenv: Postgres is unreachable at %s: %v\n"+
			"Start it with scripts/services.sh (or run the tests through `make test`), "+
			"or point ACKGATE_TEST_DATABASE_URL at a server where the role may CREATE DATABASE.", redact(dsn), err)
	}
	return conn
}

// redact keeps a password out of test logs.
func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
