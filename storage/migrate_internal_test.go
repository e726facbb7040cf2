package storage

import (
	"context"
	"database/sql"
	"testing"

	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/pressly/goose/v3"
)

// The Down sections are only run by hand in an emergency, which is exactly
// when they must work: roll everything back, check nothing is left, go up again.
func TestMigrationsRollBackCleanly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.DatabaseURL(t)
	if err := Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations(), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		t.Fatalf("down: %v", err)
	}
	var left int
	err = db.QueryRowContext(ctx, `
		SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		        WHERE n.nspname = 'public' AND c.relname NOT LIKE 'goose_db_version%')
		     + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		        WHERE n.nspname = 'public')
		     + (SELECT count(*) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
		        WHERE n.nspname = 'public' AND t.typtype = 'd')`).Scan(&left)
	if err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d relations, functions or domains survived rolling back every migration", left)
	}
	if err := Migrate(ctx, url); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
