package storage

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackgate/ackgate/gate"
)

// Group commit.
//
// A commit costs a WAL flush, and on a busy ledger the flushes bound
// throughput. So concurrent deliveries' steps share one: each caller queues
// its step, and a caller that finds no flusher running starts one, a
// goroutine of the ledger's own that takes what is queued (up to maxBatch)
// to the server as one round trip: at most one statement per step kind
// (claim, change, answer; schema.sql), each taking its elements as typed
// arrays, in one implicit transaction and one commit. It hands each caller
// its own answer and goes on until the queue is empty. No step a caller
// waits on waits on a timer: a step that arrives while a batch is on the wire rides the next
// one, so under load batches grow by themselves and a lone delivery pays
// only a goroutine handoff. A batch of one is a batch.
//
// One flusher makes the largest batches, and a batch's cost in both
// processes is mostly per statement, not per element: at 16 in flight one
// flusher carried 18% more deliveries than two, with half the commits
// (docs/performance.md). But a batch can stall on a row lock (a redelivery
// of a local route's operation waits for the transaction that runs its
// statement), and behind one flusher everything would wait with it. So a
// batch still out after stallAfter lets a second flusher take the queue,
// up to maxFlushers.
//
// The ack mark is the one step nobody waits on: it is written after the
// broker has its answer. A mark lingers for up to ackLinger for a batch
// that carries another change: marks and changes share one statement, so
// such a mark costs the server an element where any other batch would run
// a statement for it alone (at 1 in flight that statement, in the next
// claim's round trip, was a tenth of a delivery's latency). Once its linger
// is over a mark rides whatever batch comes next, or goes on its own.
//
// A statement takes each operation once (an UPDATE cannot move one row
// twice), so a step for an operation already in the batch waits for the
// next. A refused step writes nothing and never fails a neighbour: the
// statements answer each element rather than raise. A statement that does
// raise (a bug, or a guard refusing what the write path should never send)
// takes the batch back whole, and every step in it is sent again alone, so
// each gets the answer it alone earns. Any other failure (the connection
// drops, the commit's outcome is unknown) fails every step in the batch:
// resending a batch that may have committed could write it twice.

const (
	// maxBatch bounds the steps of one round trip.
	maxBatch = 64
	// maxFlushers bounds the connections group commit holds at once, leaving
	// the rest of the pool to reads.
	maxFlushers = 2
	// stallAfter is how long a batch may be out before the queue behind it
	// gets a flusher of its own: several commits' time on a healthy server.
	stallAfter = 10 * time.Millisecond
	// ackLinger is how long an ack mark waits for a batch with a change in
	// it: longer than one delivery takes from its claim to its evidence when
	// the downstream answers at once.
	ackLinger = 5 * time.Millisecond
	// batchTimeout bounds one shared round trip. It is generous: a batch
	// that takes longer is a ledger in trouble, and every delivery in it
	// nacks.
	batchTimeout = 30 * time.Second
)

type jobKind int

const (
	claimJob jobKind = iota
	changeJob
	answerJob
)

type job struct {
	kind   jobKind
	id     string // the operation
	change *gate.Change
	answer *gate.Answer
	// lingers marks an ack mark, which does not start a flusher at once
	// and rides only a batch with a change in it until its linger is over.
	lingers bool
	// span is the caller's, which the batch's own span continues or links.
	span trace.Span
	done chan jobResult
}

type jobResult struct {
	// op is the operation a claim found; nil when it created it.
	op      *gate.Operation
	created bool
	err     error
}

type committer struct {
	mu       sync.Mutex
	queue    []*job
	flushers int
	// batches and steps count what went to the server, for the tests and
	// benchmarks that check the sharing; alone counts steps sent again on
	// their own after their batch raised; stalls counts the flushers
	// started behind a batch out longer than stallAfter.
	batches, steps, alone, stalls int
	// out is the time batches spent on their round trips, summed over
	// the flushers: one flusher out nearly all the time is the ledger's
	// ceiling (GroupCommitLoad).
	out time.Duration
	// lingering is set while a timer waits to end the linger of the ack
	// marks queued, after linger (ackLinger unless a test says otherwise);
	// then due lets any batch take them. A batch that takes every mark
	// cancels the timer: lingerGen moves on, and the timer, finding another
	// generation, does nothing.
	lingering, due bool
	lingerGen      int
	linger         time.Duration
}

