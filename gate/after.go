package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// AfterAnswer runs deliveries' post-response work (Result.Finish) in the
// background, so a connection's goroutine is free once its answer is out
// instead of waiting on an ack mark's commit and a lease release.
//
// Work is taken in batches: each batch's ledger work runs concurrently, so
// its ack marks and delivery records share the ledger's group commits, and
// then its leases are released in one Reservations.ReleaseAll. Nothing is
// dropped: when the queue is full, or closed, the work runs on the caller
// as Result.Finish does. What is still queued when a drain runs out of time
// is left undone and logged by operation, which the evidence already
// allows: an unmarked ack leaves the operation ack_pending, and an
// unreleased lease lapses by its TTL.
type AfterAnswer struct {
	reservations Reservations
	log          *slog.Logger
	timeout      time.Duration
	batch        int

	mu     sync.RWMutex // held to send on jobs, taken to close it
	closed bool
	jobs   chan afterJob

	ctx     context.Context // the workers' own; cancelled when a drain runs out of time
	cancel  context.CancelFunc
	workers sync.WaitGroup

	queued, inline, batches atomic.Int64
	// pending counts results queued and not yet done.
	pending atomic.Int64
}

type afterJob struct {
	res  *Result
	sent bool
}

// AfterAnswerOptions sizes an AfterAnswer; zero values take the defaults.
type AfterAnswerOptions struct {
	// Queue bounds the results waiting; past it work runs on the caller.
	Queue int
	// Workers is how many batches run at once; Batch bounds one batch.
	Workers, Batch int
	// Timeout bounds one batch's work.
	Timeout time.Duration
}

// Defaults of AfterAnswerOptions. A batch as large as the ledger's group
// commit (32) would leave its commits half full when two flushers run, so
// one batch holds enough to fill both.
const (
	DefaultAfterQueue   = 4096
	DefaultAfterWorkers = 2
	DefaultAfterBatch   = 64
	DefaultAfterTimeout = 5 * time.Second
)

// NewAfterAnswer starts the workers; Close stops them.
func NewAfterAnswer(rs Reservations, log *slog.Logger, o AfterAnswerOptions) *AfterAnswer {
	if o.Queue <= 0 {
		o.Queue = DefaultAfterQueue
	}
	if o.Workers <= 0 {
		o.Workers = DefaultAfterWorkers
	}
	if o.Batch <= 0 {
		o.Batch = DefaultAfterBatch
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultAfterTimeout
	}
	a := &AfterAnswer{reservations: rs, log: log, timeout: o.Timeout, batch: o.Batch, jobs: make(chan afterJob, o.Queue)}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	for range o.Workers {
		a.workers.Go(a.work)
	}
	return a
}

// Finish takes res's post-response work, with sent saying whether the
// response was written (an ack mark follows only a written ack). It queues
// the work, or runs it on the caller under ctx when the queue is full or
// closed.
func (a *AfterAnswer) Finish(ctx context.Context, res *Result, sent bool) {
	if a.Queue(res, sent) {
		return
	}
	a.inline.Add(1)
	res.Finish(ctx, a.log, sent)
}

// Queue takes res's post-response work if it can do without the caller:
// when there is none, or the queue has room. Otherwise it reports false
// and the work is still the caller's, for Finish. A caller that would make
// a context only for the work run inline tries Queue first, so the common
// case, queued, makes none.
func (a *AfterAnswer) Queue(res *Result, sent bool) bool {
	if !res.hasLedgerWork(sent) && len(res.release) == 0 {
		return true
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return false
	}
	// Counted before the send, so Pending never reads zero while the
	// result is queued.
	a.pending.Add(1)
	select {
	case a.jobs <- afterJob{res: res, sent: sent}:
		a.queued.Add(1)
		return true
	default:
		a.pending.Add(-1)
		return false
	}
}

