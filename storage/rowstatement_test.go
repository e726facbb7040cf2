package storage

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
)

// The row statement is the change statement for the changes that write
// the operation's row alone. Each such change is applied to one of two
// twin operations through the row statement and to the other through the
// change statement: they must answer alike and leave the twins' rows and
// logs alike, so that the row statement is only ever a cheaper way to run
// the same compare-and-set.
func TestRowIsTheChangeStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.DatabaseURL(t)
	if err := Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	pool, err := OpenPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	l := NewLedger(pool)
	at := time.Now().Add(-time.Minute).Truncate(time.Microsecond)

	steps := func(states ...gate.State) []gate.Step {
		path, err := gate.Path(states[0], states[1:]...)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]gate.Step, len(path))
		for i, e := range path {
			out[i] = gate.Step{Transition: e, Reason: "step " + string(e.To)}
		}
		return out
	}
	write := func(c *gate.Change) {
		t.Helper()
		if err := l.Write(ctx, c); err != nil {
			t.Fatalf("%s: %v", c.Kind, err)
		}
	}
	pending := func(id string) *gate.Operation { return &gate.Operation{ID: id, State: gate.StatePendingEffect} }
	lease := gate.LeaseFacts{Deadline: at.Add(10 * time.Second), Extensions: 2}
	unknown := &gate.Attempt{N: 1, Outcome: gate.OutcomeUnknown, Reason: "no answer"}
	nack := &gate.Answer{N: 1, Decision: gate.Nack, Reason: "effect unknown"}

	cases := []struct {
		name string
		// before brings operation id to where the change applies.
		before func(id string)
		change func(id string) *gate.Change
		want   error
	}{{
		name:   "evidence of the common path",
		change: func(id string) *gate.Change { return benchConfirm(&gate.Operation{ID: id, Key: "twin"}, at) },
	}, {
		name:   "ack mark",
		before: func(id string) { write(benchConfirm(&gate.Operation{ID: id, Key: "twin"}, at)) },
		change: func(id string) *gate.Change {
			return gate.AckedChange(id, gate.StateAckPending, 1, steps(gate.StateAckPending, gate.StateAcknowledged), at)
		},
	}, {
		name: "parked indeterminate",
		change: func(id string) *gate.Change {
			return gate.IndeterminateChange(gate.Settling(pending(id), 1, unknown, nack, lease),
				steps(gate.StatePendingEffect, gate.StateEffectIndeterminate), "operator", "parked", at)
		},
	}, {
		name: "left open",
		change: func(id string) *gate.Change {
			return gate.RetryLaterChange(gate.Settling(pending(id), 1,
				&gate.Attempt{N: 1, Outcome: gate.OutcomeRetryable, StatusCode: 503, Reason: "busy"}, nack, lease),
				"busy", at)
		},
	}, {
		name: "evidence of an operation with a log",
		before: func(id string) {
			write(gate.IndeterminateChange(gate.Settling(pending(id), 1, unknown, nack, lease),
				steps(gate.StatePendingEffect, gate.StateEffectIndeterminate), "operator", "parked", at))
		},
		change: func(id string) *gate.Change {
			w := gate.Settling(&gate.Operation{ID: id, State: gate.StateEffectIndeterminate}, 1, nil, nil, lease)
			return gate.ConfirmChange(w, steps(gate.StateEffectIndeterminate, gate.StateEffectConfirmed), "r-late", "found", at)
		},
	}, {
		name: "stale fence",
		change: func(id string) *gate.Change {
			c := benchConfirm(&gate.Operation{ID: id, Key: "twin"}, at)
			c.Fence = 2
			return c
		},
		want: gate.ErrFenced,
	}, {
		name: "state moved on",
		change: func(id string) *gate.Change {
			return gate.AckedChange(id, gate.StateAckPending, 1, steps(gate.StateAckPending, gate.StateAcknowledged), at)
		},
		want: gate.ErrStateChanged,
	}, {
		name:   "no such operation",
		before: func(id string) {},
		change: func(string) *gate.Change { return benchConfirm(&gate.Operation{ID: "op_absent", Key: "absent"}, at) },
		want:   gate.ErrNotFound,
	}}
	for _, tc := range cases {
		viaRow, viaChange := "op_row-"+tc.name, "op_change-"+tc.name
		for _, id := range []string{viaRow, viaChange} {
			op := benchOperation(id[3:], at)
			write0, err := l.run(ctx, pool, []*job{{kind: claimJob, id: op.ID, change: benchCreating(op, at)}})
			if err != nil || write0[0].err != nil {
				t.Fatalf("%s: create: %v %v", tc.name, err, write0[0].err)
			}
			if tc.before != nil {
				tc.before(id)
			}
		}
		rc, cc := tc.change(viaRow), tc.change(viaChange)
		if !rowOnly(rc) {
			t.Fatalf("%s: the change is not one the row statement takes", tc.name)
		}
		errRow := applyVia(t, ctx, pool, rowSQL, (*changeArgs).rowNamed, rc)
		errChange := applyVia(t, ctx, pool, changeSQL, (*changeArgs).named, cc)
		if !errors.Is(errRow, tc.want) || !errors.Is(errChange, tc.want) || (tc.want == nil) != (errRow == nil) {
			t.Errorf("%s: row statement answered %v, change statement %v; want %v", tc.name, errRow, errChange, tc.want)
		}
		if r, c := rowOf(t, ctx, pool, viaRow), rowOf(t, ctx, pool, viaChange); !maps.Equal(r, c) {
			t.Errorf("%s: the rows differ\nrow statement:    %v\nchange statement: %v", tc.name, r, c)
		}
	}
}

// applyVia writes c through sql alone and returns its answer.
func applyVia(t *testing.T, ctx context.Context, q querier, sql positional, named func(*changeArgs) pgx.StrictNamedArgs,
	c *gate.Change) error {
	t.Helper()
	args := changeArgs{}
	args.add(0, c)
	results := make([]jobResult, 1)
	b := &pgx.Batch{}
	if err := queueChanges(b, sql, named(&args), []int{0}, results); err != nil {
		t.Fatal(err)
	}
	if err := q.SendBatch(ctx, b).Close(); err != nil {
		t.Fatalf("%s: %v", c.Kind, err)
	}
	return results[0].err
}

// rowOf is operation id's row and log, without what tells twins apart, as
// text by column.
func rowOf(t *testing.T, ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, id string) map[string]string {
	t.Helper()
	var raw []byte
	err := q.QueryRow(ctx, `SELECT to_jsonb(o) - '{seq,id,key,scope_key,idempotency_key,message_id,fingerprint,trace_id,created_at}'::text[]
		|| jsonb_build_object('log', (SELECT coalesce(jsonb_agg(to_jsonb(x) - 'operation_id' ORDER BY x.seq), '[]')
			FROM transitions x WHERE x.operation_id = o.id))
		FROM operations o WHERE o.id = $1`, id).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var cols map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cols); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range cols {
		out[k] = string(v)
	}
	return out
}
