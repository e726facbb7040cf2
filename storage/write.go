package storage

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ackgate/ackgate/gate"
)

// Group commit.
//
// A commit costs a WAL flush, and on a busy ledger the flushes, not the
// statements, bound throughput. So concurrent deliveries' writes share one:
// each Write queues its change, and a caller that finds fewer than
// maxFlushers running starts one: a goroutine of the ledger's own that takes
// everything queued so far, up to maxBatch, to the server as one statement
// in one implicit transaction, hands each caller its own answer, and goes on
// until the queue is empty. Nothing waits on a timer: a change that arrives
// while a batch is on the wire simply rides the next one, so under load
// batches grow by themselves and a lone delivery pays only a goroutine
// handoff. The flushers are the ledger's rather than a caller's so that no
// delivery's goroutine runs other deliveries' batches on its stack, which
// would grow that stack for the rest of its life.
//
// A batch of distinct operations is applied whole by ackgate_write_batch
// (migrations/0017_set_based_batches.sql) in a fixed number of statements;
// otherwise, and again when that raises, each change runs inside
// ackgate_write's own subtransaction. Either way each change answers with a
// word rather than raising: a fenced or refused change writes nothing and
// never fails a neighbour. If the shared statement itself fails (the
// connection drops, the commit fails), every change in it gets the error, so
// no caller acks on a commit that did not happen.

const (
	// maxBatch stays under the 64 subtransactions a Postgres backend tracks
	// without overflowing to pg_subtrans, which would slow every snapshot.
	maxBatch = 32
	// maxFlushers bounds the connections group commit holds at once, leaving
	// the rest of the pool to reads.
	maxFlushers = 2
)

const writeSQL = `SELECT ackgate_write(c) FROM unnest($1::jsonb[]) WITH ORDINALITY AS t(c, i) ORDER BY i`

// writeBatchSQL applies a batch with a fixed number of statements
// (migrations/0017_set_based_batches.sql) and answers with the same words.
const writeBatchSQL = `SELECT ackgate_write_batch($1::jsonb[])`

// minSetBatch is the smallest batch sent set-based. The set-based
// statement's work is mostly fixed per batch (a dozen statements whatever
// its size), so a small batch pays more for it than for ackgate_write
// change by change: BenchmarkLedgerCost measured Postgres CPU per message
// at 1.5× the per-change path for one change, 1.0× for four, 0.83× for
// eight and 0.81× for sixteen. A delivery alone, the latency case, sends
// batches of one.
const minSetBatch = 6

type pending struct {
	id   string
	wire []byte
	done chan error
}

type committer struct {
	mu       sync.Mutex
	queue    []*pending
	flushers int
	// batches and changes count what went to the server, for tests and
	// benchmarks that check the sharing.
	batches, changes int
	// paths counts how batches were applied, for the tests and benchmarks
	// that check which way a batch went.
	paths BatchPaths
	// setFrom, when set, replaces minSetBatch: tests send small batches
	// set-based, or none (above maxBatch) for the per-change baseline.
	setFrom int
}

// BatchPaths counts the batches that went each way to the server.
type BatchPaths struct {
	// SetBased batches went to ackgate_write_batch alone: it applied
	// them, or they failed in a way that left their outcome unknown.
	SetBased int
	// FellBack batches raised in ackgate_write_batch, which took all of it
	// back, and were sent again change by change.
	FellBack int
	// PerChange batches were smaller than minSetBatch or held two changes
	// of one operation, and went change by change at once.
	PerChange int
}

// write queues one encoded change and returns its own answer.
func (l *Ledger) write(ctx context.Context, id string, wire []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p := &pending{id: id, wire: wire, done: make(chan error, 1)}
	c := &l.commit
	c.mu.Lock()
	c.queue = append(c.queue, p)
	start := c.flushers < maxFlushers
	if start {
		c.flushers++
	}
	c.mu.Unlock()
	if start {
		go l.flush()
	}
	// Once queued, a change may commit whatever the caller's context says
	// afterwards, so the caller waits for the answer that tells it so.
	return <-p.done
}

// flush sends batches until the queue is empty.
func (l *Ledger) flush() {
	c := &l.commit
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.flushers--
			c.mu.Unlock()
			return
		}
		n := min(len(c.queue), maxBatch)
		batch := slices.Clone(c.queue[:n])
		c.queue = slices.Delete(c.queue, 0, n)
		c.batches++
		c.changes += n
		c.mu.Unlock()
		l.send(batch)
	}
}

