package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sender delivers one message the way its system does, and says whether it
// was acknowledged; outcome names what happened otherwise (a status or an
// error class) for the failure count.
type sender interface {
	send(ctx context.Context, m message) (acked bool, outcome string)
}

// pushSender is the broker's side of a push: the same client code for the
// gateway and the forwarder.
type pushSender struct {
	base, route, snsRoute string
	client                *http.Client
}

func newPushClient(conns int, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			// One kept-alive connection per worker, as a broker keeps its
			// push connections: no handshake inside the measurement.
			MaxIdleConns: conns + 16, MaxIdleConnsPerHost: conns + 16,
			IdleConnTimeout: 2 * time.Minute, DisableCompression: true,
			DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		},
	}
}

func (p *pushSender) send(ctx context.Context, m message) (bool, string) {
	url := p.base + "/v1/push/pubsub/" + p.route
	if m.SNS {
		url = p.base + "/v1/push/sns/" + p.snsRoute
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(m.Body))
	if err != nil {
		return false, "request: " + err.Error()
	}
	if m.SNS {
		req.Header.Set("Content-Type", "text/plain; charset=UTF-8")
		req.Header.Set("X-Amz-Sns-Message-Type", "Notification")
		req.Header.Set("X-Amz-Sns-Message-Id", m.ID)
		req.Header.Set("X-Amz-Sns-Topic-Arn", snsTopic)
	} else {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return false, errorClass(err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	// Both brokers read any 2xx the gateway sends as an ack.
	return resp.StatusCode >= 200 && resp.StatusCode <= 299, strconv.Itoa(resp.StatusCode)
}

func errorClass(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "connection error"
}

// opTable is the baseline's own table: what a ledger that writes an intent
// and then its confirmation needs at the least.
const opTable = `CREATE TABLE IF NOT EXISTS loadgen_op (
	id          text PRIMARY KEY,
	fingerprint bytea NOT NULL,
	state       text NOT NULL,
	result_id   text,
	created_at  timestamptz NOT NULL DEFAULT now(),
	updated_at  timestamptz
)`

// opSender runs the two-statement operation: INSERT the intent, UPDATE it to
// confirmed, each its own transaction and commit.
type opSender struct {
	pool *pgxpool.Pool
	n    atomic.Int64
}

func (o *opSender) send(ctx context.Context, m message) (bool, string) {
	sum := sha256.Sum256(m.Data)
	if _, err := o.pool.Exec(ctx, `INSERT INTO loadgen_op (id, fingerprint, state) VALUES ($1, $2, 'pending')`, m.ID, sum[:]); err != nil {
		return false, "insert: " + pgErrorClass(err)
	}
	tag, err := o.pool.Exec(ctx, `UPDATE loadgen_op SET state = 'confirmed', result_id = $2, updated_at = now() WHERE id = $1 AND state = 'pending'`,
		m.ID, "r-"+strconv.FormatInt(o.n.Add(1), 10))
	if err != nil {
		return false, "update: " + pgErrorClass(err)
	}
	if tag.RowsAffected() != 1 {
		return false, "update: no pending row"
	}
	return true, "ok"
}

func pgErrorClass(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return "no rows"
	}
	return "error"
}

// driveResult is what one system did in one phase.
type driveResult struct {
	fresh, again      []time.Duration // latency of first deliveries and of redeliveries
	acked, againAcked int
	failures          map[string]int // outcome of every delivery not acked
	elapsed           time.Duration
}

func (r driveResult) failed() int {
	n := 0
	for _, v := range r.failures {
		n += v
	}
	return n
}

// drive delivers msgs through s with c in flight, each message once (and,
// when picked by the redelivery share, a second time right after its ack, as
// a broker does when an ack is lost). It is bounded by len(msgs) and ctx;
// a failure is counted, never retried, so no figure hides one. done counts
// the messages finished so far, for whoever watches the phase.
func drive(ctx context.Context, s sender, msgs []message, c int, redeliver float64, timeout time.Duration, done *atomic.Int64) driveResult {
	type worker struct {
		fresh, again      []time.Duration
		acked, againAcked int
		failures          map[string]int
	}
	workers := make([]worker, c)
	if done == nil {
		done = new(atomic.Int64)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			me := &workers[w]
			me.failures = map[string]int{}
			one := func(m message) (time.Duration, bool) {
				rctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				t0 := time.Now()
				ok, outcome := s.send(rctx, m)
				d := time.Since(t0)
				if !ok {
					me.failures[outcome]++
				}
				return d, ok
			}
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(msgs) {
					return
				}
				d, ok := one(msgs[i])
				me.fresh = append(me.fresh, d)
				if ok {
					me.acked++
					if picked(i, redeliver) {
						d, ok := one(msgs[i])
						me.again = append(me.again, d)
						if ok {
							me.againAcked++
						}
					}
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	r := driveResult{elapsed: time.Since(start), failures: map[string]int{}}
	for _, w := range workers {
		r.fresh = append(r.fresh, w.fresh...)
		r.again = append(r.again, w.again...)
		r.acked += w.acked
		r.againAcked += w.againAcked
		for k, v := range w.failures {
			r.failures[k] += v
		}
	}
	if ctx.Err() != nil {
		r.failures[fmt.Sprintf("not sent (%v)", context.Cause(ctx))] += len(msgs) - len(r.fresh)
	}
	return r
}