// enqueue queues one step and returns its own answer.
func (l *Ledger) enqueue(ctx context.Context, j *job) jobResult {
	if err := ctx.Err(); err != nil {
		return jobResult{err: err}
	}
	j.done, j.span = make(chan jobResult, 1), trace.SpanFromContext(ctx)
	c := &l.commit
	c.mu.Lock()
	c.queue = append(c.queue, j)
	start := c.flushers == 0 && !j.lingers
	if start {
		c.flushers++
	}
	if j.lingers {
		l.armLinger()
	}
	c.mu.Unlock()
	if start {
		go l.flush()
	}
	// Once queued, a step may commit whatever the caller's context says
	// afterwards, so the caller waits for the answer that tells it so.
	return <-j.done
}

// armLinger starts the timer that ends the queued ack marks' linger,
// unless one runs. c.mu is held.
func (l *Ledger) armLinger() {
	c := &l.commit
	if c.lingering {
		return
	}
	c.lingering = true
	c.lingerGen++
	gen := c.lingerGen
	time.AfterFunc(cmp.Or(c.linger, ackLinger), func() { l.endLinger(gen) })
}

// endLinger lets any batch take the ack marks that lingered, and starts
// a flusher for them when none runs.
func (l *Ledger) endLinger(gen int) {
	c := &l.commit
	c.mu.Lock()
	if gen != c.lingerGen {
		c.mu.Unlock()
		return
	}
	c.lingering = false
	c.due = true
	start := c.flushers == 0 && len(c.queue) > 0
	if start {
		c.flushers++
	}
	c.mu.Unlock()
	if start {
		l.flush()
	}
}

// flush sends batches until the queue holds nothing that may go now.
func (l *Ledger) flush() {
	c := &l.commit
	var took time.Duration // the last batch's round trip, counted as the next is taken
	for {
		c.mu.Lock()
		c.out += took
		batch := c.take()
		if len(batch) == 0 {
			c.flushers--
			c.mu.Unlock()
			return
		}
		c.batches++
		c.steps += len(batch)
		c.mu.Unlock()
		out := new(atomic.Bool)
		watch := time.AfterFunc(stallAfter, func() { l.relieve(out) })
		sent := time.Now()
		l.send(batch)
		took = time.Since(sent)
		out.Store(true)
		watch.Stop()
	}
}

// relieve starts another flusher for what queued behind a batch that is
// still out, unless maxFlushers are already at it. While nothing queued may
// go (the queue is empty, or holds only lingering ack marks) it looks again
// every stallAfter until the batch returns, so a step that queues late
// behind a stalled batch is not left waiting for it.
func (l *Ledger) relieve(returned *atomic.Bool) {
	if returned.Load() {
		return
	}
	c := &l.commit
	c.mu.Lock()
	start := c.ready() && c.flushers < maxFlushers
	if start {
		c.flushers++
		c.stalls++
	}
	watch := !start && c.flushers < maxFlushers
	c.mu.Unlock()
	switch {
	case start:
		go l.flush()
	case watch:
		time.AfterFunc(stallAfter, func() { l.relieve(returned) })
	}
}

// ready says whether take would take anything now: a step that does not
// linger, or ack marks whose linger is over.
func (c *committer) ready() bool {
	return (c.due && len(c.queue) > 0) || slices.ContainsFunc(c.queue, func(j *job) bool { return !j.lingers })
}

// take removes up to maxBatch queued steps, no two of one kind for one
// operation (nor two answers for one delivery), keeping the rest in order.
// Lingering ack marks go only with a change that does not linger, or once
// their linger is over.
func (c *committer) take() []*job {
	type key struct {
		kind jobKind
		id   string
		n    int
	}
	var (
		batch []*job
		seen  = map[key]bool{}
		rest  = c.queue[:0]
		ride  = c.due || slices.ContainsFunc(c.queue, func(j *job) bool { return j.kind == changeJob && !j.lingers })
		left  = false
	)
	for _, j := range c.queue {
		k := key{kind: j.kind, id: j.id}
		if j.kind == answerJob {
			k.n = j.answer.N
		}
		if len(batch) == maxBatch || seen[k] || (j.lingers && !ride) {
			rest = append(rest, j)
			left = left || j.lingers
			continue
		}
		seen[k] = true
		batch = append(batch, j)
	}
	clear(c.queue[len(rest):])
	c.queue = rest
	if !left {
		// No mark lingers: the timer has nothing left to end.
		c.lingering, c.due = false, false
		c.lingerGen++
	}
	return batch
}

