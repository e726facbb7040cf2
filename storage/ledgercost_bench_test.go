package storage

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/testenv"
)

// BenchmarkLedgerCost measures what the ledger itself costs Postgres per
// fresh message, apart from the gateway, Redis and HTTP, against the bare
// two-statement operation in the same run. Each round gives batch fresh
// messages the common path's three steps as group commit sends them: one
// claim statement creating them all, one change statement with their
// evidence, one with their ack marks, each its own round trip and commit.
// The op gives as many messages an INSERT of their intent and an UPDATE to
// confirmed, each its own statement and commit, as loadgen's op does.
//
// Reported per message: the CPU of the writing backend (from /proc, so
// other databases' load counts only as contention), and the ledger's as a
// ratio of the op's (ratio-pg-cpu: 1 costs the same).
//
//	go test -run '^$' -bench LedgerCost -benchtime 2000x ./storage/
//
// BENCH_NO_TRIGGERS=1 disables the guards on operations for the run, to
// show what they cost on the common path; a comma-separated list of
// trigger names disables those alone.
func BenchmarkLedgerCost(b *testing.B) {
	for _, size := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) { benchmarkLedgerCost(b, size) })
	}
}

func benchmarkLedgerCost(b *testing.B, batch int) {
	ctx := context.Background()
	url := testenv.DatabaseURL(b)
	if err := Migrate(ctx, url); err != nil {
		b.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 1
	PlanAsLookups(cfg.ConnConfig.RuntimeParams) // for the op too, as in loadgen
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_op (id text PRIMARY KEY, fingerprint bytea NOT NULL,
		state text NOT NULL, result_id text NOT NULL DEFAULT '', updated_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		b.Fatal(err)
	}
	switch names := os.Getenv("BENCH_NO_TRIGGERS"); names {
	case "":
	case "1":
		if _, err := pool.Exec(ctx, `ALTER TABLE operations DISABLE TRIGGER USER`); err != nil {
			b.Fatal(err)
		}
	default:
		for name := range strings.SplitSeq(names, ",") {
			if _, err := pool.Exec(ctx, `ALTER TABLE operations DISABLE TRIGGER `+pgx.Identifier{strings.TrimSpace(name)}.Sanitize()); err != nil {
				b.Fatal(err)
			}
		}
	}
	var pid int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	l := NewLedger(pool)

	ledgerRound := func(tag string) {
		at := time.Now()
		var claims, confirms, acks []*job
		for i := range batch {
			op := benchOperation(fmt.Sprintf("%s-%d", tag, i), at)
			claims = append(claims, &job{kind: claimJob, id: op.ID, change: benchCreating(op, at)})
			confirms = append(confirms, &job{kind: changeJob, id: op.ID, change: benchConfirm(op, at)})
			acks = append(acks, &job{kind: changeJob, id: op.ID, change: gate.AckedChange(op.ID, gate.StateAckPending, 1,
				[]gate.Step{{Transition: gate.Transition{From: gate.StateAckPending, To: gate.StateAcknowledged}}}, at)})
		}
		for _, step := range [][]*job{claims, confirms, acks} {
			res, err := l.run(ctx, pool, step)
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range res {
				if r.err != nil {
					b.Fatal(r.err)
				}
			}
		}
	}
	opRound := func(tag string) {
		for i := range batch {
			id := fmt.Sprintf("%s-%d", tag, i)
			if _, err := pool.Exec(ctx, `INSERT INTO bench_op (id, fingerprint, state) VALUES ($1, $2, 'pending')`, id, []byte(id)); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `UPDATE bench_op SET state = 'confirmed', result_id = $2, updated_at = now()
				WHERE id = $1 AND state = 'pending'`, id, "r-"+id); err != nil {
				b.Fatal(err)
			}
		}
	}
	// Plans are cached and statistics taken before anything is counted.
	for i := range 20 {
		ledgerRound(fmt.Sprintf("w%d", i))
		opRound(fmt.Sprintf("w%d", i))
	}
	if _, err := pool.Exec(ctx, `ANALYZE`); err != nil {
		b.Fatal(err)
	}
	var ledgerCPU, opCPU time.Duration
	round := 0
	for b.Loop() {
		round++
		c0 := backendCPU(b, pid)
		ledgerRound(fmt.Sprintf("r%d", round))
		c1 := backendCPU(b, pid)
		opRound(fmt.Sprintf("r%d", round))
		c2 := backendCPU(b, pid)
		ledgerCPU += c1 - c0
		opCPU += c2 - c1
	}
	messages := float64(round * batch)
	b.ReportMetric(float64(ledgerCPU.Microseconds())/messages, "ledger-pg-µs/msg")
	b.ReportMetric(float64(opCPU.Microseconds())/messages, "op-pg-µs/msg")
	if opCPU > 0 {
		b.ReportMetric(float64(ledgerCPU)/float64(opCPU), "ratio-pg-cpu")
	}
}

// backendCPU is the user and system time Postgres backend pid has used.
func backendCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("the backend's CPU: %v (the benchmark needs Postgres on this machine)", err)
	}
	// Fields after the command name, which ends at the last ')'.
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	const ticks = 100 // USER_HZ
	return time.Duration(utime+stime) * time.Second / ticks
}

func benchOperation(name string, at time.Time) *gate.Operation {
	return &gate.Operation{ID: "op_" + name, ScopeKey: "t/r/message_id:/" + name, Tenant: "t", Route: "r",
		KeySource: gate.KeyMessageID, Key: name, Fingerprint: "v1:" + name, FingerprintVersion: 1,
		Shape: gate.ShapeIdempotent, DeadLetterPolicy: gate.DeadLetterBroker, ContractVersion: "c1",
		IdempotencyKey: "ik_" + name, CreatedAt: at, RetainUntil: at.Add(8 * 24 * time.Hour), TraceID: "t"}
}

func benchCreating(op *gate.Operation, at time.Time) *gate.Change {
	w := gate.Claiming(nil, op, gate.Lease{Owner: "bench/1", Fence: 1, Expires: at.Add(10 * time.Second)},
		&gate.Delivery{N: 1, Broker: gate.BrokerPubSub, Source: "projects/p/subscriptions/s", MessageID: op.Key, ReceivedAt: at})
	path, _ := gate.Path("", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect)
	steps := make([]gate.Step, len(path))
	for i, e := range path {
		steps[i] = gate.Step{Transition: e}
	}
	return gate.StartChange(w, steps, &gate.Attempt{N: 1, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey,
		ContractVersion: "c1", StartedAt: at}, gate.ReasonNewOperation, at)
}

func benchConfirm(op *gate.Operation, at time.Time) *gate.Change {
	w := gate.Settling(&gate.Operation{ID: op.ID, State: gate.StatePendingEffect}, 1,
		&gate.Attempt{N: 1, Outcome: gate.OutcomeConfirmed, StatusCode: 201, ResultID: "r-" + op.Key},
		&gate.Answer{N: 1, Decision: gate.Ack, Reason: "downstream confirmed the effect"}, gate.LeaseFacts{Deadline: at.Add(10 * time.Second)})
	path, _ := gate.Path(gate.StatePendingEffect, gate.StateEffectConfirmed, gate.StateAckPending)
	steps := make([]gate.Step, len(path))
	for i, e := range path {
		steps[i] = gate.Step{Transition: e}
	}
	return gate.ConfirmChange(w, steps, "r-"+op.Key, "downstream confirmed the effect", at)
}
