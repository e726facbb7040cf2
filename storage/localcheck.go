package storage

import (
	"context"
	"errors"
	"fmt"

	"github.com/ackgate/ackgate/gate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// CheckLocalRoutes checks, before the gateway takes a delivery, that every
// local route's statement can run as configured: its role exists, the
// gateway's login may SET ROLE to it, and under that role the statement
// plans with the privileges it needs. A route that fails would otherwise
// nack every delivery (LocalConfigError); at start it is one clear error
// naming the route.
//
// The statement is planned, never run: EXPLAIN under SET LOCAL ROLE inside
// a transaction that is rolled back, with every parameter NULL. Planning
// checks the privileges on every table and view the statement names, and
// EXECUTE on the functions it calls that the planner does not fold away
// (a strict function given a NULL parameter may be); what a function does
// inside, under its own rights, is not planned and not checked.
func CheckLocalRoutes(ctx context.Context, pool *pgxpool.Pool, routes []*gate.Route) error {
	var errs []error
	for _, r := range routes {
		if r.Shape != gate.ShapeLocal || r.Local == nil {
			continue
		}
		if err := checkLocal(ctx, pool, r.Local); err != nil {
			errs = append(errs, fmt.Errorf("route %q: local: %w", r.Name, err))
		}
	}
	return errors.Join(errs...)
}

func checkLocal(ctx context.Context, pool *pgxpool.Pool, spec *gate.LocalSpec) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if spec.Role != "" {
		var exists, member bool
		var login string
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1),
				COALESCE((SELECT pg_has_role(current_user, oid, 'MEMBER') FROM pg_roles WHERE rolname = $1), false),
				current_user`, spec.Role).Scan(&exists, &member, &login); err != nil {
			return err
		}
		switch {
		case !exists:
			return fmt.Errorf("role: %q does not exist in the ledger's database", spec.Role)
		case !member:
			return fmt.Errorf("role: the gateway's login %q may not SET ROLE to %q (GRANT %s TO %s)", login, spec.Role,
				pgx.Identifier{spec.Role}.Sanitize(), pgx.Identifier{login}.Sanitize())
		}
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+pgx.Identifier{spec.Role}.Sanitize()); err != nil {
			return fmt.Errorf("role: SET ROLE %q: %w", spec.Role, describePg(err))
		}
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL statement_timeout = %d`, max(spec.Timeout.Milliseconds(), 1))); err != nil {
		return err
	}
	args := make([]any, len(spec.Params))
	if _, err := tx.Exec(ctx, `EXPLAIN `+spec.SQL, args...); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" {
			who := "the gateway's login"
			if spec.Role != "" {
				who = "role " + spec.Role
			}
			return fmt.Errorf("sql: %s lacks a privilege the statement needs: %w", who, describePg(err))
		}
		return fmt.Errorf("sql: the statement cannot be planned: %w", describePg(err))
	}
	return nil
}

// describePg is a server error as its message and SQLSTATE. At start the
// statement has no message's values, so the message can name the object
// it is about without quoting anyone's data.
func describePg(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s (SQLSTATE %s)", pe.Message, pe.Code)
	}
	return err
}
