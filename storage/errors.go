package storage

import (
	"errors"
	"fmt"

	"github.com/ackgate/ackgate/gate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var (
	// ErrRefused means the ledger's own rules turned a write down: an illegal
	// transition, a fence going backwards, a rewrite of history. It is a bug in
	// the caller, never a condition to retry.
	ErrRefused = errors.New("ledger refused the change")
)

// translate is the one place that turns Postgres errors into the sentinels the
// gate sorts on. The original error stays in the chain for logs.
func translate(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("storage: %s: %w", op, gate.ErrNotFound)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("storage: %s: %w", op, err)
	}
	var sentinel error
	switch pgErr.Code {
	case "23505": // unique_violation: another owner created it first
		sentinel = gate.ErrExists
	case "23503", "AG010": // foreign_key_violation: the operation is not there
		sentinel = gate.ErrNotFound
	case "AG011":
		sentinel = gate.ErrFenced
	case "AG012":
		sentinel = gate.ErrStateChanged
	case "AG001", "AG002", "AG003", "AG004", "AG005", "AG020",
		"23514": // check_violation: the schema's own constraints
		sentinel = ErrRefused
	default:
		return fmt.Errorf("storage: %s: %w", op, err)
	}
	return fmt.Errorf("storage: %s: %w: %w", op, sentinel, err)
}