// send runs one batch: its claims, then its changes, then its answers, in
// one implicit transaction. Each statement's elements are sorted by
// operation id, so concurrent batches lock rows in one order.
func (l *Ledger) send(batch []*job) {
	// The batch belongs to no single caller, so no caller's context may
	// cancel it halfway; it is bounded on its own.
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	ctx, span := batchSpan(ctx, batch)
	defer span.End()
	results, err := l.run(ctx, l.pool, batch)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	if rolledBack(err) && len(batch) > 1 {
		// The server refused a statement and took the batch back whole:
		// each step alone now earns its own answer.
		l.commit.mu.Lock()
		l.commit.alone += len(batch)
		l.commit.mu.Unlock()
		for _, j := range batch {
			r, err := l.run(ctx, l.pool, []*job{j})
			if err != nil {
				r = []jobResult{{err: translate("write", err)}}
			}
			j.done <- r[0]
		}
		return
	}
	for i, j := range batch {
		if err != nil {
			j.done <- jobResult{err: translate("write", err)}
			continue
		}
		j.done <- results[i]
	}
}

// batchSpan is the span of one shared round trip, the parent of its
// queries' spans: it continues the trace of the step that opened the batch
// and links the others', so every delivery's trace leads to the statement
// that carried its step.
func batchSpan(ctx context.Context, batch []*job) (context.Context, trace.Span) {
	first := batch[0].span
	if !first.SpanContext().IsValid() {
		return ctx, first // no trace to continue: a no-op span
	}
	links := make([]trace.Link, 0, len(batch)-1)
	for _, j := range batch[1:] {
		if sc := j.span.SpanContext(); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx = trace.ContextWithSpan(ctx, first)
	return first.TracerProvider().Tracer("github.com/ackgate/ackgate/storage").Start(ctx, "ledger batch",
		trace.WithLinks(links...), trace.WithAttributes(attribute.Int("ackgate.batch.steps", len(batch))))
}

// querier is what run needs of a pool or a transaction.
type querier interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// run sends batch's statements through q in one round trip and returns
// each step's result, in the batch's order. An error is the round trip's
// own: no step's result is known.
func (l *Ledger) run(ctx context.Context, q querier, batch []*job) ([]jobResult, error) {
	results := make([]jobResult, len(batch))
	var claims, changes, answers []int
	for i, j := range batch {
		switch j.kind {
		case claimJob:
			claims = append(claims, i)
		case changeJob:
			changes = append(changes, i)
		case answerJob:
			answers = append(answers, i)
		}
	}
	byID := func(idx []int) {
		slices.SortStableFunc(idx, func(a, b int) int { return strings.Compare(batch[a].id, batch[b].id) })
	}
	b := &pgx.Batch{}
	args, pos := newClaimArgs(len(claims), l.texts), make(map[string]int, len(claims))
	if len(claims) > 0 {
		byID(claims)
		var queued []int
		for _, i := range claims {
			if err := args.add(l, batch[i].change); err != nil {
				results[i].err = err
				continue
			}
			queued = append(queued, i)
		}
		for _, i := range queued {
			pos[batch[i].id] = i
		}
		claims = queued
	}
	if len(claims) > 0 {
		claim := claimPlainSQL
		if args.sideRows() {
			claim = claimSQL
		}
		bound, err := claim.bind(args.named())
		if err != nil {
			return nil, err
		}
		b.Queue(claim.sql, bound...).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				// A row is the claimed id, then the operation found, whose
				// id is NULL when the claim created it (schema.sql, claim).
				// A created operation is not read: its id is looked up as
				// it came (text is the same bytes in either format), and
				// nothing is scanned or allocated for it.
				raw := rows.RawValues()
				if len(raw) < 2 {
					return fmt.Errorf("claim answered with %d columns", len(raw))
				}
				i, ok := pos[string(raw[0])]
				if !ok {
					return fmt.Errorf("claim answered for %s, which it was not asked about", raw[0])
				}
				delete(pos, string(raw[0]))
				if raw[1] == nil {
					results[i] = jobResult{created: true}
					continue
				}
				var (
					s  scannedOperation
					la scannedAttempt
				)
				// The claimed id again (nil skips it) and the operation.
				if err := rows.Scan(append(append([]any{nil}, s.fields()...), la.fields()...)...); err != nil {
					return err
				}
				if s.op.ID != batch[i].id {
					return fmt.Errorf("claim of %s found %s", batch[i].id, s.op.ID)
				}
				results[i] = jobResult{op: s.operation(la.attempt(s.op.IdempotencyKey))}
			}
			if err := rows.Err(); err != nil {
				return err
			}
			if len(pos) > 0 {
				return fmt.Errorf("claim left %d of %d operations unanswered", len(pos), len(claims))
			}
			return nil
		})
	}
	// A change that writes its row alone goes in the row statement; the
	// others in the change statement, which also writes side rows.
	var rows, others []int
	for _, i := range changes {
		if rowOnly(batch[i].change) {
			rows = append(rows, i)
		} else {
			others = append(others, i)
		}
	}
	for _, part := range []struct {
		sql   positional
		idx   []int
		named func(*changeArgs) pgx.StrictNamedArgs
	}{{rowSQL, rows, (*changeArgs).rowNamed}, {changeSQL, others, (*changeArgs).named}} {
		if len(part.idx) == 0 {
			continue
		}
		byID(part.idx)
		steps := 0
		for _, i := range part.idx {
			steps += len(batch[i].change.Steps)
		}
		args := newChangeArgs(len(part.idx), steps, l.texts)
		for k, i := range part.idx {
			args.add(k, batch[i].change)
		}
		if err := queueChanges(b, part.sql, part.named(&args), part.idx, results); err != nil {
			return nil, err
		}
	}
	if len(answers) > 0 {
		byID(answers)
		args := answerArgs{}
		for _, i := range answers {
			args.add(batch[i].id, batch[i].answer)
		}
		bound, err := answerSQL.bind(args.named())
		if err != nil {
			return nil, err
		}
		b.Queue(answerSQL.sql, bound...)
	}
	if err := q.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	return results, nil
}