// send runs one batch. Changes are ordered by operation id (keeping each
// operation's own changes in their order) so two batches lock rows in the
// same order and cannot deadlock each other.
//
// A batch goes to ackgate_write_batch when it has at least minSetBatch
// changes and every change in it names an operation of its own; every kind
// that reaches write is one the function applies (Write sends handoffs and
// interventions their own ways). That is decided here, before sending,
// rather than by a marker from the server: the function
// judges every change against the rows as the batch found them, while the
// second change of an operation must be judged after the first is written,
// and a round trip to learn so would cost more than the check. If the
// function raises, the server answered and the implicit transaction took
// back everything, so the same batch goes again change by change, each in
// its own subtransaction, and each change gets the answer it alone earns.
// Any other failure (a dropped connection, an unknown commit) fails every
// change: resending a batch that may have committed could write it twice.
func (l *Ledger) send(batch []*pending) {
	slices.SortStableFunc(batch, func(a, b *pending) int { return strings.Compare(a.id, b.id) })
	arg := make([]string, len(batch))
	set := len(batch) >= cmp.Or(l.commit.setFrom, minSetBatch)
	for i, p := range batch {
		arg[i] = string(p.wire)
		set = set && (i == 0 || batch[i-1].id != p.id)
	}
	// The batch belongs to no single caller, so no caller's context may
	// cancel it halfway; it is bounded on its own.
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	var (
		answers []string
		err     error
		path    *int
	)
	if set {
		path = &l.commit.paths.SetBased
		err = l.pool.QueryRow(ctx, writeBatchSQL, arg).Scan(&answers)
		if rolledBack(err) {
			path = &l.commit.paths.FellBack
			answers, err = l.perChange(ctx, arg)
		}
	} else {
		path = &l.commit.paths.PerChange
		answers, err = l.perChange(ctx, arg)
	}
	l.commit.mu.Lock()
	*path++
	l.commit.mu.Unlock()
	if err == nil && len(answers) != len(batch) {
		err = fmt.Errorf("%d answers for %d changes", len(answers), len(batch))
	}
	for i, p := range batch {
		if err != nil {
			p.done <- translate("write", err)
			continue
		}
		p.done <- answerError(answers[i])
	}
}

// rolledBack says whether err is the server's own refusal of a statement,
// after which the implicit transaction has rolled back. Only an ERROR says
// so: a FATAL may end a session whose commit already happened (one
// terminated while it waited for a synchronous standby), and an error the
// server did not send leaves the outcome unknown.
func rolledBack(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && cmp.Or(pgErr.SeverityUnlocalized, pgErr.Severity) == "ERROR"
}

// perChange runs each change of a batch through ackgate_write, in one
// statement and one commit.
func (l *Ledger) perChange(ctx context.Context, arg []string) ([]string, error) {
	answers := make([]string, 0, len(arg))
	rows, err := l.pool.Query(ctx, writeSQL, arg)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var a string
		if err = rows.Scan(&a); err != nil {
			break
		}
		answers = append(answers, a)
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	return answers, err
}

// batchTimeout bounds one shared statement. It is generous: a batch that
// takes longer is a ledger in trouble, and every delivery in it nacks.
const batchTimeout = 30 * time.Second

// answerError turns ackgate_write's answer into the gate's sentinels.
func answerError(a string) error {
	switch a {
	case "ok":
		return nil
	case "not_found":
		return fmt.Errorf("storage: write: %w", gate.ErrNotFound)
	case "fenced":
		return fmt.Errorf("storage: write: %w", gate.ErrFenced)
	case "state_changed":
		return fmt.Errorf("storage: write: %w", gate.ErrStateChanged)
	case "exists":
		return fmt.Errorf("storage: write: %w", gate.ErrExists)
	}
	// "error SQLSTATE: message": the same translation as a raised error.
	if rest, ok := strings.CutPrefix(a, "error "); ok {
		code, msg, _ := strings.Cut(rest, ": ")
		return translate("write", &pgconn.PgError{Code: code, Message: msg, Severity: "ERROR"})
	}
	return fmt.Errorf("storage: write: unexpected answer %q", a)
}

