package storage_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

// The dead-letter listing holds every terminal record and nothing else,
// says who took each out of circulation, and pages like the operation list.
func TestDeadLettersListAndPages(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()

	// Eight operations a minute apart: every other one ends terminally at
	// once, dead-lettered by the gateway or left to the broker; the rest
	// stay open and are not listed.
	var want []string // newest first
	for i := range 8 {
		op := newOperation(fmt.Sprintf("dl-%02d", i))
		op.CreatedAt = t0.Add(time.Duration(i) * time.Minute)
		if i%4 == 1 {
			op.Route, op.DeadLetterPolicy = "refunds", gate.DeadLetterBroker
		}
		w := gate.Claiming(nil, op, gate.Lease{Owner: "a", Fence: 1, Expires: op.CreatedAt.Add(time.Minute)},
			delivery(fmt.Sprintf("msg-%02d", i), op.CreatedAt), "")
		if i%2 == 0 {
			must(t, l.Write(ctx, fixtureChange(w, steps(t, "", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect), op.CreatedAt)))
			continue
		}
		var dl *gate.DeadLetter
		if op.DeadLetterPolicy == gate.DeadLetterGateway {
			dl = &gate.DeadLetter{OperationID: op.ID, Reason: "dead " + op.ID, At: op.CreatedAt}
		}
		must(t, l.Write(ctx, gate.TerminalChange(w, steps(t, "", gate.StateReceived, gate.StateTerminalFailure), dl,
			"refused: "+op.ID, op.CreatedAt)))
		want = append([]string{op.ID}, want...)
	}
	// A conflict record on the first operation's key: listed, never replayable.
	orig := newOperation("dl-00")
	orig.CreatedAt = t0
	cf := *orig
	cf.Fingerprint, cf.IdempotencyKey, cf.Reason = "v1:fp-other", "", "key reused"
	cf.ID = gate.ConflictID(cf.ScopeKey, cf.Fingerprint)
	cf.CreatedAt = t0.Add(10 * time.Minute)
	if _, err := l.RecordConflict(ctx, &gate.Conflict{Original: orig, Record: &cf, Delivery: delivery("msg-cf", cf.CreatedAt),
		DeadLetter: &gate.DeadLetter{Reason: "key reused", At: cf.CreatedAt}, At: cf.CreatedAt}); err != nil {
		t.Fatal(err)
	}
	want = append([]string{cf.ID}, want...)

	all, next, err := l.DeadLetters(ctx, adminapi.DeadLetterFilter{})
	if err != nil || next != "" {
		t.Fatalf("DeadLetters: %v, next %q", err, next)
	}
	var got []string
	for _, e := range all {
		got = append(got, e.OperationID)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	byID := map[string]adminapi.DeadLetterEntry{}
	for _, e := range all {
		byID[e.OperationID] = e
	}
	if e := byID["op_dl-03"]; e.State != gate.StateTerminalFailure || e.DeadLetteredBy != adminapi.DeadLetteredByGateway ||
		!e.Replayable || e.Reason != "refused: op_dl-03" || e.MessageID != "msg-03" || !e.Since.Equal(t0.Add(3*time.Minute)) ||
		e.Route != "orders" || e.IdempotencyKey != "ik_dl-03" {
		t.Errorf("gateway dead letter: %+v", e)
	}
	if e := byID["op_dl-01"]; e.DeadLetteredBy != adminapi.DeadLetteredByBroker || !e.Replayable || e.Route != "refunds" {
		t.Errorf("broker-policy terminal: %+v", e)
	}
	if e := byID[cf.ID]; e.State != gate.StateConflicting || e.Replayable || e.ConflictOf != orig.ID ||
		e.DeadLetteredBy != adminapi.DeadLetteredByGateway || e.MessageID != "msg-cf" {
		t.Errorf("conflict record: %+v", e)
	}

	// Pages of two, then a route.
	var paged []string
	cursor, pages := "", 0
	for {
		page, next, err := l.DeadLetters(ctx, adminapi.DeadLetterFilter{Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, e := range page {
			paged = append(paged, e.OperationID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if pages != 3 || fmt.Sprint(paged) != fmt.Sprint(want) {
		t.Fatalf("paged in %d pages: %v, want %v", pages, paged, want)
	}
	refunds, _, err := l.DeadLetters(ctx, adminapi.DeadLetterFilter{Route: "refunds"})
	if err != nil || len(refunds) != 2 || refunds[0].OperationID != "op_dl-05" || refunds[1].OperationID != "op_dl-01" {
		t.Fatalf("route filter: %+v, %v", refunds, err)
	}
	for _, bad := range []adminapi.DeadLetterFilter{{Cursor: "%%%"}, {Cursor: "bm9jb2xvbg"}, {Route: "r\x00"}} {
		if _, _, err := l.DeadLetters(ctx, bad); !errors.Is(err, adminapi.ErrInvalidFilter) {
			t.Errorf("DeadLetters(%+v): %v, want ErrInvalidFilter", bad, err)
		}
	}
}

// Both shapes of the listing's query (with and without a route, from the
// start and after a cursor) walk a partial index of terminal records in
// the page's order: no sort and no scan of the open operations. The test
// ledger is too small for the planner to prefer an index on its own, so
// sequential and bitmap scans are priced out; what is checked is that an
// index can serve the query as written, order included.
func TestDeadLettersQueryUsesTerminalIndex(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off`); err != nil {
		t.Fatal(err)
	}
	for _, f := range []adminapi.DeadLetterFilter{{}, {Route: "orders"}, {Cursor: "MTc3MjM2NjQwMDAwMDAwMDpvcF94"}, {Route: "orders", Cursor: "MTc3MjM2NjQwMDAwMDAwMDpvcF94"}} {
		sql, args, err := l.DeadLettersQuery(f)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, "EXPLAIN "+sql, append([]any{pgx.QueryExecModeExec}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		// The outer scan is the plan's first scan line; the subqueries'
		// scans come after it.
		outer := ""
		for _, ln := range lines {
			if strings.Contains(ln, "Scan") {
				outer = ln
				break
			}
		}
		if !strings.Contains(outer, "Index Scan Backward using operations_terminal_") || strings.Contains(plan, "Sort") {
			t.Errorf("filter %+v: the listing does not walk a terminal index in order:\n%s", f, plan)
		}
	}
}
