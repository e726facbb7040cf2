package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The handoff phase: the gateway's push path and its relay on the same
// downstream. A handoff route acks a push once the message is in its
// outbox, and the relay performs the effect afterwards; an outbox that fills
// faster than the relay drains it grows without bound. The phase pushes
// -handoff-n messages at -c in flight to the handoff route and reports,
// side by side, the push path's acks per second and the relay's effects per
// second at the downstream, over the same span: from the first push until
// the last effect (so a relay that keeps up scores the push rate, and one
// that falls behind scores what it drained in all). While it runs it samples
// the outbox: its depth and its lag (how long the oldest due entry waits).

const handoffRoute = "loadgen-handoff"

// handoffRouteYAML is the handoff route of the started gateway: the same
// downstream as the other routes, at its own path so that the relay's
// effects are counted apart. A dedupe window lets the relay retry after a
// lost answer without an operator; what the relay gives up on can only be
// kept by the gateway, the broker having been acked.
func handoffRouteYAML(downstreamURL string) string {
	return fmt.Sprintf(`  - name: %s
    broker: pubsub
    auth: none
    operation_key:
      kind: message_id
    fingerprint:
      version: 1
      data: true
    effect:
      method: POST
      url: %s/handoff
      body_mode: raw
      timeout: 5s
      result_id_header: X-Result-Id
    shape: handoff
    dedupe_window: 24h
    dead_letter: gateway
`, handoffRoute, downstreamURL)
}

// handoffEffects counts the relay's calls at the downstream and when the
// last one came.
type handoffEffects struct {
	calls atomic.Int64
	last  atomic.Int64 // unix nanoseconds of the latest call
}

func (h *handoffEffects) handle(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	n := h.calls.Add(1)
	h.last.Store(time.Now().UnixNano())
	w.Header().Set("X-Result-Id", "h-"+strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusCreated)
}

// handoffResult is what the phase measured.
type handoffResult struct {
	n, c int
	push driveResult
	// effects reached the downstream by the end of the phase; atPushEnd by
	// the time the last push was answered.
	effects, atPushEnd int64
	// drained is the span from the first push to the last effect (or to
	// the end of the wait, when not every effect came).
	drained time.Duration
	// maxDepth and maxLag are the largest outbox depth and lag sampled.
	maxDepth int64
	maxLag   time.Duration
	samples  int
	cpu      cpuUse
}

func (h handoffResult) acksPerSec() float64 {
	if h.push.elapsed <= 0 {
		return 0
	}
	return float64(h.push.acked) / h.push.elapsed.Seconds()
}

func (h handoffResult) effectsPerSec() float64 {
	if h.drained <= 0 {
		return 0
	}
	return float64(h.effects) / h.drained.Seconds()
}

// handoffDrainWait bounds the wait for the relay after the last push.
const handoffDrainWait = 5 * time.Minute

// handoffPhase runs on a gateway of its own, started for it with the
// handoff route beside the others: a gateway with a handoff route runs its
// relay all the time, whose polls would land in the other phases' counts
// and keep their database from going quiet.
func (b *bench) handoffPhase(ctx context.Context) (handoffResult, error) {
	cfg := b.cfg
	hr := handoffResult{n: cfg.HandoffN, c: cfg.C}
	dir := filepath.Join(b.dir, "handoff")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return hr, err
	}
	g, err := startGateway(ctx, b.gwBin, dir, b.dbURL, b.gwServeURL, b.redisAddr, b.down.url, cfg.GatewayLogLevel,
		cfg.GatewayMemoryLimit, handoffRouteYAML(b.down.url))
	if err != nil {
		return hr, err
	}
	defer func() {
		if err := g.stop(); err != nil {
			b.progress("handoff phase: %v", err)
		}
	}()
	b.progress("handoff phase: gateway pid %d on %s", g.pid(), g.ingest)
	client := newPushClient(cfg.C, cfg.RequestTimeout)
	defer client.CloseIdleConnections()
	send := &pushSender{base: g.ingest, route: handoffRoute, client: client}

	// A warm-up through the handoff route, drained before the phase, so
	// that the relay's connections and the route's first statements are
	// not in the figures.
	if cfg.Warmup > 0 {
		warm := make([]message, cfg.Warmup)
		wgen := newGenerator(b.runID, "handoff-warm", cfg.PayloadBytes, 0)
		for i := range warm {
			warm[i] = wgen.message(i)
		}
		if r := drive(ctx, send, warm, min(cfg.C, cfg.Warmup), 0, cfg.RequestTimeout, nil); r.failed() > 0 {
			return hr, fmt.Errorf("warm-up: %d of %d not acknowledged: %v", r.failed(), len(warm), r.failures)
		}
		if err := b.waitEffects(ctx, int64(cfg.Warmup), time.Now().Add(handoffDrainWait)); err != nil {
			return hr, fmt.Errorf("warm-up: %w", err)
		}
	}
	gen := newGenerator(b.runID, "handoff", cfg.PayloadBytes, 0)
	msgs := make([]message, cfg.HandoffN)
	for i := range msgs {
		msgs[i] = gen.message(i)
	}

	pool, err := pgxpool.New(ctx, b.dbURL)
	if err != nil {
		return hr, err
	}
	defer pool.Close()
	base := b.handoff.calls.Load()
	stop := b.sampleOutbox(ctx, pool, &hr)

	cpu0, cpuErr := readCPU()
	start := time.Now()
	var done atomic.Int64
	hr.push = drive(ctx, send, msgs, cfg.C, 0, cfg.RequestTimeout, &done)
	hr.atPushEnd = b.handoff.calls.Load() - base
	b.progress("handoff: %d pushes acked in %s, %d effects so far; waiting for the relay",
		hr.push.acked, hr.push.elapsed.Round(time.Millisecond), hr.atPushEnd)
	waitErr := b.waitEffects(ctx, base+int64(hr.push.acked), time.Now().Add(handoffDrainWait))
	cpu1, cpuErr1 := readCPU()
	stop()
	hr.effects = b.handoff.calls.Load() - base
	hr.drained = time.Since(start)
	if last := b.handoff.last.Load(); waitErr == nil && last > 0 {
		hr.drained = time.Unix(0, last).Sub(start)
	}
	if cpuErr == nil && cpuErr1 == nil {
		hr.cpu = cpuBetween(cpu0, cpu1, g.pid(), b.redisPID)
	}
	if ctx.Err() != nil {
		return hr, context.Cause(ctx)
	}
	return hr, nil
}