// GroupCommitStats says how many shared statements carried how many changes.
func (l *Ledger) GroupCommitStats() (batches, changes int) {
	l.commit.mu.Lock()
	defer l.commit.mu.Unlock()
	return l.commit.batches, l.commit.changes
}

// GroupCommitPaths says how many batches went each way to the server.
func (l *Ledger) GroupCommitPaths() BatchPaths {
	l.commit.mu.Lock()
	defer l.commit.mu.Unlock()
	return l.commit.paths
}

// The wire form of a change: what ackgate_write reads. Times are cut to the
// microsecond Postgres keeps, as pgx does for its own parameters.

type wireChange struct {
	Kind       gate.ChangeKind `json:"kind"`
	ID         string          `json:"id"`
	Expect     gate.State      `json:"expect,omitempty"`
	Fence      int64           `json:"fence"`
	At         wireTime        `json:"at"`
	Reason     string          `json:"reason"`
	Steps      []wireStep      `json:"steps,omitempty"`
	Claim      *wireClaim      `json:"claim,omitempty"`
	Settle     *wireSettle     `json:"settle,omitempty"`
	Delivery   *wireDelivery   `json:"delivery,omitempty"`
	Start      *wireAttempt    `json:"start,omitempty"`
	ResultID   string          `json:"result_id"`
	Lane       string          `json:"lane"`
	DeadLetter *wireDeadLetter `json:"dead_letter,omitempty"`
}

type wireStep struct {
	From   gate.State `json:"from,omitempty"`
	To     gate.State `json:"to"`
	Reason string     `json:"reason"`
}

type wireClaim struct {
	Row           *wireRow      `json:"row,omitempty"`
	Owner         string        `json:"owner"`
	LeaseDeadline wireTime      `json:"lease_deadline"`
	TraceID       string        `json:"trace_id"`
	Delivery      *wireDelivery `json:"delivery,omitempty"`
}

type wireRow struct {
	ScopeKey           string   `json:"scope_key"`
	Tenant             string   `json:"tenant"`
	Route              string   `json:"route"`
	KeySource          string   `json:"key_source"`
	Key                string   `json:"key"`
	Fingerprint        string   `json:"fingerprint"`
	FingerprintVersion int      `json:"fingerprint_version"`
	Shape              string   `json:"shape"`
	DeadLetterPolicy   string   `json:"dead_letter_policy"`
	ContractVersion    string   `json:"contract_version"`
	IdempotencyKey     string   `json:"idempotency_key"`
	SpanID             string   `json:"span_id"`
	CreatedAt          wireTime `json:"created_at"`
	RetainUntil        wireTime `json:"retain_until"`
}

type wireSettle struct {
	Finish          *wireFinish `json:"finish,omitempty"`
	Answer          *wireAnswer `json:"answer,omitempty"`
	LeaseExtensions int         `json:"lease_extensions"`
	LeaseDeadline   wireTime    `json:"lease_deadline"`
	LeaseLostAt     *wireTime   `json:"lease_lost_at,omitempty"`
}

type wireDelivery struct {
	Broker        string   `json:"broker"`
	Source        string   `json:"source"`
	MessageID     string   `json:"message_id"`
	BrokerAttempt int      `json:"broker_attempt"`
	ReceivedAt    wireTime `json:"received_at"`
	Decision      string   `json:"decision"`
	Reason        string   `json:"reason"`
	Anomaly       string   `json:"anomaly"`
	TraceID       string   `json:"trace_id"`
	Owner         string   `json:"owner"`
	// PublishTime is the broker's; nil when it sent none.
	PublishTime *wireTime `json:"publish_time,omitempty"`
}

type wireAnswer struct {
	Owner    string `json:"owner"`
	Decision string `json:"decision"`
	Reason   string `json:"reason"`
}

type wireAttempt struct {
	N              int      `json:"n"`
	Kind           string   `json:"kind"`
	IdempotencyKey string   `json:"idempotency_key"`
	StartedAt      wireTime `json:"started_at"`
}

type wireFinish struct {
	N          int      `json:"n"`
	FinishedAt wireTime `json:"finished_at"`
	Outcome    string   `json:"outcome"`
	StatusCode int      `json:"status_code"`
	ResultID   string   `json:"result_id"`
	Reason     string   `json:"reason"`
}

type wireDeadLetter struct {
	Reason string   `json:"reason"`
	At     wireTime `json:"at"`
}

type wireTime time.Time

