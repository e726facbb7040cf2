package storage

import (
	"context"
	_ "embed"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ackgate/ackgate/gate"
)

// schemaSQL is the ledger stated once: its DDL, then the named queries the
// write path runs. Keeping the queries beside the tables they guard lets a
// reader check each WHERE clause against the constraints and triggers it
// relies on without leaving the file.
//
//go:embed schema.sql
var schemaSQL string

// schemaDDL is schema.sql up to its first named query: the tables,
// constraints, indexes and functions a migrated database holds.
var schemaDDL, queries = splitSchema(schemaSQL)

// Named queries, by the name their "-- name:" line gives.
var (
	claimSQL = query("claim")
	// claimPlainSQL is the claim for a batch that carries no dead letter and
	// no outbox entry, the common path's: without the statements that would
	// write them.
	claimPlainSQL = query("claim", sideRowsSection)
	changeSQL     = query("change")
	rowSQL        = query("row")
	answerSQL     = query("answer")
)

// positional is a named query rewritten once into the positional
// parameters the server takes ($1, $2, ...), with the names in their
// order. pgx would otherwise lex the whole statement for its @names on
// every run: 5% of the gateway's CPU under load.
type positional struct {
	sql   string
	names []string
}

var namedParam = regexp.MustCompile(`@(\w+)`)

func query(name string, drop ...string) positional {
	q := expanded(name, drop...)
	na := pgx.NamedArgs{}
	for _, m := range namedParam.FindAllStringSubmatch(q, -1) {
		na[m[1]] = m[1]
	}
	sql, args, err := na.RewriteQuery(context.Background(), nil, q, nil)
	if err != nil {
		panic("storage: query " + name + ": " + err.Error())
	}
	p := positional{sql: sql, names: make([]string, len(args))}
	for i, a := range args {
		p.names[i] = a.(string)
	}
	return p
}

// sideRowsSection is the claim's section that writes a dead letter or an
// outbox entry as it creates an operation (claimPlainSQL goes without it).
const sideRowsSection = "dead letters and handoffs"

// expanded is the named query as the server gets it (its comments out, its
// column lists in), without the sections named in drop: the lines from
// "-- begin: <section>" to "-- end: <section>". The named queries are
// expanded as the package starts (the variables above), so one that lost
// its placeholder expansion fails then, not at the first delivery.
func expanded(name string, drop ...string) string {
	q, ok := queries[name]
	if !ok {
		panic("storage: schema.sql has no query " + name)
	}
	for _, section := range drop {
		var cut bool
		if q, cut = withoutSection(q, section); !cut {
			panic("storage: query " + name + " has no section " + section)
		}
	}
	q = expandColumns(withoutComments(q))
	if strings.Contains(q, "{{") {
		panic(fmt.Sprintf("storage: query %s keeps an unexpanded column list", name))
	}
	return q
}

// bind orders args as the query's parameters, each named once: a name
// missing, or one the query does not take, is the caller's mistake.
func (p positional) bind(args map[string]any) ([]any, error) {
	if len(args) != len(p.names) {
		return nil, fmt.Errorf("storage: %d arguments for %d parameters", len(args), len(p.names))
	}
	out := make([]any, len(p.names))
	for i, n := range p.names {
		v, ok := args[n]
		if !ok {
			return nil, fmt.Errorf("storage: no argument %s", n)
		}
		out[i] = v
	}
	return out, nil
}

var queryName = regexp.MustCompile(`(?m)^-- name: (\w+)\n`)

// splitSchema cuts schema.sql into its DDL and its named queries, as they
// are written there (query expands them).
func splitSchema(s string) (string, map[string]string) {
	marks := queryName.FindAllStringSubmatchIndex(s, -1)
	if len(marks) == 0 {
		panic("storage: schema.sql names no query")
	}
	// The DDL ends where the comment introducing the queries begins.
	ddl := s[:marks[0][0]]
	if i := strings.LastIndex(ddl, "\n\n-- The queries below"); i >= 0 {
		ddl = ddl[:i+1]
	}
	out := map[string]string{}
	for i, m := range marks {
		end := len(s)
		if i+1 < len(marks) {
			end = marks[i+1][0]
		}
		out[s[m[2]:m[3]]] = s[m[1]:end]
	}
	return ddl, out
}

// withoutSection is q without the lines from "-- begin: section" to
// "-- end: section", and whether they were there.
func withoutSection(q, section string) (string, bool) {
	begin, end := "-- begin: "+section+"\n", "-- end: "+section+"\n"
	i := strings.Index(q, begin)
	j := strings.Index(q, end)
	if i < 0 || j < i {
		return q, false
	}
	return q[:i] + q[j+len(end):], true
}

// withoutComments is q without its whole-line comments, which are for the
// reader of schema.sql, not for the server.
func withoutComments(q string) string {
	var out []string
	for line := range strings.Lines(q) {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			out = append(out, line)
		}
	}
	return strings.TrimSpace(strings.Join(out, ""))
}

var columnList = regexp.MustCompile(`\{\{(operation|attempt) (\w+)\}\}`)

func expandColumns(q string) string {
	return columnList.ReplaceAllStringFunc(q, func(m string) string {
		parts := columnList.FindStringSubmatch(m)
		cols := operationCols
		if parts[1] == "attempt" {
			cols = attemptCols
		}
		return qualify(parts[2], cols)
	})
}

func qualify(alias string, cols []string) string {
	out := make([]string, len(cols))
	for i, c := range cols {
		if strings.ContainsAny(c, "(") {
			out[i] = strings.ReplaceAll(c, "$.", alias+".")
		} else {
			out[i] = alias + "." + c
		}
	}
	return strings.Join(out, ", ")
}

