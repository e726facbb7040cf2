package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ackgate/ackgate/gate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A local route's statement: run inside the ledger transaction that records
// its evidence (Apply, commitshapes.go), under the route's role and timeout,
// and classified into the outcome the gate decides on.

// runLocal runs the statement and classifies what it did. Only a failure
// of the transaction itself (the connection, the caller's deadline) is an
// error; the statement's own failures are outcomes, already rolled back.
func runLocal(ctx context.Context, tx pgx.Tx, spec *gate.LocalSpec, req *gate.EffectRequest) (gate.EffectResult, error) {
	args, bad := localArgs(spec, req)
	if bad != "" {
		return gate.EffectResult{Outcome: gate.OutcomeTerminal, Reason: bad}, nil
	}
	if _, err := tx.Exec(ctx, `SAVEPOINT local_effect`); err != nil {
		return gate.EffectResult{}, err
	}
	setup := fmt.Sprintf(`SET LOCAL statement_timeout = %d`, max(spec.Timeout.Milliseconds(), 1))
	if spec.Role != "" {
		setup += `; SET LOCAL ROLE ` + pgx.Identifier{spec.Role}.Sanitize()
	}
	var (
		value any
		res   gate.EffectResult
	)
	if _, err := tx.Exec(ctx, setup); err != nil {
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			return gate.EffectResult{}, err
		}
		// No message can make SET ROLE fail: the role is missing or not
		// the login's to take (22023, 42501, 42704).
		return gate.EffectResult{}, &LocalConfigError{Route: req.Route.Name, Role: spec.Role, Code: pe.Code, Step: "taking its role"}
	}
	err := tx.QueryRow(ctx, spec.SQL, args...).Scan(&value)
	switch {
	case err == nil:
		id := resultText(value)
		if value == nil || id == "" {
			res = gate.EffectResult{Outcome: gate.OutcomeTerminal, Reason: "the statement returned no result id"}
		} else {
			res = gate.EffectResult{Outcome: gate.OutcomeConfirmed, ResultID: gate.Bound(id, gate.MaxReason)}
		}
	case errors.Is(err, pgx.ErrNoRows):
		res = gate.EffectResult{Outcome: gate.OutcomeTerminal, Reason: "the statement returned no row: nothing evidences its effect"}
	default:
		var pe *pgconn.PgError
		if !errors.As(err, &pe) && ctx.Err() != nil {
			return gate.EffectResult{}, err // the transaction is gone with the context
		}
		if pe != nil && configFault(pe.Code) {
			return gate.EffectResult{}, &LocalConfigError{Route: req.Route.Name, Role: spec.Role, Code: pe.Code, Step: "running its statement"}
		}
		res = classifyLocal(err)
	}
	if res.Outcome == gate.OutcomeConfirmed {
		// Back to the gateway's own role and no statement timeout for the
		// evidence that follows.
		_, err = tx.Exec(ctx, `RELEASE SAVEPOINT local_effect; RESET ROLE; SET LOCAL statement_timeout = 0`)
	} else {
		// Takes back the statement's writes and the role and timeout with them.
		_, err = tx.Exec(ctx, `ROLLBACK TO SAVEPOINT local_effect`)
	}
	if err != nil {
		return gate.EffectResult{}, err
	}
	return res, nil
}

// ErrLocalConfig is the sentinel every LocalConfigError wraps.
var ErrLocalConfig = gate.ErrLocalConfig

// LocalConfigError is a local statement that failed for its route's
// configuration, not for the message: its role is missing or not the
// login's to take, it lacks a privilege, it names a table, column or
// function that is not there. No retry of the message can cure it and no
// message is at fault, so it is neither an outcome nor terminal: Apply
// returns it as an error, which rolls the whole transaction back (the
// claim too, so no attempt is counted) and makes the delivery a nack, and
// the gateway logs it as a failed delivery until an operator fixes the
// database or the route. Acking or dead-lettering would lose messages
// over a typo.
type LocalConfigError struct {
	Route, Role, Code string
	// Step is what failed: taking the role, or running the statement.
	Step string
}

func (e *LocalConfigError) Error() string {
	role := "the gateway's own role"
	if e.Role != "" {
		role = "role " + e.Role
	}
	return fmt.Sprintf("route %s: local statement failed %s under %s with SQLSTATE %s (%s): a configuration fault, fix the grants, the role or the statement; deliveries are nacked until then",
		e.Route, e.Step, role, e.Code, sqlStateClass(e.Code))
}

func (e *LocalConfigError) Unwrap() error { return ErrLocalConfig }

