package storage_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/storage"
)

// The dead-letter listing holds every terminal record and nothing else,
// newest first, says who took each out of circulation and whether it may
// be replayed, and pages like the operation list.
func TestDeadLettersListAndPages(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()

	// Eight operations a minute apart: every other one ends terminally,
	// dead-lettered by the gateway on orders and left to the broker on
	// refunds; the rest stay open and are not listed. dl-07 ends after an
	// attempt, half a minute after its creation.
	var want []string // newest first
	ops := map[string]*gate.Operation{}
	for i := range 8 {
		op := newOperation(fmt.Sprintf("dl-%02d", i))
		op.CreatedAt = t0.Add(time.Duration(i) * time.Minute)
		ops[op.Key] = op
		msg := fmt.Sprintf("msg-%02d", i)
		if i%4 == 1 {
			op.Route, op.DeadLetterPolicy = "refunds", gate.DeadLetterBroker
		}
		var dl *gate.DeadLetter
		if op.DeadLetterPolicy == gate.DeadLetterGateway {
			dl = &gate.DeadLetter{OperationID: op.ID, Reason: "dead " + op.ID, At: op.CreatedAt}
		}
		switch {
		case i%2 == 0:
			create(t, l, creating(t, op, msg, op.CreatedAt))
			continue
		case i == 7:
			create(t, l, creating(t, op, msg, op.CreatedAt))
			at := op.CreatedAt.Add(30 * time.Second)
			must(t, l.Write(ctx, gate.TerminalChange(
				settling(op.ID, gate.StatePendingEffect, 1, &gate.Attempt{N: 1, Outcome: gate.OutcomeTerminal, StatusCode: 422}, 1),
				steps(t, gate.StatePendingEffect, gate.StateTerminalFailure), dl, "refused: "+op.ID, at)))
		default:
			create(t, l, creatingTerminal(t, op, msg, op.CreatedAt, dl))
		}
		want = append([]string{op.ID}, want...)
	}
	// Conflict records: listed, never replayable; one dead-lettered by the
	// gateway, one left to the broker.
	conflict := func(orig *gate.Operation, msg string, at time.Time, dl bool) *gate.Operation {
		t.Helper()
		cf := *orig
		cf.Fingerprint, cf.IdempotencyKey, cf.Reason, cf.CreatedAt = "v1:fp-other", "ik_cf_"+orig.Key, "key reused", at
		cf.ID = gate.ConflictID(cf.ScopeKey, cf.Fingerprint)
		c := &gate.Conflict{Original: orig, Record: &cf, Delivery: delivery(msg, 0, at), At: at}
		if dl {
			c.DeadLetter = &gate.DeadLetter{Reason: "key reused", At: at}
		}
		if _, err := l.RecordConflict(ctx, c); err != nil {
			t.Fatal(err)
		}
		return &cf
	}
	cf := conflict(ops["dl-00"], "msg-cf", t0.Add(10*time.Minute), true)
	cfBroker := conflict(ops["dl-05"], "msg-cf-broker", t0.Add(11*time.Minute), false)
	want = append([]string{cfBroker.ID, cf.ID}, want...)

	all, next, err := l.DeadLetters(ctx, adminapi.DeadLetterFilter{})
	if err != nil || next != "" {
		t.Fatalf("DeadLetters: %v, next %q", err, next)
	}
	var got []string
	byID := map[string]adminapi.DeadLetterEntry{}
	for _, e := range all {
		got = append(got, e.OperationID)
		byID[e.OperationID] = e
	}
	if !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	if e := byID["op_dl-03"]; e.State != gate.StateTerminalFailure || e.DeadLetteredBy != adminapi.DeadLetteredByGateway ||
		!e.Replayable || e.Reason != "refused: op_dl-03" || e.MessageID != "msg-03" || !e.Since.Equal(t0.Add(3*time.Minute)) ||
		e.Route != "orders" || e.IdempotencyKey != "ik_dl-03" || e.Key != "dl-03" || e.ConflictOf != "" || e.AttemptCount != 0 ||
		!e.CreatedAt.Equal(t0.Add(3*time.Minute)) {
		t.Errorf("gateway dead letter: %+v", e)
	}
	if e := byID["op_dl-07"]; e.DeadLetteredBy != adminapi.DeadLetteredByGateway || !e.Replayable || e.AttemptCount != 1 ||
		!e.Since.Equal(t0.Add(7*time.Minute+30*time.Second)) || !e.CreatedAt.Equal(t0.Add(7*time.Minute)) {
		t.Errorf("terminal after an attempt (since when it ended, not when it began): %+v", e)
	}
	if e := byID["op_dl-01"]; e.DeadLetteredBy != adminapi.DeadLetteredByBroker || !e.Replayable || e.Route != "refunds" ||
		e.MessageID != "msg-01" {
		t.Errorf("broker-policy terminal: %+v", e)
	}
	if e := byID[cf.ID]; e.State != gate.StateConflicting || e.Replayable || e.ConflictOf != ops["dl-00"].ID ||
		e.DeadLetteredBy != adminapi.DeadLetteredByGateway || e.MessageID != "msg-cf" || !e.Since.Equal(t0.Add(10*time.Minute)) {
		t.Errorf("conflict record: %+v", e)
	}
	if e := byID[cfBroker.ID]; e.Replayable || e.DeadLetteredBy != adminapi.DeadLetteredByBroker || e.Route != "refunds" {
		t.Errorf("conflict record left to the broker: %+v", e)
	}

	// Pages of two, stable while another terminal record arrives mid-way.
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
		if pages == 1 {
			late := newOperation("dl-late")
			create(t, l, creatingTerminal(t, late, "msg-late", t0.Add(time.Hour), nil))
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if pages != 3 || !slices.Equal(paged, want) {
		t.Fatalf("paged in %d pages: %v, want 3 of %v", pages, paged, want)
	}
	refunds, _, err := l.DeadLetters(ctx, adminapi.DeadLetterFilter{Route: "refunds"})
	if err != nil || len(refunds) != 3 || refunds[0].OperationID != cfBroker.ID || refunds[1].OperationID != "op_dl-05" ||
		refunds[2].OperationID != "op_dl-01" {
		t.Fatalf("route filter: %+v, %v", refunds, err)
	}
	page, next, err := l.DeadLetters(ctx, adminapi.DeadLetterFilter{Route: "refunds", Limit: 1})
	if err != nil || len(page) != 1 || next == "" {
		t.Fatalf("first page of refunds: %+v, %q, %v", page, next, err)
	}
	page, _, err = l.DeadLetters(ctx, adminapi.DeadLetterFilter{Route: "refunds", Limit: 5, Cursor: next})
	if err != nil || len(page) != 2 || page[0].OperationID != "op_dl-05" {
		t.Fatalf("next page of refunds: %+v, %v", page, err)
	}
	for _, bad := range []adminapi.DeadLetterFilter{{Cursor: "%%%"}, {Cursor: "bm9jb2xvbg"}, {Route: "r\x00"}, {Route: "\xff"}} {
		if _, _, err := l.DeadLetters(ctx, bad); !errors.Is(err, adminapi.ErrInvalidFilter) {
			t.Errorf("DeadLetters(%+v): %v, want ErrInvalidFilter", bad, err)
		}
	}
}

// Every shape of the listing's query (with and without a route, from the
// start and after a cursor) reads a page per lane and route from the lanes'
// index, newest first, and no more: neither the open operations nor the
// whole terminal history, and nothing sorted but those pages. As in a
// real ledger, terminal records are a small share of its operations; the
// ledger is still small, so sequential and bitmap scans are priced out:
// what is checked is that an index can serve the query as written, order
// included, and what is counted is the rows it reads.
func TestDeadLettersQueryReadsPagesNotTheLane(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t)
	ctx := context.Background()
	routes := []string{"orders", "refunds", "payments"}
	const terminal, conflicts, open = 40, 8, 1000
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for _, route := range routes {
		var claims []*gate.Change
		var origs []*gate.Operation
		for i := range terminal + open {
			op := newOperation(fmt.Sprintf("%s-%03d", route, i))
			op.Route = route
			if i < terminal {
				claims = append(claims, creatingTerminal(t, op, "m-"+op.Key, t0, &gate.DeadLetter{Reason: "refused"}))
			} else {
				claims = append(claims, creating(t, op, "m-"+op.Key, t0))
			}
			if i < conflicts {
				origs = append(origs, op)
			}
		}
		for w := range 4 {
			wg.Go(func() {
				for i := w; i < len(claims); i += 4 {
					if _, _, err := l.Claim(ctx, claims[i]); err != nil {
						fail(err)
					}
				}
			})
		}
		wg.Go(func() {
			for _, o := range origs {
				cf := *o
				cf.Fingerprint = "v1:fp-other"
				cf.ID = gate.ConflictID(cf.ScopeKey, cf.Fingerprint)
				if _, err := l.RecordConflict(ctx, &gate.Conflict{Original: o, Record: &cf, Delivery: delivery("m-cf", 0, t0), At: t0}); err != nil {
					fail(err)
				}
			}
		})
	}
	wg.Wait()
	must(t, errors.Join(errs...))
	if _, err := pool.Exec(ctx, `ANALYZE operations`); err != nil {
		t.Fatal(err)
	}

	const limit = 5
	_, cursor, err := l.DeadLetters(ctx, adminapi.DeadLetterFilter{Limit: limit})
	if err != nil || cursor == "" {
		t.Fatalf("first page: %q, %v", cursor, err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off`); err != nil {
		t.Fatal(err)
	}
	for _, f := range []adminapi.DeadLetterFilter{{}, {Route: "orders"}, {Cursor: cursor}, {Route: "orders", Cursor: cursor}} {
		f.Limit = limit
		sql, args, err := l.DeadLettersQuery(f)
		if err != nil {
			t.Fatal(err)
		}
		var raw []byte
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, append([]any{pgx.QueryExecModeExec}, args...)...).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		nodes, err := storage.PlanNodes(raw)
		if err != nil {
			t.Fatal(err)
		}
		// A page of each (lane, route) present, and one step of the skip
		// over them per pair.
		pairs := 2 * len(routes)
		if f.Route != "" {
			pairs = 2
		}
		bound := float64(pairs*(limit+1) + pairs + 1)
		var (
			read     float64
			problems []string
			backward bool
		)
		for _, n := range nodes {
			switch {
			case n.Relation == "operations" && n.Index != "operations_lanes":
				problems = append(problems, "reads operations other than through the lanes' index: "+n.String())
			case n.Type == "Sort" && n.Rows > float64(pairs*(limit+1)):
				problems = append(problems, fmt.Sprintf("sorts %.0f rows", n.Rows))
			}
			if n.Relation == "operations" {
				read += n.Read
				backward = backward || n.Direction == "Backward"
			}
		}
		if read > bound {
			problems = append(problems, fmt.Sprintf("reads %.0f rows of operations, more than %.0f", read, bound))
		}
		if !backward {
			problems = append(problems, "walks no index newest first")
		}
		if len(problems) > 0 {
			var plan []string
			for _, n := range nodes {
				plan = append(plan, fmt.Sprintf("%s rows %.0f", n, n.Rows))
			}
			t.Errorf("filter %+v: %s\n%s", f, strings.Join(problems, "; "), strings.Join(plan, "\n"))
		}
	}
}
