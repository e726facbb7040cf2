package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ackgate/ackgate/gate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The two shapes whose evidence is a commit write outside the shared
// commits of write.go: each needs more than the named change in its
// transaction (an outbox entry; the route's own statement). They run the
// same ackgate_write as everyone else, so the same guards judge them.

var _ gate.Local = (*Ledger)(nil)

// writeIn runs one named change inside tx.
func writeIn(ctx context.Context, tx pgx.Tx, c *gate.Change) error {
	wire, err := encode(c)
	if err != nil {
		return fmt.Errorf("storage: write: %w", err)
	}
	var answer string
	if err := tx.QueryRow(ctx, `SELECT ackgate_write($1::jsonb)`, wire).Scan(&answer); err != nil {
		return translate("write", err)
	}
	return answerError(answer)
}

// handoff commits a handoff route's claim with its outbox entry.
func (l *Ledger) handoff(ctx context.Context, c *gate.Change) error {
	e, m := c.Outbox, c.Outbox.Message
	attrs, err := json.Marshal(m.Attributes)
	if err != nil {
		return fmt.Errorf("storage: handoff: %w", err)
	}
	var published *time.Time
	if !m.PublishTime.IsZero() {
		published = &m.PublishTime
	}
	err = pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if err := writeIn(ctx, tx, c); err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO outbox (operation_id, route, publication_id, broker, source, message_id,
				publish_time, ordering_key, attributes, data, created_at, next_attempt_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
			ON CONFLICT (operation_id) DO NOTHING`,
			e.OperationID, e.Route, e.PublicationID, m.Broker, m.Source, m.MessageID, published,
			m.OrderingKey, attrs, nonNilBytes(m.Data), orNow(e.CreatedAt), orNow(e.NextAttemptAt))
		b.Queue(`UPDATE operations SET handed_off_at = $2 WHERE id = $1 AND handed_off_at IS NULL`,
			c.OperationID, orNow(c.At))
		return tx.SendBatch(ctx, b).Close()
	})
	return translate("handoff", err)
}

func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// Apply implements gate.Local: the claim, the statement and its settlement
// in one transaction. The statement runs inside a savepoint, under the
// route's role and timeout, so its failure takes back its own writes and
// nothing else, and the settlement records that failure.
func (l *Ledger) Apply(ctx context.Context, start *gate.Change, req *gate.EffectRequest, settle func(gate.EffectResult) (*gate.Change, error)) error {
	spec := req.Route.Local
	if spec == nil {
		return fmt.Errorf("storage: local: route %s has no statement", req.Route.Name)
	}
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if err := writeIn(ctx, tx, start); err != nil {
			return err
		}
		res, err := runLocal(ctx, tx, spec, req)
		if err != nil {
			return err
		}
		c, err := settle(res)
		if err != nil {
			return err
		}
		return writeIn(ctx, tx, c)
	})
	return translate("local", err)
}

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
	_, err := tx.Exec(ctx, setup)
	if err == nil {
		err = tx.QueryRow(ctx, spec.SQL, args...).Scan(&value)
	}
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

// classifyLocal sorts a failed statement: what a retry may cure (a timeout,
// a serialization failure, a lock or resource shortage) is retryable; a
// statement the data or the schema refuses is terminal. The reason names
// the SQLSTATE and constraint, never the message, which may quote data.
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
	case strings.HasPrefix(pe.Code, "22"), strings.HasPrefix(pe.Code, "23"), strings.HasPrefix(pe.Code, "42"),
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
			if v, ok := m.Attributes[p.Name]; ok {
				args = append(args, v)
			} else {
				args = append(args, nil)
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
