package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

type phaseResult struct {
	name    string
	n, c    int
	systems []systemResult
}

func (p phaseResult) get(system string) (systemResult, bool) {
	for _, s := range p.systems {
		if s.system == system {
			return s, true
		}
	}
	return systemResult{}, false
}

type report struct {
	cfg               config
	started, finished time.Time
	machine           []string // name: value lines
	loadBefore        string
	loadAfter         string
	phases            []phaseResult
	handoff           *handoffResult // nil when the phase did not run
}

func (r *report) phase(name string) (phaseResult, bool) {
	for _, p := range r.phases {
		if p.name == name {
			return p, true
		}
	}
	return phaseResult{}, false
}

// describeMachine records what the figures depend on, so that a run can be
// compared only with runs like it.
func (r *report) describeMachine(ctx context.Context, b *bench) error {
	var pgVersion, syncCommit, sharedBuffers string
	err := b.obs.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('synchronous_commit'), current_setting('shared_buffers')`).
		Scan(&pgVersion, &syncCommit, &sharedBuffers)
	if err != nil {
		return fmt.Errorf("postgres settings: %w", err)
	}
	redisVersion := "-"
	if b.redis != nil {
		if info, err := b.redis.Info(ctx, "server").Result(); err == nil {
			for line := range strings.Lines(info) {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
					redisVersion = v
				}
			}
		}
	}
	mem := "-"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if v, err := parseStatusField(string(b), "MemTotal"); err == nil {
			mem = fmt.Sprintf("%.1f GiB", float64(v)/(1<<30))
		}
	}
	pool := "the gateway's default"
	if b.cfg.GatewayDBParams != "" {
		pool = b.cfg.GatewayDBParams
	}
	gateway := fmt.Sprintf("started by this run, pid %s; database pool: %s; log level %s; GODEBUG %s", pidString(b.gwPID), pool,
		b.cfg.GatewayLogLevel, godebugOf(withImageGodebug(os.Environ())))
	if b.cfg.Target != "" {
		gateway = "target " + b.cfg.Target + ", pid " + pidString(b.gwPID)
	} else if b.gw == nil {
		gateway = "not run"
	}
	redisSrc := "private redis-server"
	if b.cfg.RedisAddr != "" {
		redisSrc = b.cfg.RedisAddr
	}
	r.machine = []string{
		fmt.Sprintf("cpus: %d (GOMAXPROCS %d), memory %s, %s/%s, loadgen built with %s", runtime.NumCPU(), runtime.GOMAXPROCS(0), mem, runtime.GOOS, runtime.GOARCH, runtime.Version()),
		fmt.Sprintf("postgres: %s, synchronous_commit=%s, shared_buffers=%s, database %s", pgVersion, syncCommit, sharedBuffers, b.dbName),
		fmt.Sprintf("redis: %s (%s)", redisVersion, redisSrc),
		"gateway: " + gateway,
	}
	r.loadBefore = loadAverage()
	return nil
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "-"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "-"
	}
	return strings.Join(f[:3], " ")
}

func (r *report) print(w io.Writer) {
	cfg := r.cfg
	fmt.Fprintf(w, "ackgate loadgen, %s, %s\n", r.started.UTC().Format(time.RFC3339), r.finished.Sub(r.started).Round(time.Second))
	for _, m := range r.machine {
		fmt.Fprintln(w, "  "+m)
	}
	fmt.Fprintf(w, "  load average: %s before, %s after\n", r.loadBefore, r.loadAfter)
	fmt.Fprintf(w, "  messages: %d B of data, %.0f%% redelivered after their ack, %.0f%% SNS; warm-up %d per system and phase\n",
		cfg.PayloadBytes, cfg.Redeliver*100, cfg.SNS*100, cfg.Warmup)
	for _, p := range r.phases {
		r.printPhase(w, p)
	}
	r.printHandoff(w)
	r.printRatios(w)
	r.printBound(w)
}

var phaseTitle = map[string]string{
	"main": "throughput",
	"c1":   "latency at 1 in flight",
	"mem":  "memory with many in flight",
}

func (r *report) printPhase(w io.Writer, p phaseResult) {
	fmt.Fprintf(w, "\n== %s: %d messages per system, %d in flight", phaseTitle[p.name], p.n, p.c)
	if p.name == "mem" {
		fmt.Fprintf(w, ", downstream answering after %s", r.cfg.MemDelay)
	}
	fmt.Fprintln(w, " ==")
	if p.name == "mem" {
		fmt.Fprintf(w, "  gateway memory limit: %s\n", r.cfg.memoryLimit)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "system\tmsgs/s\tp50\tp90\tp99\tmax\tpg xacts/msg\tWAL B/msg\tWAL net\tredis cmds/msg\tdownstream/msg\tnot acked\t")
	for _, s := range p.systems {
		n := len(s.run.fresh)
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%d\t\n",
			s.system, s.msgsPerSec(),
			ms(s.lat.percentile(50)), ms(s.lat.percentile(90)), ms(s.lat.percentile(99)), ms(s.lat.max()),
			known(s.pgKnown, "%.2f", perMessage(float64(s.pg.xacts), n)),
			fmt.Sprintf("%.0f", perMessage(float64(s.pg.walBytes), n)),
			s.walNetText(),
			known(s.redis != nil, "%.2f", perMessage(float64(s.redis.total()), n)),
			perMessage(float64(s.downstreamCalls), n), s.run.failed())
	}
	tw.Flush()
	for _, s := range p.systems {
		r.printDetails(w, s)
	}
}

func known(ok bool, format string, v float64) string {
	if !ok || math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf(format, v)
}

func (r *report) printDetails(w io.Writer, s systemResult) {
	n := len(s.run.fresh)
	fmt.Fprintf(w, "  %s: %d acked of %d in %s", s.system, s.run.acked, n, s.run.elapsed.Round(time.Millisecond))
	if len(s.run.again) > 0 {
		fmt.Fprintf(w, "; %d redeliveries (%d acked) p50 %s p99 %s", len(s.run.again), s.run.againAcked,
			ms(s.againLat.percentile(50)), ms(s.againLat.percentile(99)))
	}
	if s.pgPool > 0 {
		fmt.Fprintf(w, "; %d connections", s.pgPool)
	}
	fmt.Fprintln(w)
	if len(s.run.failures) > 0 {
		keys := make([]string, 0, len(s.run.failures))
		for k := range s.run.failures {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = fmt.Sprintf("%s ×%d", k, s.run.failures[k])
		}
		fmt.Fprintf(w, "    not acked: %s\n", strings.Join(parts, ", "))
	}
	if s.cpu.machineTotal > 0 {
		pct := func(t int64) string { return fmt.Sprintf("%.0f%%", 100*float64(t)/float64(s.cpu.machineTotal)) }
		serving := "gateway"
		if s.system == sysBare {
			serving = "bare process"
		}
		fmt.Fprintf(w, "    CPU, share of all cores: machine %s busy; postgres %s, %s %s, redis %s, loadgen %s (client, downstream, forwarder)",
			pct(s.cpu.machineBusy), pct(s.cpu.postgres), serving, pct(s.cpu.gateway), pct(s.cpu.redis), pct(s.cpu.self))
		if (s.system == sysAckgate || s.system == sysBare) && s.cpu.gateway > 0 {
			fmt.Fprintf(w, "; %s %.2f ms CPU/msg", serving, perMessage(float64(s.cpu.gateway)*1000/clockTicks, n))
		}
		if s.cpu.postgres > 0 {
			fmt.Fprintf(w, "; postgres %.2f ms CPU/msg", perMessage(float64(s.cpu.postgres)*1000/clockTicks, n))
		}
		fmt.Fprintln(w)
	}
	if s.peakRSS > 0 {
		who := "gateway"
		switch s.system {
		case sysForwarder:
			who = "forwarder process"
		case sysBare:
			who = "bare process"
		}
		fmt.Fprintf(w, "    %s peak RSS (VmHWM) during the phase: %.1f MiB\n", who, float64(s.peakRSS)/(1<<20))
	}
	if len(s.redis) > 0 {
		type kv struct {
			k string
			v int64
		}
		var cmds []kv
		for k, v := range s.redis {
			cmds = append(cmds, kv{k, v})
		}
		slices.SortFunc(cmds, func(a, b kv) int { return cmp.Or(cmp.Compare(b.v, a.v), cmp.Compare(a.k, b.k)) })
		parts := make([]string, len(cmds))
		for i, c := range cmds {
			parts[i] = fmt.Sprintf("%s %.2f", c.k, perMessage(float64(c.v), n))
		}
		fmt.Fprintf(w, "    redis per message (commands run by scripts count under their own names too): %s\n", strings.Join(parts, ", "))
	}
	if len(s.tables) > 0 {
		fmt.Fprintf(w, "    rows written per message: %s\n", s.tables.describe(n))
	}
	if shares, total := s.waits.top(6); total > 0 {
		parts := make([]string, len(shares))
		for i, sh := range shares {
			parts[i] = fmt.Sprintf("%s %.0f%%", sh.label, 100*float64(sh.n)/float64(total))
		}
		fmt.Fprintf(w, "    postgres backends, %d samples: %s\n", total, strings.Join(parts, ", "))
	}
	if v := s.vacuum; v.took > 0 {
		fmt.Fprintf(w, "    before the phase: VACUUM (ANALYZE) of the run's database, %s, %.0f kB of WAL (what earlier phases' writes owed)\n",
			v.took.Round(time.Millisecond), float64(v.wal)/1000)
	}
	fmt.Fprintf(w, "    cluster during the phase: %d checkpoints, %.2f full page images/msg, %d databases created and %d dropped by others, ~%d transactions in other databases\n",
		s.pg.checkpoints, perMessage(float64(s.pg.walFPI), n), s.dbsCreated, s.dbsDropped, max(s.pg.othersXacts, 0))
	if bg := s.background; !math.IsNaN(bg.mean) {
		fmt.Fprintf(w, "    background WAL in the %s before: median %s kB/s, mean %.0f kB/s = %.0f B/msg at this phase's pace; WAL net over %d windows of ~1 s\n",
			bg.span.Round(100*time.Millisecond), known(true, "%.0f", bg.median/1000), bg.mean/1000, s.backgroundPerMessage(), s.walWindows)
	}
}

// describe lists each table's row writes per message, by name, with the
// share of updates that were HOT.
func (t tableWrites) describe(n int) string {
	names := make([]string, 0, len(t))
	for name := range t {
		names = append(names, name)
	}
	slices.Sort(names)
	parts := make([]string, 0, len(names))
	for _, name := range names {
		w := t[name]
		var what []string
		if w.ins != 0 {
			what = append(what, fmt.Sprintf("%.2f inserted", perMessage(float64(w.ins), n)))
		}
		if w.upd != 0 {
			what = append(what, fmt.Sprintf("%.2f updated (%.0f%% HOT)", perMessage(float64(w.upd), n), 100*float64(w.hot)/float64(w.upd)))
		}
		if w.del != 0 {
			what = append(what, fmt.Sprintf("%.2f deleted", perMessage(float64(w.del), n)))
		}
		parts = append(parts, name+" "+strings.Join(what, ", "))
	}
	return strings.Join(parts, "; ")
}

// goal is one of the targets, and how far a run is from it.
type goal struct {
	name   string
	value  float64
	unit   string
	target float64
	// floor, when not 0, is the value short of which the goal is not only
	// missed but failed: below it the work is not done.
	floor   float64
	atLeast bool // the value must be at least target (else at most)
	inputs  string
	missing bool
	noisy   bool // measured, but the machine's noise leaves it without meaning
}

func (g goal) verdict() string {
	switch {
	case g.missing:
		return "not measured"
	case g.noisy:
		return "not judged: noisy"
	case math.IsNaN(g.value):
		return "not measured"
	case g.atLeast && g.value >= g.target, !g.atLeast && g.value <= g.target:
		return "met"
	}
	floor := ""
	if g.floor != 0 {
		floor = "; floor met"
		if g.atLeast && g.value < g.floor || !g.atLeast && g.value > g.floor {
			floor = "; BELOW THE FLOOR"
		}
	}
	if g.atLeast {
		return fmt.Sprintf("missed: %.1f× short%s", g.target/g.value, floor)
	}
	return fmt.Sprintf("missed: %.1f× over%s", g.value/g.target, floor)
}

func (r *report) goals() []goal {
	var gs []goal
	main, okMain := r.phase("main")
	op, okOp := main.get(sysOp)
	fw, okFw := main.get(sysForwarder)
	ag, okAg := main.get(sysAckgate)
	gs = append(gs,
		goal{name: "ackgate / op throughput at " + fmt.Sprint(main.c) + " in flight", unit: "×", target: 1.0, floor: 0.5, atLeast: true,
			value: ratio(ag.msgsPerSec(), op.msgsPerSec()), missing: !okMain || !okOp || !okAg,
			inputs: fmt.Sprintf("%.0f / %.0f msgs/s", ag.msgsPerSec(), op.msgsPerSec())},
		goal{name: "ackgate / forwarder throughput", unit: "×", target: 0.7, atLeast: true,
			value: ratio(ag.msgsPerSec(), fw.msgsPerSec()), missing: !okMain || !okFw || !okAg,
			inputs: fmt.Sprintf("%.0f / %.0f msgs/s", ag.msgsPerSec(), fw.msgsPerSec())},
	)
	c1, okC1 := r.phase("c1")
	op1, okOp1 := c1.get(sysOp)
	fw1, okFw1 := c1.get(sysForwarder)
	ag1, okAg1 := c1.get(sysAckgate)
	added := addedP99(ag1, fw1)
	gs = append(gs, goal{name: "gateway-added p99 at 1 in flight / op p99", unit: "×", target: 3, floor: 5, atLeast: false,
		value: ratio(float64(added), float64(op1.lat.percentile(99))), missing: !okC1 || !okOp1 || !okFw1 || !okAg1,
		inputs: fmt.Sprintf("(ackgate %s - forwarder %s) / op %s", ms(ag1.lat.percentile(99)), ms(fw1.lat.percentile(99)), ms(op1.lat.percentile(99)))})
	// The windowed median net of the background resists other databases'
	// WAL; the totals are the fallback for phases too short to have windows.
	walAg, walOp, how := ag.walNet, op.walNet, "net medians"
	if math.IsNaN(walAg) || math.IsNaN(walOp) {
		walAg, walOp, how = perMessage(float64(ag.pg.walBytes), len(ag.run.fresh)), perMessage(float64(op.pg.walBytes), len(op.run.fresh)), "phase totals"
	}
	walGoal := goal{name: "WAL per message, ackgate / op", unit: "×", target: 2, floor: 4, atLeast: false,
		value: ratio(walAg, walOp), missing: !okMain || !okOp || !okAg,
		inputs: fmt.Sprintf("%.0f / %.0f B, %s", walAg, walOp, how)}
	// When the rest of the cluster wrote as much as the system itself, or
	// forced checkpoint after checkpoint, the figure is mostly noise: it is
	// not judged, and the phase totals are shown for what they are.
	for _, s := range []systemResult{ag, op} {
		if s.walNetText() == "noisy" {
			walGoal.noisy = true
			walGoal.inputs += fmt.Sprintf("; %s's phase: %d checkpoints, background %.0f B/msg", s.system, s.pg.checkpoints, s.backgroundPerMessage())
		}
	}
	if walGoal.noisy {
		walGoal.inputs = fmt.Sprintf("totals %.0f / %.0f B", perMessage(float64(ag.pg.walBytes), len(ag.run.fresh)), perMessage(float64(op.pg.walBytes), len(op.run.fresh))) +
			walGoal.inputs[strings.Index(walGoal.inputs, ";"):]
		walGoal.value = math.NaN()
	}
	gs = append(gs, walGoal)
	// Group commit shares commits between deliveries: at most one Postgres
	// transaction per message at this concurrency.
	gs = append(gs, goal{name: fmt.Sprintf("ackgate Postgres transactions per message at %d in flight", main.c), unit: "",
		target: 1, atLeast: false, value: perMessage(float64(ag.pg.xacts), len(ag.run.fresh)),
		missing: !okMain || !okAg || !ag.pgKnown, inputs: fmt.Sprintf("%d transactions for %d messages", ag.pg.xacts, len(ag.run.fresh))})
	mem, okMem := r.phase("mem")
	agm, okAgm := mem.get(sysAckgate)
	rssInputs := "VmHWM; memory limit: " + strings.SplitN(r.cfg.memoryLimit, ":", 2)[0]
	if fwm, ok := mem.get(sysForwarder); ok && fwm.peakRSS > 0 {
		rssInputs += fmt.Sprintf("; forwarder process %.1f MiB (ackgate %.2f×)", float64(fwm.peakRSS)/(1<<20), ratio(float64(agm.peakRSS), float64(fwm.peakRSS)))
	}
	gs = append(gs, goal{name: fmt.Sprintf("gateway peak RSS at %d in flight", r.cfg.MemC), unit: " MiB", target: 64, floor: 80, atLeast: false,
		value: float64(agm.peakRSS) / (1 << 20), missing: !okMem || !okAgm || agm.peakRSS == 0,
		inputs: rssInputs})
	return gs
}

// walNetText is the net WAL per message, or "noisy" when the rest of the
// cluster made it meaningless: it wrote at least half as much as the phase
// did (the difference can even come out negative), or it forced checkpoints
// far more often than checkpoint_timeout would, each of which makes the next
// change to every page write the whole page.
func (s systemResult) walNetText() string {
	raw := perMessage(float64(s.pg.walBytes), len(s.run.fresh))
	bg := s.backgroundPerMessage()
	if s.walNet < 0 || bg > 0 && bg >= 0.5*raw || s.checkpointStorm() {
		return "noisy"
	}
	return known(true, "%.0f", s.walNet)
}

// checkpointStorm is more than one checkpoint per minute of the phase, plus
// one that may fall in it anyway.
func (s systemResult) checkpointStorm() bool {
	return float64(s.pg.checkpoints) > 1+s.run.elapsed.Minutes()
}

// backgroundPerMessage is the background WAL rate spread over the phase's
// messages: how much of its WAL per message may be someone else's.
func (s systemResult) backgroundPerMessage() float64 {
	if math.IsNaN(s.background.mean) || len(s.run.fresh) == 0 {
		return 0
	}
	return s.background.mean * s.run.elapsed.Seconds() / float64(len(s.run.fresh))
}

func (r *report) printRatios(w io.Writer) {
	fmt.Fprintln(w, "\n== against the goals ==")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, g := range r.goals() {
		cmpSign := "≤"
		if g.atLeast {
			cmpSign = "≥"
		}
		value := "n/a"
		if !g.missing && !math.IsNaN(g.value) {
			value = fmt.Sprintf("%.2f%s", g.value, g.unit)
		}
		target := fmt.Sprintf("goal %s %g%s", cmpSign, g.target, g.unit)
		if g.floor != 0 {
			target += fmt.Sprintf(", floor %s %g%s", cmpSign, g.floor, g.unit)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", g.name, value, target, g.verdict(), g.inputs)
	}
	tw.Flush()
}

// printBound sets the gateway beside the bare pipeline: where bare itself
// misses a goal, the design misses it on this machine, whatever the
// implementation; where bare meets it, the difference is the gateway's own.
func (r *report) printBound(w io.Writer) {
	lines := r.bound()
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w, "\n== against the bare pipeline (the same steps, nothing else) ==")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, l := range lines {
		fmt.Fprintln(tw, l)
	}
	tw.Flush()
}

// bound is printBound's lines, tab-separated: what is compared, the ratio,
// and the figures it comes from.
func (r *report) bound() []string {
	var out []string
	if main, ok := r.phase("main"); ok {
		op, okOp := main.get(sysOp)
		bare, okBare := main.get(sysBare)
		ag, okAg := main.get(sysAckgate)
		if okOp && okBare {
			out = append(out, fmt.Sprintf("bare / op throughput at %d in flight\t%.2f×\t%.0f / %.0f msgs/s",
				main.c, ratio(bare.msgsPerSec(), op.msgsPerSec()), bare.msgsPerSec(), op.msgsPerSec()))
		}
		if okAg && okBare {
			out = append(out, fmt.Sprintf("ackgate / bare throughput\t%.2f×\t%.0f / %.0f msgs/s",
				ratio(ag.msgsPerSec(), bare.msgsPerSec()), ag.msgsPerSec(), bare.msgsPerSec()))
		}
		var cpu []string
		for _, s := range []systemResult{op, bare, ag} {
			if s.system != "" && s.cpu.machineTotal > 0 {
				cpu = append(cpu, fmt.Sprintf("%s %.2f", s.system, s.machineCPUPerMessage()))
			}
		}
		if okBare && len(cpu) > 1 {
			out = append(out, fmt.Sprintf("machine CPU per message (every process), ms\t\t%s", strings.Join(cpu, ", ")))
		}
	}
	if c1, ok := r.phase("c1"); ok {
		op, okOp := c1.get(sysOp)
		fw, okFw := c1.get(sysForwarder)
		bare, okBare := c1.get(sysBare)
		ag, okAg := c1.get(sysAckgate)
		if okOp && okFw && okBare {
			added := addedP99(bare, fw)
			out = append(out, fmt.Sprintf("bare-added p99 at 1 in flight / op p99\t%.2f×\t(bare %s - forwarder %s) / op %s",
				ratio(float64(added), float64(op.lat.percentile(99))), ms(bare.lat.percentile(99)), ms(fw.lat.percentile(99)), ms(op.lat.percentile(99))))
			if okAg {
				agAdded := addedP99(ag, fw)
				out = append(out, fmt.Sprintf("ackgate-added / bare-added p99 at 1 in flight\t%.2f×\t%s / %s",
					ratio(float64(agAdded), float64(added)), ms(agAdded), ms(added)))
			}
		}
	}
	return out
}

// addedP99 is what s adds to the forwarder's p99: its p99 less fw's, the
// part of the tail that is not the HTTP both have.
func addedP99(s, fw systemResult) time.Duration {
	return s.lat.percentile(99) - fw.lat.percentile(99)
}

// machineCPUPerMessage is the busy time of every core during the phase,
// whoever spent it, per message, in milliseconds.
func (s systemResult) machineCPUPerMessage() float64 {
	return perMessage(float64(s.cpu.machineBusy)*1000/clockTicks, len(s.run.fresh))
}
