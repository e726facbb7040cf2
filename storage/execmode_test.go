package storage_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/storage"
)

// The write path works in every query mode pgx offers: the default, which
// has the server describe each statement's parameters, and the exec and
// simple-protocol modes that docs/deploy.md suggests behind a pooler,
// where pgx has to name each argument's Postgres type from its Go type.
func TestCommonPathInEveryQueryMode(t *testing.T) {
	t.Parallel()
	inEveryQueryMode(t, func(t *testing.T, l *storage.Ledger, mode string) {
		op := newOperation("mode-" + mode)
		op.Reason = `a reason with "quotes", a comma, {braces} and NULL`
		createPending(t, l, op)
		ctx := context.Background()
		must(t, l.Write(ctx, confirm(t, op, "r-"+mode, t0)))
		must(t, l.Write(ctx, acked(t, op, 1, t0)))
		rec := mustGet(t, l, op.ID)
		if rec.Operation.State != gate.StateAcknowledged || rec.Operation.ResultID != "r-"+mode {
			t.Errorf("state %s, result %q; want acknowledged with r-%s", rec.Operation.State, rec.Operation.ResultID, mode)
		}
	})
}

// inEveryQueryMode runs f as a subtest per query mode pgx offers, each with
// a ledger on a pool of its own in that mode, over one migrated database.
func inEveryQueryMode(t *testing.T, f func(t *testing.T, l *storage.Ledger, mode string)) {
	t.Helper()
	url := migratedURL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			pool, err := storage.NewPool(context.Background(), url+sep+"default_query_exec_mode="+mode)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			f(t, storage.NewLedger(pool), mode)
		})
	}
}