// waitEffects waits until the relay has made want calls in all, or until
// the deadline; the phase reports what came either way.
func (b *bench) waitEffects(ctx context.Context, want int64, deadline time.Time) error {
	for b.handoff.calls.Load() < want {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d relay effects after %s", b.handoff.calls.Load(), want, handoffDrainWait)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// sampleOutbox reads the outbox's undelivered depth and its lag every
// 250 ms until the returned stop is called.
func (b *bench) sampleOutbox(ctx context.Context, pool *pgxpool.Pool, hr *handoffResult) (stop func()) {
	sctx, cancel := context.WithCancel(ctx)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			var depth int64
			var lag float64
			err := pool.QueryRow(sctx, `SELECT count(*),
				coalesce(extract(epoch FROM now() - min(next_attempt_at) FILTER (WHERE next_attempt_at <= now())), 0)
				FROM outbox WHERE delivered_at IS NULL AND route = $1`, handoffRoute).Scan(&depth, &lag)
			if err == nil {
				hr.samples++
				hr.maxDepth = max(hr.maxDepth, depth)
				hr.maxLag = max(hr.maxLag, time.Duration(lag*float64(time.Second)))
			}
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-finished }
}

// printHandoff prints the phase's figures and the ratio against the goal of
// issue 23: the relay's effects per second at least 0.8 of the push path's
// acks per second (floor 0.5), on the same downstream.
func (r *report) printHandoff(w io.Writer) {
	h := r.handoff
	if h == nil {
		return
	}
	fmt.Fprintf(w, "\n== handoff: %d messages to a handoff route, %d in flight; the relay on the same downstream ==\n", h.n, h.c)
	fmt.Fprintf(w, "  push path: %d acked of %d in %s = %.0f acks/s (p50 %s, p99 %s)\n", h.push.acked, h.n,
		h.push.elapsed.Round(time.Millisecond), h.acksPerSec(), ms(summarize(h.push.fresh).percentile(50)), ms(summarize(h.push.fresh).percentile(99)))
	fmt.Fprintf(w, "  relay: %d effects at the downstream, %d of them while the pushes ran; last one %s after the first push = %.0f effects/s\n",
		h.effects, h.atPushEnd, h.drained.Round(time.Millisecond), h.effectsPerSec())
	fmt.Fprintf(w, "  outbox over %d samples: at most %d undelivered, lag (oldest due entry's wait) at most %s\n",
		h.samples, h.maxDepth, h.maxLag.Round(time.Millisecond))
	if h.cpu.machineTotal > 0 {
		pct := func(t, total int64) string { return fmt.Sprintf("%.0f%%", 100*float64(t)/float64(total)) }
		fmt.Fprintf(w, "  CPU, share of all cores: machine %s busy; postgres %s, gateway %s, redis %s, loadgen %s",
			pct(h.cpu.machineBusy, h.cpu.machineTotal), pct(h.cpu.postgres, h.cpu.machineTotal), pct(h.cpu.gateway, h.cpu.machineTotal),
			pct(h.cpu.redis, h.cpu.machineTotal), pct(h.cpu.self, h.cpu.machineTotal))
		if h.cpu.gateway > 0 && h.effects > 0 {
			fmt.Fprintf(w, "; gateway %.2f ms CPU per message (push and relay)", float64(h.cpu.gateway)*1000/clockTicks/float64(h.effects))
		}
		fmt.Fprintln(w)
	}
	if f := h.push.failed(); f > 0 {
		fmt.Fprintf(w, "  not acked: %d %v\n", f, h.push.failures)
	}
	if int(h.effects) < h.push.acked {
		fmt.Fprintf(w, "  NOT DRAINED: %d acked handoffs had no effect at the downstream after %s\n", h.push.acked-int(h.effects), handoffDrainWait)
	}
	ratio := 0.0
	if a := h.acksPerSec(); a > 0 {
		ratio = h.effectsPerSec() / a
	}
	verdict := "met"
	switch {
	case ratio < 0.5:
		verdict = "missed: below the floor of 0.5×"
	case ratio < 0.8:
		verdict = "floor met, goal missed"
	}
	fmt.Fprintf(w, "  relay effects/s / push acks/s: %.2f×  goal ≥ 0.8× (floor 0.5×)  %s  %.0f / %.0f\n", ratio, verdict, h.effectsPerSec(), h.acksPerSec())
}
