package storage_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/storage"
)

// The test login is a member of the built-in pg_signal_backend (testenv
// says so) and of nothing else; it owns the tables it creates, so it can
// grant them to that role. postgres exists and the login is no member of
// it. Roles cannot be created here (no CREATEROLE), so these are the ones
// the checks run against.

func localSpec(role string) *gate.LocalSpec {
	return &gate.LocalSpec{
		SQL:     `INSERT INTO local_orders (idem, op, body) VALUES ($1, $2, $3::jsonb) RETURNING id`,
		Params:  []gate.LocalParam{{Kind: gate.ParamIdempotencyKey}, {Kind: gate.ParamOperationID}, {Kind: gate.ParamDataJSON}},
		Role:    role,
		Timeout: 2 * time.Second,
	}
}

// At start, each local route's statement is planned under its role: a role
// that is missing, one the login may not take, a privilege the role lacks or
// a table that is not there is an error naming the route, before any
// delivery is taken. Nothing is run: the check leaves no row.
func TestCheckLocalRoutes(t *testing.T) {
	t.Parallel()
	r := localRig(t)
	ctx := context.Background()
	route := func(name string, spec *gate.LocalSpec) *gate.Route {
		return &gate.Route{Name: name, Shape: gate.ShapeLocal, Local: spec}
	}
	missingTable := localSpec("")
	missingTable.SQL = strings.Replace(missingTable.SQL, "local_orders", "no_such_table", 1)
	for _, tc := range []struct {
		name string
		spec *gate.LocalSpec
		want string
	}{
		{"missing role", localSpec("no_such_role"), `route "missing role": local: role: "no_such_role" does not exist`},
		{"role the login may not take", localSpec("postgres"), `may not SET ROLE to "postgres"`},
		{"role without the privilege", localSpec("pg_signal_backend"), "role pg_signal_backend lacks a privilege the statement needs: permission denied for table local_orders (SQLSTATE 42501)"},
		{"missing table", missingTable, `route "missing table": local: sql: the statement cannot be planned: relation "no_such_table" does not exist (SQLSTATE 42P01)`},
	} {
		err := storage.CheckLocalRoutes(ctx, r.pool, []*gate.Route{route(tc.name, tc.spec)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	// Every failing route is named, and other shapes are not looked at.
	err := storage.CheckLocalRoutes(ctx, r.pool, []*gate.Route{route("a", localSpec("no_such_role")), route("b", missingTable),
		{Name: "c", Shape: gate.ShapeUnsafe}})
	if err == nil || !strings.Contains(err.Error(), `route "a"`) || !strings.Contains(err.Error(), `route "b"`) {
		t.Fatalf("two bad routes: %v", err)
	}

	// Granted, the same role passes; so does the login's own role.
	r.exec(`GRANT INSERT, SELECT ON local_orders TO pg_signal_backend`)
	r.exec(`GRANT USAGE ON SEQUENCE local_orders_id_seq TO pg_signal_backend`)
	if err := storage.CheckLocalRoutes(ctx, r.pool, []*gate.Route{route("granted", localSpec("pg_signal_backend")), route("own", localSpec(""))}); err != nil {
		t.Fatalf("granted: %v", err)
	}
	// Planning runs nothing: no row, and the sequence was not drawn from.
	if n := r.count(`SELECT count(*) FROM local_orders`); n != 0 {
		t.Fatalf("the check left %d rows", n)
	}
	var called bool
	if err := r.pool.QueryRow(ctx, `SELECT is_called FROM local_orders_id_seq`).Scan(&called); err != nil || called {
		t.Fatalf("the check drew from the sequence: %v %v", called, err)
	}
}

// At run time, a statement that fails for its configuration (a missing or
// forbidden role, a missing privilege or table) is a nack that records
// nothing: no attempt is counted, so it can never become terminal or be
// dead-lettered and acked under dead_letter: gateway, however often the
// broker redelivers. Once the grant is fixed, the next delivery succeeds.
func TestLocalConfigFaultIsANackNeverTerminal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, role, sql, code string
	}{
		{"missing role", "no_such_role", "", "22023"},
		{"role the login may not take", "postgres", "", "42501"},
		{"role without the privilege", "pg_signal_backend", "", "42501"},
		{"missing table", "", `INSERT INTO local_orderz (idem, op, body) VALUES ($1, $2, $3::jsonb) RETURNING id`, "42P01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := localRig(t)
			r.route.DeadLetter, r.route.MaxAttempts = gate.DeadLetterGateway, 2
			r.route.Local.Role = tc.role
			if tc.sql != "" {
				r.route.Local.SQL = tc.sql
			}
			var res *gate.Result
			for range 4 { // twice max_attempts
				m := &gate.Message{Broker: gate.BrokerPubSub, Source: "projects/p/subscriptions/s", MessageID: "m-1",
					Data: []byte(`{"total": 3}`), PublishTime: time.Now()}
				var err error
				res, err = r.gate.Deliver(context.Background(), r.route, m)
				if !errors.Is(err, storage.ErrLocalConfig) || !strings.Contains(err.Error(), "SQLSTATE "+tc.code) ||
					!strings.Contains(err.Error(), "route orders") {
					t.Fatalf("deliver: %v (%s: %s), want a LocalConfigError with SQLSTATE %s", err, res.Decision, res.Reason, tc.code)
				}
				res.Finish(context.Background(), nil, true)
				if res.Decision != gate.Nack {
					t.Fatalf("decision %s (%s), want a nack", res.Decision, res.Reason)
				}
			}
			if n := r.count(`SELECT count(*) FROM operations`) + r.count(`SELECT count(*) FROM attempts`) +
				r.count(`SELECT count(*) FROM dead_letters`) + r.count(`SELECT count(*) FROM local_orders`); n != 0 {
				t.Fatalf("a configuration fault left %d rows", n)
			}
			// Fixed: the same message goes through, once.
			r.route.Local = localSpec("")
			if res := r.push("m-1", `{"total": 3}`, nil); res.Decision != gate.Ack {
				t.Fatalf("after the fix: %s (%s)", res.Decision, res.Reason)
			}
			if n := r.count(`SELECT count(*) FROM local_orders`); n != 1 {
				t.Fatalf("%d rows after the fix", n)
			}
		})
	}
}