// operationCols and scanOperation change together: one names the columns
// of an operations row the gate reads, the other where each lands.
var operationCols = []string{
	"id", "scope_key", "tenant", "route", "key_source", "key", "fingerprint", "fingerprint_version",
	"coalesce($.conflict_of, '')", "state", "shape", "dead_letter_policy", "contract_version",
	"idempotency_key", "fence", "owner", "lease_start", "lease_deadline", "lease_extensions", "lease_lost_at",
	"delivery_count", "attempt_count", "grant_through", "next_check_at", "checks", "handed_off_at",
	"result_id", "evidence_at", "acked_at", "reason", "lane", "trace_id", "span_id", "created_at",
	"updated_at", "retain_until",
	"a1_fence", "a1_contract", "a1_started_at", "a1_finished_at", "a1_outcome", "a1_status",
	"a1_result_id", "a1_reason",
}

// attemptCols are an attempts row's columns as scanAttempt reads them.
var attemptCols = []string{"n", "kind", "fence", "contract_version", "started_at", "finished_at", "outcome",
	"status_code", "result_id", "reason"}

// scannedOperation is an operations row as read, with the first attempt,
// which is part of it, apart until the newest effect attempt is known.
type scannedOperation struct {
	op gate.Operation
	a1 struct {
		fence                     *int64
		contract                  *string
		started, finished         *time.Time
		outcome, resultID, reason string
		status                    int
	}
}

func (s *scannedOperation) fields() []any {
	o := &s.op
	return []any{&o.ID, &o.ScopeKey, &o.Tenant, &o.Route, &o.KeySource, &o.Key, &o.Fingerprint,
		&o.FingerprintVersion, &o.ConflictOf, &o.State, &o.Shape, &o.DeadLetterPolicy, &o.ContractVersion,
		&o.IdempotencyKey, &o.Fence, &o.Owner, &o.LeaseStart, &o.LeaseDeadline, &o.LeaseExtensions,
		&o.LeaseLostAt, &o.DeliveryCount, &o.AttemptCount, &o.Grant, &o.NextCheckAt, &o.Checks,
		&o.HandedOffAt, &o.ResultID, &o.EvidenceAt, &o.AckedAt, &o.Reason, &o.Lane, &o.TraceID, &o.SpanID,
		&o.CreatedAt, &o.UpdatedAt, &o.RetainUntil,
		&s.a1.fence, &s.a1.contract, &s.a1.started, &s.a1.finished, &s.a1.outcome, &s.a1.status,
		&s.a1.resultID, &s.a1.reason}
}

// first is the operation's first attempt, nil when it has none.
func (s *scannedOperation) first() *gate.Attempt {
	if s.a1.started == nil {
		return nil
	}
	a := &gate.Attempt{N: 1, Kind: gate.AttemptEffect, IdempotencyKey: s.op.IdempotencyKey, Fence: *s.a1.fence,
		StartedAt: *s.a1.started, FinishedAt: s.a1.finished, Outcome: gate.Outcome(s.a1.outcome),
		StatusCode: s.a1.status, ResultID: s.a1.resultID, Reason: s.a1.reason, ContractVersion: s.op.ContractVersion}
	if s.a1.contract != nil {
		a.ContractVersion = *s.a1.contract
	}
	return a
}

// operation finishes the row: its first effect attempt anchors the dedupe
// window, and its newest effect attempt is latest, or the first when no
// later one exists.
func (s *scannedOperation) operation(latest *gate.Attempt) *gate.Operation {
	op := s.op
	if first := s.first(); first != nil {
		op.FirstAttemptAt = &first.StartedAt
		op.LastAttempt = first
	}
	if latest != nil {
		op.LastAttempt = latest
	}
	return &op
}

// scannedAttempt is an attempts row, every column nullable because it is
// read through a LEFT JOIN.
type scannedAttempt struct {
	n, status                                 *int
	kind, contract, outcome, resultID, reason *string
	fence                                     *int64
	started, finished                         *time.Time
}

func (a *scannedAttempt) fields() []any {
	return []any{&a.n, &a.kind, &a.fence, &a.contract, &a.started, &a.finished, &a.outcome, &a.status,
		&a.resultID, &a.reason}
}

// attempt is the row, nil when the join found none.
func (a *scannedAttempt) attempt(key string) *gate.Attempt {
	if a.n == nil {
		return nil
	}
	return &gate.Attempt{N: *a.n, Kind: gate.AttemptKind(*a.kind), IdempotencyKey: key, Fence: *a.fence,
		ContractVersion: *a.contract, StartedAt: *a.started, FinishedAt: a.finished, Outcome: gate.Outcome(*a.outcome),
		StatusCode: *a.status, ResultID: *a.resultID, Reason: *a.reason}
}

// findSQL reads an operation by id with its newest effect attempt after the
// first: one round trip, the row through its unique id.
var findSQL = expandColumns(`
SELECT {{operation o}}, {{attempt la}}
FROM operations o
LEFT JOIN LATERAL (
	SELECT * FROM attempts a
	WHERE o.attempt_count > 1 AND a.operation_id = o.id AND a.kind = 'effect'
	ORDER BY a.n DESC LIMIT 1
) la ON true
WHERE o.id = $1`)

func scanFound(r pgx.Row) (*gate.Operation, error) {
	var (
		s  scannedOperation
		la scannedAttempt
	)
	if err := r.Scan(append(s.fields(), la.fields()...)...); err != nil {
		return nil, err
	}
	return s.operation(la.attempt(s.op.IdempotencyKey)), nil
}