// queueChanges queues one change statement (sql, with args) whose answers,
// one row per change in order, are the errors of results[idx[k]].
func queueChanges(b *pgx.Batch, q positional, args pgx.StrictNamedArgs, idx []int, results []jobResult) error {
	bound, err := q.bind(args)
	if err != nil {
		return err
	}
	b.Queue(q.sql, bound...).Query(func(rows pgx.Rows) error {
		k := 0
		for rows.Next() {
			var answer string
			if err := rows.Scan(&answer); err != nil {
				return err
			}
			if k < len(idx) {
				results[idx[k]].err = answerError(answer)
			}
			k++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if k != len(idx) {
			return fmt.Errorf("%d answers for %d changes", k, len(idx))
		}
		return nil
	})
	return nil
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

// answerError turns the change statement's answer into the gate's sentinels.
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
	}
	return fmt.Errorf("storage: write: unexpected answer %q", a)
}

// GroupCommitStats says how many shared round trips carried how many
// steps.
func (l *Ledger) GroupCommitStats() (batches, steps int) {
	l.commit.mu.Lock()
	defer l.commit.mu.Unlock()
	return l.commit.batches, l.commit.steps
}

// GroupCommitLoad is what group commit has sent so far: batches, the
// steps they carried, and the time they were out (from being taken off
// the queue to their answers), summed over flushers. The last, as a rate,
// is how busy the flushers are: near one second per second, the ledger's
// round trips, not the machine, bound the deliveries.
func (l *Ledger) GroupCommitLoad() (batches, steps int, out time.Duration) {
	l.commit.mu.Lock()
	defer l.commit.mu.Unlock()
	return l.commit.batches, l.commit.steps, l.commit.out
}

// GroupCommitStalls says how many flushers were started behind a batch
// that was out longer than stallAfter.
func (l *Ledger) GroupCommitStalls() int {
	l.commit.mu.Lock()
	defer l.commit.mu.Unlock()
	return l.commit.stalls
}

// GroupCommitAlone says how many steps were sent again on their own after
// their batch raised.
func (l *Ledger) GroupCommitAlone() int {
	l.commit.mu.Lock()
	defer l.commit.mu.Unlock()
	return l.commit.alone
}
