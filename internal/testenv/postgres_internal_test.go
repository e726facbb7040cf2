package testenv

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// scriptedExec answers each Exec with the next error of its script (nil
// after the script runs out) and records the statements.
type scriptedExec struct {
	errs  []error
	stmts []string
}

func (s *scriptedExec) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	s.stmts = append(s.stmts, sql)
	if len(s.errs) == 0 {
		return pgconn.CommandTag{}, nil
	}
	err := s.errs[0]
	s.errs = s.errs[1:]
	return pgconn.CommandTag{}, err
}

func TestDropDatabaseRetriesWhileAnotherRolesSessionIsInside(t *testing.T) {
	t.Parallel()
	denied := &pgconn.PgError{Code: "42501", Message: "must be a member of the role whose process is being terminated or member of pg_signal_backend"}
	other := &pgconn.PgError{Code: "3D000", Message: "database does not exist"}
	ctx := context.Background()

	// Refused twice (an autovacuum worker inside), then dropped.
	s := &scriptedExec{errs: []error{denied, denied}}
	if err := dropDatabase(ctx, s, "ackgate_test_x", 10*time.Second); err != nil {
		t.Fatalf("drop after two refusals: %v", err)
	}
	if len(s.stmts) != 3 || s.stmts[0] != `DROP DATABASE IF EXISTS "ackgate_test_x" WITH (FORCE)` {
		t.Fatalf("statements %q, want the forced drop three times", s.stmts)
	}

	// Any other error is not retried.
	s = &scriptedExec{errs: []error{other}}
	if err := dropDatabase(ctx, s, "ackgate_test_x", 10*time.Second); !errors.Is(err, other) || len(s.stmts) != 1 {
		t.Fatalf("other error: %v after %d statements", err, len(s.stmts))
	}

	// Once the time for retries is up, the refusal itself comes back.
	s = &scriptedExec{errs: []error{denied, denied}}
	err := dropDatabase(ctx, s, "ackgate_test_x", 0)
	if !errors.Is(err, denied) || !strings.Contains(err.Error(), "pg_signal_backend") || len(s.stmts) != 1 {
		t.Fatalf("refusal with no time left: %v after %d statements", err, len(s.stmts))
	}
}