// MarshalJSON appends the quoted time in one buffer; RFC 3339 has nothing a
// JSON string must escape.
func (t wireTime) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, len(`"2006-01-02T15:04:05.999999Z"`))
	b = append(b, '"')
	b = time.Time(t).UTC().Truncate(time.Microsecond).AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), nil
}

func encodeDelivery(d *gate.Delivery) *wireDelivery {
	if d == nil {
		return nil
	}
	w := &wireDelivery{Broker: string(d.Broker), Source: d.Source, MessageID: d.MessageID,
		BrokerAttempt: d.BrokerAttempt, ReceivedAt: wireTime(d.ReceivedAt), Decision: string(d.Decision),
		Reason: d.Reason, Anomaly: d.Anomaly, TraceID: d.TraceID, Owner: d.Owner}
	if d.PublishTime != nil {
		published := wireTime(*d.PublishTime)
		w.PublishTime = &published
	}
	return w
}

// encode is the one place a gate.Change becomes what the server runs.
func encode(c *gate.Change) ([]byte, error) {
	at := orNow(c.At)
	w := wireChange{Kind: c.Kind, ID: c.OperationID, Expect: c.Expect, Fence: c.Fence, At: wireTime(at),
		Reason: c.Reason, ResultID: c.ResultID, Lane: c.Lane}
	for _, s := range c.Steps {
		w.Steps = append(w.Steps, wireStep{From: s.From, To: s.To, Reason: s.Reason})
	}
	if cl := c.Claim; cl != nil {
		w.Claim = &wireClaim{Owner: cl.Owner, LeaseDeadline: wireTime(cl.LeaseDeadline), TraceID: cl.TraceID,
			Delivery: encodeDelivery(cl.Delivery)}
		if r := cl.Row; r != nil {
			created := r.CreatedAt
			if created.IsZero() {
				created = at
			}
			w.Claim.Row = &wireRow{ScopeKey: r.ScopeKey, Tenant: r.Tenant, Route: r.Route,
				KeySource: string(r.KeySource), Key: r.Key, Fingerprint: r.Fingerprint,
				FingerprintVersion: r.FingerprintVersion, Shape: string(r.Shape),
				DeadLetterPolicy: string(r.DeadLetterPolicy), ContractVersion: r.ContractVersion,
				IdempotencyKey: r.IdempotencyKey, SpanID: r.SpanID, CreatedAt: wireTime(created),
				RetainUntil: wireTime(r.RetainUntil)}
		}
	}
	if s := c.Settle; s != nil {
		w.Settle = &wireSettle{LeaseExtensions: s.Lease.Extensions, LeaseDeadline: wireTime(s.Lease.Deadline)}
		if s.Lease.LostAt != nil {
			lost := wireTime(*s.Lease.LostAt)
			w.Settle.LeaseLostAt = &lost
		}
		if a := s.Answer; a != nil {
			w.Settle.Answer = &wireAnswer{Owner: a.Owner, Decision: string(a.Decision), Reason: a.Reason}
		}
		if f := s.Finish; f != nil {
			finished := at
			if f.FinishedAt != nil {
				finished = *f.FinishedAt
			}
			w.Settle.Finish = &wireFinish{N: f.N, FinishedAt: wireTime(finished), Outcome: string(f.Outcome),
				StatusCode: f.StatusCode, ResultID: f.ResultID, Reason: f.Reason}
		}
	}
	if a := c.Start; a != nil {
		started := a.StartedAt
		if started.IsZero() {
			started = at
		}
		w.Start = &wireAttempt{N: a.N, Kind: string(a.Kind), IdempotencyKey: a.IdempotencyKey, StartedAt: wireTime(started)}
	}
	if dl := c.DeadLetter; dl != nil {
		when := dl.At
		if when.IsZero() {
			when = at
		}
		w.DeadLetter = &wireDeadLetter{Reason: dl.Reason, At: wireTime(when)}
	}
	return json.Marshal(w)
}

// encodeDeliveryOnly is the wire form of RecordDelivery.
func encodeDeliveryOnly(d *gate.Delivery) ([]byte, error) {
	if d.OperationID == "" {
		return nil, errors.New("storage: record delivery: no operation id")
	}
	return json.Marshal(wireChange{Kind: "delivery", ID: d.OperationID, At: wireTime(orNow(d.ReceivedAt)),
		Delivery: encodeDelivery(d)})
}
