package testenv_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

func TestDatabaseURLIsFreshAndDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var name string
	t.Run("inner", func(t *testing.T) {
		dsn := testenv.DatabaseURL(t)
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		name = strings.TrimPrefix(u.Path, "/")
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var tables int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if tables != 0 {
			t.Fatalf("fresh database %s has %d tables", name, tables)
		}
		// Left open on purpose: cleanup must drop the database regardless.
		if _, err := pgx.Connect(ctx, dsn); err != nil {
			t.Fatal(err)
		}
	})
	if name == "" || !strings.HasPrefix(name, "ackgate_test_") {
		t.Fatalf("database name %q", name)
	}
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("database %s outlived its test", name)
	}
}

func TestRedisCommandCounter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := testenv.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	count := testenv.CountRedisCommands(t, addr)
	start := count()
	for _, k := range []string{"a", "b", "c"} {
		if err := c.Set(ctx, k, "1", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if got := count() - start; got != 3 {
		t.Fatalf("three SETs counted as %d", got)
	}
	// A script is one command however many it runs inside.
	mid := count()
	if err := c.Eval(ctx, `redis.call('INCR', KEYS[1]); return redis.call('INCR', KEYS[1])`, []string{"n"}).Err(); err != nil {
		t.Fatal(err)
	}
	if got := count() - mid; got != 1 {
		t.Fatalf("one EVAL counted as %d", got)
	}
	// A new connection's handshake is not the work measured.
	fresh := redis.NewClient(&redis.Options{Addr: addr})
	defer fresh.Close()
	before := count()
	if err := fresh.Set(ctx, "d", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := count() - before; got != 1 {
		t.Fatalf("one SET on a new connection counted as %d", got)
	}
	// Nothing happened between two reads.
	if a, b := count(), count(); a != b {
		t.Fatalf("idle counter moved from %d to %d", a, b)
	}
}

func TestRedisInstancesArePrivate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := redis.NewClient(&redis.Options{Addr: testenv.Redis(t)})
	b := redis.NewClient(&redis.Options{Addr: testenv.Redis(t)})
	defer a.Close()
	defer b.Close()
	if err := a.Set(ctx, "k", "a", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := a.Get(ctx, "k").Result(); err != nil || v != "a" {
		t.Fatalf("a FLUSHALL on one instance reached the other: %q, %v", v, err)
	}
}

// A stopped RedisServer refuses connections, and one started again listens
// on the same address, empty.
func TestRedisServerStopsAndStartsEmpty(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testenv.RedisServer(t)
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered with the server stopped")
	}
	r.Start()
	if err := c.Get(ctx, "k").Err(); err != redis.Nil {
		t.Fatalf("GET after a restart = %v, want nil: nothing is persisted", err)
	}
}

// A PrivateCluster's committed rows survive an immediate shutdown; while
// it is stopped nothing connects.
func TestPrivateClusterStopsAndStarts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.PrivateCluster(t)
	dsn := c.CreateDatabase("t")
	exec := func(sql string) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec("CREATE TABLE t (n int); INSERT INTO t VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	c.Stop()
	if err := exec("SELECT 1"); err == nil {
		t.Fatal("connected to a stopped cluster")
	}
	c.Start()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT n FROM t").Scan(&n); err != nil || n != 7 {
		t.Fatalf("after the restart: %d, %v", n, err)
	}
}
