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
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/ackgate/ackgate/storage"
)

// The bare pipeline is the third baseline, between the op and the gateway:
// the gateway's steps in their order, each as cheap as it can be written,
// in a process of its own. It takes a lease with a fencing token in Redis
// (one script call), group-commits the intent row, calls the downstream
// with an idempotency key, group-commits the evidence under the fence,
// answers, and then marks the ack and releases the lease off the response's
// path, as the gateway does. What it leaves out is everything that makes the
// gateway a product: the ledger's guards (constraints and triggers), the
// evidence record's columns and side tables, routes, authentication,
// decisions, telemetry, logs and admission. So the gateway cannot be faster
// than this on the same machine, and a throughput goal that this misses is
// out of reach of the design itself, not of its implementation.
//
// It answers a delivery only by what its own statements returned: a claim
// that found the row already there is answered by the row's state, and an
// evidence update that matched no row (another fence, another state) is a
// nack.

// bareEnv, when set, makes this binary the bare pipeline and nothing else:
// the database URL, the Redis address and the downstream's base URL,
// separated by spaces.
const bareEnv = "LOADGEN_BARE"

const bareTable = `CREATE TABLE IF NOT EXISTS loadgen_bare (
	id           text PRIMARY KEY,
	fence        bigint NOT NULL,
	fingerprint  bytea NOT NULL,
	state        text NOT NULL,
	result_id    text,
	created_at   timestamptz NOT NULL DEFAULT now(),
	evidence_at  timestamptz,
	acked_at     timestamptz
)`

// The three statements, each for a whole batch; each returns the ids it
// wrote, so every waiter learns its own row's fate.
const (
	bareClaim = `INSERT INTO loadgen_bare (id, fence, fingerprint, state)
SELECT i, f, p, 'pending_effect' FROM unnest($1::text[], $2::bigint[], $3::bytea[]) AS u(i, f, p)
ON CONFLICT (id) DO NOTHING RETURNING id`
	bareEvidence = `UPDATE loadgen_bare o SET state = 'ack_pending', result_id = u.r, evidence_at = now()
FROM unnest($1::text[], $2::bigint[], $3::text[]) AS u(i, f, r)
WHERE o.id = u.i AND o.fence = u.f AND o.state = 'pending_effect' RETURNING o.id`
	bareAck = `UPDATE loadgen_bare o SET state = 'acknowledged', acked_at = now()
FROM unnest($1::text[]) AS u(i) WHERE o.id = u.i AND o.state = 'ack_pending'`
)

// bareAcquire takes the lease when it is free and returns the new fence, or
// 0 when another owner holds it.
var bareAcquire = redis.NewScript(`local f = redis.call('INCR', KEYS[2])
if redis.call('SET', KEYS[1], ARGV[1] .. ':' .. f, 'NX', 'PX', ARGV[2]) then return f end
return 0`)

type bareKind int

const (
	bareKindClaim bareKind = iota
	bareKindEvidence
	bareKindAck
)

type bareWrite struct {
	kind     bareKind
	id       string
	fence    int64
	fp       []byte
	resultID string
	done     chan bareDone // nil: nobody waits (the ack mark)
}

type bareDone struct {
	written bool
	err     error
}

type bare struct {
	pool     *pgxpool.Pool
	rdb      *redis.Client
	client   *http.Client
	target   string
	writes   chan bareWrite
	releases chan string
	srv      *http.Server
	url      string
}

// serveBareIfAsked serves the bare pipeline when bareEnv is set, writes its
// URL as the first line on stdout and serves until stdin closes. It returns
// false at once when the variable is unset.
func serveBareIfAsked() bool {
	spec := os.Getenv(bareEnv)
	if spec == "" {
		return false
	}
	parts := strings.Fields(spec)
	if len(parts) != 3 {
		fmt.Fprintf(os.Stderr, "loadgen bare: %s wants a database URL, a Redis address and a downstream URL\n", bareEnv)
		os.Exit(2)
	}
	b, err := startBare(context.Background(), parts[0], parts[1], parts[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen bare:", err)
		os.Exit(1)
	}
	fmt.Println(b.url)
	_, _ = io.Copy(io.Discard, os.Stdin)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b.close(ctx)
	return true
}

func startBare(ctx context.Context, dbURL, redisAddr, downstreamURL string) (*bare, error) {
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	// The plan settings the gateway's own sessions use: without them the
	// updates' cached generic plans scan the table.
	storage.PlanAsLookups(pc.ConnConfig.RuntimeParams)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, bareTable); err != nil {
		pool.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		pool.Close()
		return nil, err
	}
	b := &bare{
		pool: pool, rdb: redis.NewClient(&redis.Options{Addr: redisAddr}),
		client: &http.Client{Timeout: 5 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: 4096, IdleConnTimeout: 2 * time.Minute}},
		target: downstreamURL + "/effects", writes: make(chan bareWrite, 4096), releases: make(chan string, 4096),
		url: "http://" + ln.Addr().String(),
	}
	go b.flush()
	go b.release()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/push/pubsub/{route}", b.pubsub)
	mux.HandleFunc("POST /v1/push/sns/{route}", b.sns)
	b.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() { _ = b.srv.Serve(ln) }()
	return b, nil
}

func (b *bare) close(ctx context.Context) {
	_ = b.srv.Shutdown(ctx)
	b.client.CloseIdleConnections()
	_ = b.rdb.Close()
	b.pool.Close()
}