// Counts says how many results were queued, how many ran on their caller
// because the queue was full or closed, and how many batches the queued
// ones went in.
func (a *AfterAnswer) Counts() (queued, inline, batches int64) {
	return a.queued.Load(), a.inline.Load(), a.batches.Load()
}

// Pending is how many queued results' work is not done yet.
func (a *AfterAnswer) Pending() int64 { return a.pending.Load() }

// Close stops taking work (later Finish calls run on their caller) and
// waits until the queued work is done or ctx ends. At ctx's end the running
// batches are cancelled (a change already handed to the ledger's group
// commit still gets its answer first) and what is still queued is left
// undone; the error says how much. Close may be called more than once.
func (a *AfterAnswer) Close(ctx context.Context) error {
	a.mu.Lock()
	if !a.closed {
		a.closed = true
		close(a.jobs)
	}
	a.mu.Unlock()
	done := make(chan struct{})
	go func() {
		a.workers.Wait()
		close(done)
	}()
	select {
	case <-done:
		a.cancel()
		return nil
	case <-ctx.Done():
	}
	a.cancel()
	<-done
	left := a.abandon()
	return fmt.Errorf("gate: post-response work cut short (running batches cancelled, %d queued results left undone): %w",
		left, ctx.Err())
}

// abandon empties the queue of a stopped AfterAnswer and names every
// operation whose ack mark or delivery record it leaves unwritten, so that
// none is left so silently: such an operation stays ack_pending (its
// effect's evidence is committed) until a redelivery or the reconciler
// settles it, and its lease lapses by its TTL. It returns how many results
// were queued.
func (a *AfterAnswer) abandon() int {
	n := 0
	for j := range a.jobs { // closed by Close; the workers have stopped
		n++
		a.pending.Add(-1)
		if a.log != nil && j.res.hasLedgerWork(j.sent) {
			a.log.Warn("post-response work left undone at shutdown: the operation stays ack_pending until it is redelivered",
				"operation_id", j.res.OperationID, "acked", j.sent && j.res.Decision == Ack)
		}
	}
	return n
}

func (a *AfterAnswer) work() {
	batch := make([]afterJob, 0, a.batch)
	for a.ctx.Err() == nil {
		j, ok := <-a.jobs
		if !ok {
			return
		}
		batch = append(batch[:0], j)
	fill:
		for len(batch) < a.batch {
			select {
			case j, ok := <-a.jobs:
				if !ok {
					break fill
				}
				batch = append(batch, j)
			default:
				break fill
			}
		}
		a.run(batch)
		clear(batch)
	}
}

// run does one batch: the ledger work of every result at once, so that it
// shares commits, then every lease in one release.
func (a *AfterAnswer) run(batch []afterJob) {
	ctx, cancel := context.WithTimeout(a.ctx, a.timeout)
	defer cancel()
	defer a.pending.Add(-int64(len(batch)))
	a.batches.Add(1)
	var (
		wg     sync.WaitGroup
		leases []Lease
		// own is the one result whose ledger work this worker does itself
		// while the others' run beside it: a batch of one, common below
		// full load, then starts no goroutine, and the worker's stack is
		// already grown to what the ledger's write path takes.
		own *afterJob
	)
	for i := range batch {
		j := &batch[i]
		if j.res.hasLedgerWork(j.sent) {
			if own == nil {
				own = j
			} else {
				wg.Go(func() { j.res.ledgerWork(ctx, a.log, j.sent) })
			}
		}
		leases = append(leases, j.res.release...)
	}
	if own != nil {
		own.res.ledgerWork(ctx, a.log, own.sent)
	}
	wg.Wait()
	if len(leases) == 0 {
		return
	}
	if err := a.reservations.ReleaseAll(ctx, leases); err != nil && a.log != nil && !errors.Is(err, context.Canceled) {
		a.log.WarnContext(ctx, "releasing leases after the answer failed; they lapse by their TTL", "leases", len(leases), "err", err)
	}
}