// configFault reports whether code is a failure of the statement's
// configuration rather than of the message: class 42 (syntax, an access
// rule, an undefined object: 42501 insufficient privilege, 42P01 undefined
// table, 42704 undefined object, ...), 28 (invalid authorization), 0L and
// 0P (invalid grantor, role specification), 3F (invalid schema name) and 25
// (a statement that cannot run in the ledger's transaction). None depends
// on the message's values. A row-level security policy's refusal is 42501
// as well, and so also taken for one: a rule about the data belongs in a
// CHECK constraint, whose refusal (23514) is terminal.
func configFault(code string) bool {
	if len(code) != 5 {
		return false
	}
	switch code[:2] {
	case "42", "28", "0L", "0P", "3F", "25":
		return true
	}
	return false
}

func sqlStateClass(code string) string {
	switch {
	case code == "42501":
		return "insufficient privilege"
	case code == "22023":
		return "invalid parameter value, such as a role that does not exist"
	case code == "42704":
		return "undefined object"
	case code == "42P01":
		return "undefined table"
	case code == "42703":
		return "undefined column"
	case code == "42883":
		return "undefined function"
	case strings.HasPrefix(code, "42"):
		return "syntax error or access rule violation"
	case strings.HasPrefix(code, "25"):
		return "invalid transaction state"
	}
	return "see the Postgres error codes"
}

// classifyLocal sorts a failed statement: what a retry may cure (a timeout,
// a serialization failure, a lock or resource shortage) is retryable; a
// statement the data refuses is terminal. Failures of the configuration
// (configFault) never get here. The reason names the SQLSTATE and
// constraint, never the message, which may quote data.
func classifyLocal(err error) gate.EffectResult {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		// Not the server's answer (the statement's result could not be
		// read): its writes are rolled back, so trying again is safe.
		return gate.EffectResult{Outcome: gate.OutcomeRetryable, Reason: gate.Bound("statement failed: "+err.Error(), gate.MaxReason)}
	}
	reason := "SQLSTATE " + pe.Code
	if pe.ConstraintName != "" {
		reason += " (constraint " + pe.ConstraintName + ")"
	}
	switch {
	case pe.Code == "57014":
		return gate.EffectResult{Outcome: gate.OutcomeRetryable, Reason: reason + ": statement timeout"}
	case strings.HasPrefix(pe.Code, "40"), strings.HasPrefix(pe.Code, "53"), pe.Code == "55P03", pe.Code == "55006":
		return gate.EffectResult{Outcome: gate.OutcomeRetryable, Reason: reason}
	case strings.HasPrefix(pe.Code, "22"), strings.HasPrefix(pe.Code, "23"),
		strings.HasPrefix(pe.Code, "2B"), strings.HasPrefix(pe.Code, "P0"):
		return gate.EffectResult{Outcome: gate.OutcomeTerminal, Reason: reason}
	}
	return gate.EffectResult{Outcome: gate.OutcomeRetryable, Reason: reason}
}

// localArgs binds the statement's parameters, or says why the message
// cannot be bound (a terminal outcome: it will not change on retry).
func localArgs(spec *gate.LocalSpec, req *gate.EffectRequest) ([]any, string) {
	m := req.Message
	args := make([]any, 0, len(spec.Params))
	for i, p := range spec.Params {
		switch p.Kind {
		case gate.ParamDataJSON:
			if !json.Valid(m.Data) {
				return nil, fmt.Sprintf("parameter $%d: the message data is not JSON", i+1)
			}
			args = append(args, json.RawMessage(m.Data))
		case gate.ParamDataBytes:
			args = append(args, nonNilBytes(m.Data))
		case gate.ParamIdempotencyKey:
			args = append(args, req.IdempotencyKey)
		case gate.ParamOperationID:
			args = append(args, req.OperationID)
		case gate.ParamMessageID:
			args = append(args, m.MessageID)
		case gate.ParamAttribute:
			v, ok := m.Attributes[p.Name]
			switch {
			case ok:
				args = append(args, v)
			case p.Optional:
				args = append(args, nil)
			default:
				// Bound as NULL, it would reach the statement as if the
				// publisher had meant "no value".
				return nil, fmt.Sprintf("parameter $%d: the message has no attribute %q (mark it attribute?:%s in the route if it may be absent)", i+1, p.Name, p.Name)
			}
		default:
			return nil, fmt.Sprintf("parameter $%d: unknown kind %q", i+1, p.Kind)
		}
	}
	return args, ""
}

// resultText is the statement's returned value as the result id: text as
// it is, a uuid in its usual form, anything else as Go prints it.
func resultText(v any) string {
	switch x := v.(type) {
	case string:
		return strings.TrimSpace(x)
	case []byte:
		return strings.TrimSpace(string(x))
	case [16]byte:
		return fmt.Sprintf("%x-%x-%x-%x-%x", x[0:4], x[4:6], x[6:8], x[8:10], x[10:16])
	case nil:
		return ""
	}
	return strings.TrimSpace(fmt.Sprint(v))
}
