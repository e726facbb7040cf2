package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// One short real run: a gateway built and started from this repository,
// Postgres, a private redis-server, every phase, a share of redeliveries and
// SNS. It checks that each system's figures are there and make sense (every
// message acked, the op's two commits, the gateway's ledger and Redis calls,
// one downstream call per unique message), never how fast anything was.
func TestShortRealRun(t *testing.T) {
	t.Parallel()
	cfg, err := parseFlags([]string{
		"-n", "200", "-c", "4", "-n1", "20", "-mem-n", "100", "-mem-c", "50", "-mem-delay", "20ms",
		"-warmup", "10", "-redeliver", "0.1", "-sns", "0.1", "-idle", "500ms", "-quiet",
		"-gateway-memory-limit", "512MiB", "-handoff-n", "60",
	}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := execute(ctx, cfg, &out, &errOut)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, errOut.String())
	}
	t.Logf("report:\n%s", out.String())
	if want := "; GODEBUG " + godebugOf(withImageGodebug(os.Environ())); !strings.Contains(out.String(), want) {
		t.Errorf("the report does not say %q", want)
	}
	if want := "gateway memory limit: GATEWAY_MEMORY_LIMIT=512MiB (from -gateway-memory-limit)"; !strings.Contains(out.String(), want) {
		t.Errorf("the report does not say %q", want)
	}

	var ticks int64
	check := func(phase, system string, n int) systemResult {
		t.Helper()
		p, ok := rep.phase(phase)
		if !ok {
			t.Fatalf("no %s phase", phase)
		}
		s, ok := p.get(system)
		if !ok {
			t.Fatalf("%s phase has no %s", phase, system)
		}
		if s.run.acked != n || s.run.failed() != 0 || len(s.run.fresh) != n || s.lat.count() != n {
			t.Errorf("%s %s: %d of %d acked, failures %v", phase, system, s.run.acked, n, s.run.failures)
		}
		// The run's database was vacuumed before the phase, and what that
		// took is known.
		if s.vacuum.took <= 0 || s.vacuum.wal < 0 {
			t.Errorf("%s %s: vacuum before the phase %+v", phase, system, s.vacuum)
		}
		if s.msgsPerSec() <= 0 || s.lat.percentile(50) <= 0 || s.lat.percentile(99) < s.lat.percentile(50) {
			t.Errorf("%s %s: %.1f msgs/s, p50 %s, p99 %s", phase, system, s.msgsPerSec(), s.lat.percentile(50), s.lat.percentile(99))
		}
		// A phase of 20 messages can end inside one clock tick, so a phase
		// may count no CPU ticks; the run as a whole must (checked below).
		if !s.pgKnown || s.cpu.machineTotal < 0 {
			t.Errorf("%s %s: Postgres counters known %v, CPU ticks %d", phase, system, s.pgKnown, s.cpu.machineTotal)
		}
		ticks += s.cpu.machineTotal
		return s
	}
	redelivered := func(n int) int { return int(float64(n) * 0.1) }

	// The database's transaction counter also counts what is not the
	// system's own: opening the pool's connections, and autovacuum and
	// analyze of the tables the phases before filled. At this run's small
	// sizes that can be a large share per message, so it gets an allowance
	// of its own rather than a share of the count.
	const others = 60
	for phase, n := range map[string]int{"main": 200, "c1": 20} {
		op := check(phase, sysOp, n)
		// Two commits per operation.
		if x := op.pg.xacts; x < int64(2*n) || x > int64(2*n+others) {
			t.Errorf("%s op: %d transactions for %d messages, want their %d commits and at most %d others", phase, x, n, 2*n, others)
		}
		if w := op.tables["loadgen_op"]; w.ins != int64(n) || w.upd != int64(n) {
			t.Errorf("%s op: rows written %v, want %d inserted and updated", phase, op.tables, n)
		}
		if op.pg.walBytes <= 0 || op.downstreamCalls != 0 || op.redis.total() != 0 || len(op.run.again) != 0 {
			t.Errorf("%s op: WAL %d, downstream %d, redis %d, redeliveries %d", phase, op.pg.walBytes, op.downstreamCalls, op.redis.total(), len(op.run.again))
		}

		fw := check(phase, sysForwarder, n)
		// No ledger: nothing in the run's database but perhaps autovacuum
		// after the phase before. Redeliveries are forwarded again, since
		// it keeps no record of the first.
		if fw.pg.xacts > others || fw.redis.total() != 0 || len(fw.tables) != 0 {
			t.Errorf("%s forwarder: %d transactions, %d Redis commands, rows %v; it has no ledger", phase, fw.pg.xacts, fw.redis.total(), fw.tables)
		}
		if len(fw.run.again) != redelivered(n) || fw.run.againAcked != redelivered(n) || fw.downstreamCalls != int64(n+redelivered(n)) {
			t.Errorf("%s forwarder: %d redeliveries (%d acked), %d downstream calls", phase, len(fw.run.again), fw.run.againAcked, fw.downstreamCalls)
		}

		bare := check(phase, sysBare, n)
		// Its three statements each write a row once; group commit shares
		// the commits; a redelivery is answered by the row, not the
		// downstream.
		if w := bare.tables["loadgen_bare"]; w.ins != int64(n) || w.upd != int64(2*n) {
			t.Errorf("%s bare: rows written %v, want %d inserted and %d updated", phase, bare.tables, n, 2*n)
		}
		if bare.pg.xacts < 1 || bare.redis.total() < int64(n) || bare.peakRSS <= 0 || bare.cpu.gateway <= 0 && phase == "main" {
			t.Errorf("%s bare: %d transactions, %d Redis commands, peak RSS %d, CPU %d", phase, bare.pg.xacts, bare.redis.total(), bare.peakRSS, bare.cpu.gateway)
		}
		if len(bare.run.again) != redelivered(n) || bare.run.againAcked != redelivered(n) || bare.downstreamCalls != int64(n) {
			t.Errorf("%s bare: %d redeliveries (%d acked), %d downstream calls, want %d", phase, len(bare.run.again), bare.run.againAcked, bare.downstreamCalls, n)
		}

		ag := check(phase, sysAckgate, n)
		// The ledger's reads and commits, and the reservation, for every
		// message; a redelivery of confirmed work never reaches the
		// downstream.
		// At least one row per message, whatever the ledger's tables are.
		var inserted int64
		for _, w := range ag.tables {
			inserted += w.ins
		}
		if inserted < int64(n) {
			t.Errorf("%s ackgate: %d rows inserted for %d messages: %v", phase, inserted, n, ag.tables)
		}
		// Group commit shares commits between messages, but every fresh
		// message reads its operation first, in a transaction of its own.
		if x := ag.pg.xacts; x < int64(n) {
			t.Errorf("%s ackgate: %d transactions for %d messages, want at least a read each", phase, x, n)
		}
		if ag.redis.total() < int64(n) || ag.pg.walBytes <= 0 || ag.peakRSS <= 0 || ag.cpu.gateway <= 0 && phase == "main" {
			t.Errorf("%s ackgate: %d Redis commands, WAL %d, peak RSS %d, gateway CPU %d", phase, ag.redis.total(), ag.pg.walBytes, ag.peakRSS, ag.cpu.gateway)
		}
		if len(ag.run.again) != redelivered(n) || ag.run.againAcked != redelivered(n) || ag.downstreamCalls != int64(n) {
			t.Errorf("%s ackgate: %d redeliveries (%d acked), %d downstream calls, want %d", phase, len(ag.run.again), ag.run.againAcked, ag.downstreamCalls, n)
		}
	}

	mem := check("mem", sysAckgate, 100)
	if mem.peakRSS <= 0 || mem.downstreamCalls != 100 {
		t.Errorf("mem: peak RSS %d, downstream calls %d", mem.peakRSS, mem.downstreamCalls)
	}
	if ticks <= 0 {
		t.Errorf("no phase of the run counted a CPU tick of the machine")
	}
	// The memory phase's baseline: the forwarder, in a process of its own
	// whose peak RSS is read like the gateway's.
	if p, _ := rep.phase("mem"); len(p.systems) != 2 {
		t.Errorf("the memory phase runs the forwarder and the gateway, got %d systems", len(p.systems))
	}
	if fm := check("mem", sysForwarder, 100); fm.peakRSS <= 0 || fm.downstreamCalls != int64(100+redelivered(100)) {
		t.Errorf("mem forwarder: peak RSS %d, downstream calls %d", fm.peakRSS, fm.downstreamCalls)
	}

	// The handoff phase: every push acked at the handoff, and every one of
	// them then relayed to the downstream exactly once.
	if h := rep.handoff; h == nil || h.push.acked != 60 || h.push.failed() != 0 || h.effects != 60 ||
		h.acksPerSec() <= 0 || h.effectsPerSec() <= 0 || h.samples == 0 {
		t.Errorf("handoff phase: %+v", h)
	}

	text := out.String()
	for _, want := range []string{"== handoff: 60 messages to a handoff route", "relay effects/s / push acks/s", "== throughput: 200 messages per system, 4 in flight", "== latency at 1 in flight",
		"== memory with many in flight: 100 messages per system, 50 in flight", "== against the goals ==",
		"ackgate / op throughput", "ackgate / forwarder throughput", "gateway-added p99", "WAL per message",
		"Postgres transactions per message", "floor ≥ 0.5×", "gateway peak RSS", "floor ≤ 80 MiB", "forwarder process peak RSS", "; forwarder process ",
		"== against the bare pipeline", "bare / op throughput at 4 in flight", "ackgate / bare throughput",
		"machine CPU per message (every process), ms", "bare-added p99 at 1 in flight", "bare process peak RSS",
		"before the phase: VACUUM (ANALYZE) of the run's database"} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, g := range rep.goals() {
		if g.missing || g.verdict() == "not measured" {
			t.Errorf("goal %q not measured: %+v", g.name, g)
		}
	}
}
