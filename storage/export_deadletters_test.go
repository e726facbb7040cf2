package storage

import "github.com/ackgate/ackgate/adminapi"

// DeadLettersQuery exposes the listing's SQL, for its plan.
func (l *Ledger) DeadLettersQuery(f adminapi.DeadLetterFilter) (string, []any, error) {
	sql, args, _, err := deadLettersQuery(f)
	return sql, args, err
}