// flush is the group commit: whatever is queued when the previous batch is
// done goes as one batch of at most three statements, one transaction.
func (b *bare) flush() {
	batch := make([]bareWrite, 0, 64)
	for w := range b.writes {
		b.commit(drain(b.writes, append(batch[:0], w)))
	}
}

// drain adds to batch what ch holds already, up to batch's capacity,
// without waiting for more.
func drain[T any](ch <-chan T, batch []T) []T {
	for len(batch) < cap(batch) {
		select {
		case v := <-ch:
			batch = append(batch, v)
		default:
			return batch
		}
	}
	return batch
}

func (b *bare) commit(batch []bareWrite) {
	var claimIDs, evIDs, ackIDs, results []string
	var claimFences, evFences []int64
	var fps [][]byte
	for _, w := range batch {
		switch w.kind {
		case bareKindClaim:
			claimIDs, claimFences, fps = append(claimIDs, w.id), append(claimFences, w.fence), append(fps, w.fp)
		case bareKindEvidence:
			evIDs, evFences, results = append(evIDs, w.id), append(evFences, w.fence), append(results, w.resultID)
		case bareKindAck:
			ackIDs = append(ackIDs, w.id)
		}
	}
	written := make(map[string]bool, len(batch))
	var pb pgx.Batch
	collect := func(rows pgx.Rows) error {
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			written[id] = true
		}
		return rows.Err()
	}
	if len(claimIDs) > 0 {
		pb.Queue(bareClaim, claimIDs, claimFences, fps).Query(collect)
	}
	if len(evIDs) > 0 {
		pb.Queue(bareEvidence, evIDs, evFences, results).Query(collect)
	}
	if len(ackIDs) > 0 {
		pb.Queue(bareAck, ackIDs)
	}
	// A batch sent without BEGIN runs as one implicit transaction.
	err := b.pool.SendBatch(context.Background(), &pb).Close()
	for _, w := range batch {
		if w.done != nil {
			w.done <- bareDone{written: err == nil && written[w.id], err: err}
		}
	}
}

func (b *bare) write(ctx context.Context, w bareWrite) (bool, error) {
	w.done = make(chan bareDone, 1)
	select {
	case b.writes <- w:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	d := <-w.done
	return d.written, d.err
}

func (b *bare) release() {
	keys := make([]string, 0, 64)
	for k := range b.releases {
		_ = b.rdb.Del(context.Background(), drain(b.releases, append(keys[:0], k))...).Err()
	}
}

func (b *bare) pubsub(w http.ResponseWriter, r *http.Request) {
	if m, ok := decodePubSub(w, r); ok {
		b.deliver(w, r, m.source+"/"+m.id, m.data)
	}
}

func (b *bare) sns(w http.ResponseWriter, r *http.Request) {
	if m, ok := decodeSNS(w, r); ok {
		b.deliver(w, r, m.source+"/"+m.id, m.data)
	}
}

func (b *bare) deliver(w http.ResponseWriter, r *http.Request, id string, data []byte) {
	ctx := r.Context()
	lease := "bare:lease:" + id
	fence, err := bareAcquire.Run(ctx, b.rdb, []string{lease, "bare:fence:" + id}, "loadgen", 30000).Int64()
	if err != nil {
		http.Error(w, "Redis unavailable", http.StatusServiceUnavailable)
		return
	}
	if fence == 0 {
		// Held: by a delivery still at work, or by one that answered and
		// has not released it yet, whose evidence then answers this one.
		b.again(w, r, id)
		return
	}
	defer func() { b.releases <- lease }()
	fp := sha256.Sum256(data)
	created, err := b.write(ctx, bareWrite{kind: bareKindClaim, id: id, fence: fence, fp: fp[:]})
	if err != nil {
		http.Error(w, "ledger unavailable", http.StatusServiceUnavailable)
		return
	}
	if !created {
		b.again(w, r, id)
		return
	}
	resultID, err := b.effect(ctx, id, data)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	confirmed, err := b.write(ctx, bareWrite{kind: bareKindEvidence, id: id, fence: fence, resultID: resultID})
	if err != nil || !confirmed {
		http.Error(w, "evidence not recorded", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusNoContent)
	b.writes <- bareWrite{kind: bareKindAck, id: id}
}

// again answers a delivery whose row was already there: acked when its
// evidence is durable, nacked otherwise (this pipeline has no retry path).
func (b *bare) again(w http.ResponseWriter, r *http.Request, id string) {
	var state string
	err := b.pool.QueryRow(r.Context(), `SELECT state FROM loadgen_bare WHERE id = $1`, id).Scan(&state)
	if err == nil && (state == "ack_pending" || state == "acknowledged") {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	http.Error(w, "an earlier delivery has no evidence", http.StatusServiceUnavailable)
}

func (b *bare) effect(ctx context.Context, id string, data []byte) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.target, bytes.NewReader(data))
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", id)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := b.client.Do(req)
	if err != nil {
		return "", errors.New("downstream unreachable")
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	resultID := resp.Header.Get("X-Result-Id")
	if resp.StatusCode < 200 || resp.StatusCode > 299 || resultID == "" {
		return "", fmt.Errorf("downstream answered %s without evidence", resp.Status)
	}
	return resultID, nil
}
