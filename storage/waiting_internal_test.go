package storage

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
)

// A ledger written before migration 0016 gets waiting for every row that
// has one, so the lanes and the open work it already holds are listed
// through the new indexes.
func TestWaitingIsBackfilled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.DatabaseURL(t)
	if err := migrateTo(ctx, url, 15); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	write := func(c *gate.Change) {
		t.Helper()
		wire, err := encode(c)
		if err != nil {
			t.Fatal(err)
		}
		var answer string
		if err := conn.QueryRow(ctx, writeSQL, []string{string(wire)}).Scan(&answer); err != nil || answer != "ok" {
			t.Fatalf("%s %s: %q, %v", c.Kind, c.OperationID, answer, err)
		}
	}
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	claim, _, _ := freshMessage(t, "open", at)
	write(claim)
	claim, confirm, ack := freshMessage(t, "acked", at)
	write(claim)
	write(confirm)
	write(ack)
	claim, _, _ = freshMessage(t, "lost", at)
	write(claim)
	edges, err := gate.Path(gate.StatePendingEffect, gate.StateEffectIndeterminate)
	if err != nil {
		t.Fatal(err)
	}
	write(gate.IndeterminateChange(gate.Settling(&gate.Operation{ID: "op_lost", State: gate.StatePendingEffect}, 1,
		&gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown}, nil, gate.LeaseFacts{Deadline: at}),
		[]gate.Step{{Transition: edges[0]}}, gate.LaneOperator, "lost", at))

	if err := migrateTo(ctx, url, 16); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, `SELECT id, coalesce(waiting, 'NULL') FROM operations ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	var id, waiting string
	if _, err := pgx.ForEachRow(rows, []any{&id, &waiting}, func() error {
		got[id] = waiting
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"op_open": "open", "op_acked": "NULL", "op_lost": "effect_indeterminate"}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: waiting %s, want %s", id, got[id], w)
		}
	}
}