// A statement parameter whose attribute the message lacks is a malformed
// message (terminal, with a reason naming the parameter), not a NULL bound
// in silence; a parameter the route marks optional binds NULL.
func TestLocalMissingAttributeIsMalformedUnlessOptional(t *testing.T) {
	t.Parallel()
	r := localRig(t)
	r.exec(`ALTER TABLE local_orders ADD COLUMN region text`)
	r.route.Local.SQL = `INSERT INTO local_orders (idem, op, body, region) VALUES ($1, $2, $3::jsonb, $4) RETURNING id`
	r.route.Local.Params = append(r.route.Local.Params, gate.LocalParam{Kind: gate.ParamAttribute, Name: "region"})

	res := r.push("m-1", `{"total": 1}`, map[string]string{"other": "x"})
	rec := mustGet(t, r.ledger, res.OperationID)
	if rec.State != gate.StateTerminalFailure || rec.Attempts[0].Outcome != gate.OutcomeTerminal ||
		!strings.Contains(rec.Attempts[0].Reason, `parameter $4: the message has no attribute "region"`) {
		t.Fatalf("%+v / %+v", rec.Operation, rec.Attempts)
	}
	if res := r.push("m-2", `{"total": 1}`, map[string]string{"region": "eu"}); res.Decision != gate.Ack {
		t.Fatalf("with the attribute: %s (%s)", res.Decision, res.Reason)
	}

	r.route.Local.Params[3].Optional = true
	if res := r.push("m-3", `{"total": 1}`, nil); res.Decision != gate.Ack {
		t.Fatalf("optional and absent: %s (%s)", res.Decision, res.Reason)
	}
	if n := r.count(`SELECT count(*) FROM local_orders WHERE region IS NULL`); n != 1 {
		t.Fatalf("%d rows with a NULL region, want the optional one", n)
	}
	if n := r.count(`SELECT count(*) FROM local_orders`); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}
}
