package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gwconfig "github.com/ackgate/ackgate/config"
)

func TestPercentileNearestRank(t *testing.T) {
	t.Parallel()
	var d []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	l := summarize(d)
	for p, want := range map[float64]time.Duration{
		0: 1 * time.Millisecond, 1: 1 * time.Millisecond, 50: 50 * time.Millisecond, 90: 90 * time.Millisecond,
		99: 99 * time.Millisecond, 99.5: 100 * time.Millisecond, 100: 100 * time.Millisecond,
	} {
		if got := l.percentile(p); got != want {
			t.Errorf("p%g of 1..100 ms = %s, want %s", p, got, want)
		}
	}
	if l.max() != 100*time.Millisecond || l.count() != 100 {
		t.Errorf("max %s count %d", l.max(), l.count())
	}
	if d[0] != 100*time.Millisecond {
		t.Error("summarize sorted its input in place")
	}

	// Four values: p50 is the 2nd, p99 the 4th; never an interpolated value.
	l = summarize([]time.Duration{40, 10, 30, 20})
	if l.percentile(50) != 20 || l.percentile(75) != 30 || l.percentile(99) != 40 {
		t.Errorf("p50 %d p75 %d p99 %d of {10,20,30,40}", l.percentile(50), l.percentile(75), l.percentile(99))
	}
	one := summarize([]time.Duration{7})
	if one.percentile(1) != 7 || one.percentile(99) != 7 {
		t.Error("a single value is every percentile")
	}
	if empty := summarize(nil); empty.percentile(50) != 0 || empty.max() != 0 {
		t.Error("nothing observed must give 0")
	}
}

func TestRatiosAndFormats(t *testing.T) {
	t.Parallel()
	if !math.IsNaN(ratio(1, 0)) || ratio(3, 2) != 1.5 {
		t.Error("ratio")
	}
	if !math.IsNaN(perMessage(10, 0)) || perMessage(10, 4) != 2.5 {
		t.Error("perMessage")
	}
	for d, want := range map[time.Duration]string{
		0: "-", 1500 * time.Microsecond: "1.50 ms", 42 * time.Millisecond: "42.0 ms", 1234 * time.Millisecond: "1234 ms",
	} {
		if got := ms(d); got != want {
			t.Errorf("ms(%s) = %q, want %q", d, got, want)
		}
	}
	if known(false, "%.1f", 1) != "n/a" || known(true, "%.1f", math.NaN()) != "n/a" || known(true, "%.1f", 2) != "2.0" {
		t.Error("known")
	}
}

func TestPickedSpreadsAnExactShare(t *testing.T) {
	t.Parallel()
	for _, share := range []float64{0, 0.01, 0.1, 0.2, 0.25, 1.0 / 3, 0.5, 0.7, 0.99, 1} {
		for _, n := range []int{1, 7, 100, 20000} {
			got := 0
			run, longest := 0, 0
			for i := range n {
				if picked(i, share) {
					got++
					run++
					longest = max(longest, run)
				} else {
					run = 0
				}
			}
			if want := int(float64(n) * share); got != want {
				t.Errorf("share %g of %d: picked %d, want %d", share, n, got, want)
			}
			if share <= 0.5 && longest > 1 {
				t.Errorf("share %g of %d: %d picked in a row; the share should be spread", share, n, longest)
			}
		}
	}
	if picked(5, -1) || !picked(5, 2) {
		t.Error("shares outside 0..1 are none and all")
	}
}

func TestGeneratedMessagesAreUniqueAndWellFormed(t *testing.T) {
	t.Parallel()
	g := newGenerator("lgtest", "main-ackgate", 256, 0.25)
	fixed := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	g.now = func() time.Time { return fixed }
	ids := map[string]bool{}
	datas := map[string]bool{}
	sns := 0
	for i := range 400 {
		m := g.message(i)
		if ids[m.ID] || datas[string(m.Data)] {
			t.Fatalf("message %d repeats an id or data: %s", i, m.ID)
		}
		ids[m.ID], datas[string(m.Data)] = true, true
		if !strings.HasPrefix(m.ID, "lgtest-main-ackgate-") {
			t.Fatalf("id %q lacks the run and phase", m.ID)
		}
		if len(m.Data) != 256 || !json.Valid(m.Data) {
			t.Fatalf("data of %d bytes, valid JSON %v", len(m.Data), json.Valid(m.Data))
		}
		if m.SNS != picked(i, 0.25) {
			t.Fatalf("message %d: SNS %v", i, m.SNS)
		}
		if m.SNS {
			sns++
			var n map[string]string
			if err := json.Unmarshal(m.Body, &n); err != nil {
				t.Fatal(err)
			}
			if n["Type"] != "Notification" || n["MessageId"] != m.ID || n["TopicArn"] != snsTopic ||
				n["Message"] != string(m.Data) || n["Timestamp"] != "2026-01-02T03:04:05.000000006Z" {
				t.Fatalf("SNS body %s", m.Body)
			}
			continue
		}
		var env struct {
			Message struct {
				Data        string            `json:"data"`
				Attributes  map[string]string `json:"attributes"`
				MessageID   string            `json:"messageId"`
				PublishTime string            `json:"publishTime"`
			} `json:"message"`
			Subscription string `json:"subscription"`
		}
		if err := json.Unmarshal(m.Body, &env); err != nil {
			t.Fatal(err)
		}
		data, err := base64.StdEncoding.DecodeString(env.Message.Data)
		if err != nil || string(data) != string(m.Data) || env.Message.MessageID != m.ID ||
			env.Subscription != pubsubSubscription || env.Message.PublishTime == "" {
			t.Fatalf("Pub/Sub body %s", m.Body)
		}
	}
	if sns != 100 {
		t.Errorf("%d of 400 SNS at a share of 0.25", sns)
	}
	// Two phases of one run, or two runs, never share an id.
	if newGenerator("lgtest", "c1-ackgate", 256, 0).message(0).ID == g.message(0).ID ||
		newGenerator("lgother", "main-ackgate", 256, 0).message(0).ID == g.message(0).ID {
		t.Error("ids collide across phases or runs")
	}
	for _, n := range []int{1, 10, 40} {
		if got := payload("lgtest-main-ackgate-123", 123, n); len(got) != n {
			t.Errorf("payload of %d bytes is %d long", n, len(got))
		}
	}
}

func TestCommandStatsDiff(t *testing.T) {
	t.Parallel()
	before, err := parseCommandStats("# Commandstats\r\n" +
		"cmdstat_evalsha:calls=10,usec=400,usec_per_call=40.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=3,usec=900,usec_per_call=300.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_get:calls=30,usec=30,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n")
	if err != nil {
		t.Fatal(err)
	}
	after, err := parseCommandStats("# Commandstats\r\n" +
		"cmdstat_evalsha:calls=14,usec=560,usec_per_call=40.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=5,usec=1500,usec_per_call=300.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_get:calls=30,usec=30,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_del:calls=2,usec=4,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n")
	if err != nil {
		t.Fatal(err)
	}
	d := after.sub(before)
	if len(d) != 2 || d["evalsha"] != 4 || d["del"] != 2 || d.total() != 6 {
		t.Errorf("diff %v (total %d): want evalsha 4, del 2; INFO and unchanged commands left out", d, d.total())
	}
	if _, err := parseCommandStats("cmdstat_get:usec=1\r\n"); err == nil {
		t.Error("a line without calls= must be an error")
	}
	if _, err := parseCommandStats("cmdstat_get:calls=x,usec=1\r\n"); err == nil {
		t.Error("a non-numeric calls= must be an error")
	}
	var none commandStats
	if none.total() != 0 {
		t.Error("nil stats total 0")
	}
}

func TestPGCountersDiff(t *testing.T) {
	t.Parallel()
	a := pgCounters{xacts: 100, othersXacts: 50, walBytes: 1 << 20, walFPI: 7, checkpoints: 3}
	b := pgCounters{xacts: 40, othersXacts: 45, walBytes: 1 << 10, walFPI: 2, checkpoints: 1}
	if got := a.sub(b); got != (pgCounters{xacts: 60, othersXacts: 5, walBytes: 1<<20 - 1<<10, walFPI: 5, checkpoints: 2}) {
		t.Errorf("sub = %+v", got)
	}
}

func TestProcParsing(t *testing.T) {
	t.Parallel()
	status := "Name:\tgateway\nVmPeak:\t 1265780 kB\nVmHWM:\t   34120 kB\nVmRSS:\t   30000 kB\nThreads:\t9\n"
	if v, err := parseStatusField(status, "VmHWM"); err != nil || v != 34120*1024 {
		t.Errorf("VmHWM = %d, %v", v, err)
	}
	if _, err := parseStatusField(status, "VmSwap"); err == nil {
		t.Error("a missing field must be an error")
	}
	if _, err := parseStatusField("Threads:\t9\n", "Threads"); err == nil {
		t.Error("a field without kB must be an error")
	}

	// The command name may hold spaces and parentheses.
	stat := "4242 (odd) name) S 1 4242 4242 0 -1 4194560 500 0 0 0 150 25 0 0 20 0 9 0 100 0 0"
	comm, ticks, err := parseProcStat(stat)
	if err != nil || comm != "odd) name" || ticks != 175 {
		t.Errorf("parseProcStat = %q %d %v, want \"odd) name\" 175", comm, ticks, err)
	}
	if _, _, err := parseProcStat("4242 (short) S 1"); err == nil {
		t.Error("a truncated stat line must be an error")
	}

	busy, total, err := parseMachineStat("cpu  100 5 50 800 40 3 2 0 10 0\ncpu0 50 2 25 400 20 1 1 0 5 0\n")
	// user+nice+system+irq+softirq+steal = 160; guest is inside user.
	if err != nil || busy != 160 || total != 1000 {
		t.Errorf("parseMachineStat = %d/%d %v, want 160/1000", busy, total, err)
	}
	if _, _, err := parseMachineStat("intr 1 2 3\n"); err == nil {
		t.Error("no cpu line must be an error")
	}
}

func TestCPUBetweenAttributesByProcess(t *testing.T) {
	t.Parallel()
	a := cpuSnapshot{machineBusy: 100, machineTotal: 400, self: 5,
		byPID:  map[int]int64{1: 10, 2: 20, 3: 30, 9: 99},
		commOf: map[int]string{1: "gateway", 2: "postgres", 3: "redis-server", 9: "postgres"}}
	b := cpuSnapshot{machineBusy: 300, machineTotal: 800, self: 25,
		byPID:  map[int]int64{1: 40, 2: 30, 3: 31, 4: 7}, // 9 exited, 4 is a new backend
		commOf: map[int]string{1: "gateway", 2: "postgres", 3: "redis-server", 4: "postgres"}}
	u := cpuBetween(a, b, 1, 3)
	want := cpuUse{machineBusy: 200, machineTotal: 400, gateway: 30, postgres: 17, redis: 1, self: 20}
	if u != want {
		t.Errorf("cpuBetween = %+v, want %+v", u, want)
	}
}

func TestMedianWALPerMessageIgnoresBurstsAndBackground(t *testing.T) {
	t.Parallel()
	// 1 KB per message at 100 messages a sample (100 ms), 50 kB/s written
	// by others all along, and two bursts of 8 MB from elsewhere: the total
	// is far off, the net median is not.
	var pts []walPoint
	var wal, done int64
	for i := range 101 {
		pts = append(pts, walPoint{at: time.Duration(i) * 100 * time.Millisecond, wal: wal, done: done})
		wal += 100*1024 + 5000
		done += 100
		if i == 15 || i == 62 {
			wal += 8 << 20
		}
	}
	m, windows := medianWALPerMessage(pts, 10, 10, 50000)
	if windows != 10 || math.Abs(m-1024) > 1e-6 {
		t.Errorf("net median %g over %d windows, want 1024 over 10", m, windows)
	}
	if m, _ := medianWALPerMessage(pts, 10, 10, math.NaN()); math.Abs(m-1074) > 1e-6 {
		t.Errorf("without a background: %g, want 1074", m)
	}
	if m, _ := medianWALPerMessage(pts[:25], 10, 10, 0); !math.IsNaN(m) {
		t.Errorf("two windows gave %g, want NaN", m)
	}
	// Windows in which nothing finished are left out, not divided by zero.
	idle := []walPoint{{0, 0, 0}, {1, 10, 0}, {2, 20, 0}, {3, 30, 0}, {4, 40, 0}}
	if m, n := medianWALPerMessage(idle, 1, 1, 0); !math.IsNaN(m) || n != 0 {
		t.Errorf("idle windows gave %g over %d", m, n)
	}
}

func TestBackgroundRate(t *testing.T) {
	t.Parallel()
	// 30 samples 100 ms apart at 10 kB per sample (100 kB/s), one 1 MB burst.
	var pts []walPoint
	var wal int64
	for i := range 31 {
		pts = append(pts, walPoint{at: time.Duration(i) * 100 * time.Millisecond, wal: wal})
		wal += 10000
		if i == 12 {
			wal += 1000000
		}
	}
	b := backgroundRate(pts, 10)
	if b.span != 3*time.Second || math.Abs(b.median-100000) > 1e-6 || math.Abs(b.mean-(300000+1000000)/3.0) > 1e-6 {
		t.Errorf("background %+v: want median 100 kB/s, mean 433 kB/s over 3 s", b)
	}
	if b := backgroundRate(pts[:1], 10); !math.IsNaN(b.mean) || !math.IsNaN(b.median) {
		t.Errorf("one sample: %+v", b)
	}
}

func TestWaitLabelsAndTop(t *testing.T) {
	t.Parallel()
	w := waitCounts{}
	for _, s := range [][3]string{
		{"active", "", ""}, {"active", "LWLock", "WALWrite"}, {"active", "LWLock", "WALWrite"},
		{"idle", "Client", "ClientRead"}, {"idle in transaction", "Client", "ClientRead"}, {"", "", ""},
	} {
		w[waitLabel(s[0], s[1], s[2])]++
	}
	shares, total := w.top(2)
	if total != 6 || len(shares) != 3 || shares[0] != (share{"LWLock:WALWrite", 2}) || shares[2] != (share{"other", 3}) {
		t.Errorf("top(2) = %v of %d", shares, total)
	}
	if w["CPU"] != 1 || w["idle in transaction"] != 1 || w["unknown"] != 1 {
		t.Errorf("labels %v", w)
	}
}

func TestConfigRefusesWhatIsNotLoopbackOrBounded(t *testing.T) {
	t.Parallel()
	ok, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if ok.N != 20000 || ok.C != 16 || !slices.Equal(ok.Systems, []string{sysOp, sysForwarder, sysBare, sysAckgate}) {
		t.Errorf("defaults %+v", ok)
	}
	// Against a target, bare runs by default only on the target's Redis.
	for _, tc := range []struct {
		args []string
		bare bool
	}{
		{[]string{"-target", "http://127.0.0.1:8080"}, false},
		{[]string{"-target", "http://127.0.0.1:8080", "-redis-addr", "127.0.0.1:6379"}, true},
	} {
		c, err := parseFlags(tc.args, io.Discard)
		if err != nil || slices.Contains(c.Systems, sysBare) != tc.bare {
			t.Errorf("%q: systems %v (%v), want bare %v", tc.args, c.Systems, err, tc.bare)
		}
	}
	for _, args := range [][]string{
		{"-postgres-url", "postgres://u:p@db.example.com/x"},
		{"-target", "http://10.0.0.5:8080"},
		{"-redis-addr", "192.168.1.1:6379"},
		{"-downstream-addr", "0.0.0.0:9999"},
		{"-n", "0"}, {"-c", "100000"}, {"-redeliver", "1.5"}, {"-sns", "-0.1"},
		{"-systems", "op,pgbench"}, {"-systems", ""},
		{"-target-pid", "7"},
		{"-mem-delay", "1m"},
		{"-gateway-memory-limit", "56MB"},
		{"-gateway-memory-limit", "56MiB", "-target", "http://127.0.0.1:8080"},
		{"-systems", "bare,ackgate", "-target", "http://127.0.0.1:8080"},
		{"extra"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%q was accepted", args)
		}
	}
	for _, args := range [][]string{
		{"-postgres-url", "postgres://u:p@localhost:5432/x"},
		{"-target", "http://[::1]:8080", "-target-pid", "7"},
		{"-systems", "ackgate", "-redis-addr", "127.0.0.1:6379"},
		{"-gateway-memory-limit", "56MiB"},
	} {
		if _, err := parseFlags(args, io.Discard); err != nil {
			t.Errorf("%q: %v", args, err)
		}
	}
}

// The report states the limit the gateway ran under as the gateway reads
// it: the flag over the environment, its soft limit at the ratio.
func TestDescribeMemoryLimit(t *testing.T) {
	t.Parallel()
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, c := range []struct {
		flag string
		env  func(string) string
		want string
	}{
		{"", env(), "none"},
		{"", env("GOMEMLIMIT", "100MiB"), "GOMEMLIMIT=100MiB (from the environment)"},
		{"56MiB", env(), "GATEWAY_MEMORY_LIMIT=56MiB (from -gateway-memory-limit): Go runtime soft limit 28.0 MiB (ratio 0.9)"},
		{"64MiB", env("GATEWAY_MEMORY_LIMIT", "1GiB", "GATEWAY_MEMORY_LIMIT_RATIO", "0.5"),
			"GATEWAY_MEMORY_LIMIT=64MiB (from -gateway-memory-limit): Go runtime soft limit 32.0 MiB (ratio 0.5)"},
		{"", env("GATEWAY_MEMORY_LIMIT", "256MiB"), "GATEWAY_MEMORY_LIMIT=256MiB (from the environment): Go runtime soft limit 224.0 MiB (ratio 0.9)"},
	} {
		got, err := describeMemoryLimit(c.flag, c.env)
		if err != nil || got != c.want {
			t.Errorf("flag %q: %q, %v; want %q", c.flag, got, err, c.want)
		}
	}
	if _, err := describeMemoryLimit("lots", env()); err == nil {
		t.Error("a size that is not one was accepted")
	}
}

func TestWithQuery(t *testing.T) {
	t.Parallel()
	got, err := withQuery("postgres://u:p@127.0.0.1/db?sslmode=disable&pool_max_conns=4", "pool_max_conns=16")
	if err != nil || got != "postgres://u:p@127.0.0.1/db?pool_max_conns=16&sslmode=disable" {
		t.Errorf("withQuery = %q, %v", got, err)
	}
	if got, _ := withQuery("postgres://h/db", ""); got != "postgres://h/db" {
		t.Errorf("no params changed the URL: %q", got)
	}
}

func TestGoalVerdicts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		g    goal
		want string
	}{
		{goal{value: 0.1, target: 1, atLeast: true}, "missed: 10.0× short"},
		{goal{value: 1.2, target: 1, atLeast: true}, "met"},
		{goal{value: 6, target: 2}, "missed: 3.0× over"},
		{goal{value: 2, target: 2}, "met"},
		{goal{value: math.NaN(), target: 2}, "not measured"},
		{goal{value: 1, target: 2, missing: true}, "not measured"},
		{goal{value: 1, target: 2, noisy: true}, "not judged: noisy"},
		{goal{value: math.NaN(), target: 2, noisy: true}, "not judged: noisy"},
	} {
		if got := c.g.verdict(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.g, got, c.want)
		}
	}
}

// fakeSender acks every message whose id does not end in 7; a redelivery of
// a message is acked as its first delivery was.
type fakeSender struct{ calls atomic.Int64 }

func (f *fakeSender) send(_ context.Context, m message) (bool, string) {
	f.calls.Add(1)
	if strings.HasSuffix(m.ID, "7") {
		return false, "503"
	}
	return true, "204"
}

func TestDriveCountsEveryDelivery(t *testing.T) {
	t.Parallel()
	g := newGenerator("lgtest", "drive", 64, 0)
	msgs := make([]message, 100)
	for i := range msgs {
		msgs[i] = g.message(i)
	}
	var done atomic.Int64
	s := &fakeSender{}
	r := drive(context.Background(), s, msgs, 8, 0.5, time.Second, &done)
	// Ids ending in 7: 10 of 100. Half the indices are picked for a
	// redelivery, but only acked messages are redelivered.
	redelivered := 0
	for i := range msgs {
		if picked(i, 0.5) && !strings.HasSuffix(msgs[i].ID, "7") {
			redelivered++
		}
	}
	if r.acked != 90 || r.failed() != 10 || r.failures["503"] != 10 || done.Load() != 100 || len(r.fresh) != 100 {
		t.Errorf("acked %d failed %d (%v), done %d, %d latencies", r.acked, r.failed(), r.failures, done.Load(), len(r.fresh))
	}
	if len(r.again) != redelivered || r.againAcked != redelivered || s.calls.Load() != int64(100+redelivered) {
		t.Errorf("%d redeliveries (%d acked), %d calls; want %d", len(r.again), r.againAcked, s.calls.Load(), redelivered)
	}

	// A cancelled run stops and says how many were never sent.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r = drive(ctx, s, msgs, 4, 0, time.Second, nil)
	if len(r.fresh) != 0 || r.failed() != 100 {
		t.Errorf("cancelled: %d sent, %d failed (%v)", len(r.fresh), r.failed(), r.failures)
	}
}

func TestForwarderDecodesForwardsAndAcks(t *testing.T) {
	t.Parallel()
	down, err := startDownstream("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = down.close(context.Background()) })
	fwd, err := startForwarder(down.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fwd.close(context.Background()) })

	client := newPushClient(2, 10*time.Second)
	p := &pushSender{base: fwd.url, route: "loadgen", snsRoute: "loadgen-sns", client: client}
	g := newGenerator("lgtest", "fwd", 100, 0.5)
	for i := range 4 {
		if ok, outcome := p.send(context.Background(), g.message(i)); !ok || outcome != "204" {
			t.Fatalf("message %d: %v %s", i, ok, outcome)
		}
	}
	if down.calls.Load() != 4 || down.keyless.Load() != 0 {
		t.Errorf("downstream saw %d calls, %d without a key", down.calls.Load(), down.keyless.Load())
	}

	resp, err := client.Post(fwd.url+"/v1/push/pubsub/loadgen", "application/json", strings.NewReader(`{"message":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || down.calls.Load() != 4 {
		t.Errorf("a push without an id: %d, downstream calls %d", resp.StatusCode, down.calls.Load())
	}

	// A downstream that is gone is a nack, never an ack.
	_ = down.close(context.Background())
	if ok, outcome := p.send(context.Background(), g.message(10)); ok || outcome != "503" {
		t.Errorf("downstream down: %v %s, want a 503 nack", ok, outcome)
	}
}

// The routes file is held to the gateway's own parser, so that a change to
// the routes format fails here rather than at the start of a long run.
func TestRoutesFileIsValid(t *testing.T) {
	t.Parallel()
	y := routesYAML("http://127.0.0.1:5555")
	routes, err := gwconfig.ParseRoutes([]byte(y))
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	if len(routes) != 2 || routes[0].Name != "loadgen" || routes[1].Name != "loadgen-sns" {
		t.Fatalf("want the routes loadgen and loadgen-sns:\n%s", y)
	}
}

func TestWALNoiseIsCalledNoisy(t *testing.T) {
	t.Parallel()
	base := systemResult{
		run:        driveResult{fresh: make([]time.Duration, 1000), elapsed: 10 * time.Second},
		pg:         pgCounters{walBytes: 1000 * 1000},
		walNet:     900,
		background: background{mean: 10000, median: 10000},
	}
	if got := base.walNetText(); got != "900" {
		t.Errorf("quiet phase: %q", got)
	}
	loud := base
	loud.background.mean = 60000 // 600 B/msg of 1000
	if got := loud.walNetText(); got != "noisy" {
		t.Errorf("background of 60%%: %q", got)
	}
	storm := base
	storm.pg.checkpoints = 3 // in 10 s
	if got := storm.walNetText(); got != "noisy" {
		t.Errorf("3 checkpoints in 10 s: %q", got)
	}
	negative := base
	negative.walNet = -5
	if got := negative.walNetText(); got != "noisy" {
		t.Errorf("negative net: %q", got)
	}
	nothing := systemResult{run: driveResult{fresh: make([]time.Duration, 10), elapsed: time.Second}, background: background{mean: 0, median: 0}}
	if got := nothing.walNetText(); got != "0" {
		t.Errorf("no WAL, no background: %q", got)
	}
}

func TestTableWritesPerMessage(t *testing.T) {
	t.Parallel()
	before := tableWrites{"operations": {ins: 10, upd: 90, hot: 40}, "idle": {ins: 5}}
	after := tableWrites{"operations": {ins: 110, upd: 990, hot: 418}, "idle": {ins: 5}, "transitions": {ins: 600}, "leases": {ins: 100, del: 100}}
	d := after.sub(before)
	if len(d) != 3 || d["operations"] != (rowWrites{ins: 100, upd: 900, hot: 378}) {
		t.Fatalf("sub = %v", d)
	}
	want := "leases 1.00 inserted, 1.00 deleted; operations 1.00 inserted, 9.00 updated (42% HOT); transitions 6.00 inserted"
	if got := d.describe(100); got != want {
		t.Errorf("describe =\n%s\nwant\n%s", got, want)
	}
}

// The gateway and the forwarder run with the image's GODEBUG unless the
// environment has one of its own, which replaces it as a deployment's does.
func TestImageGodebugUnlessTheEnvironmentSetsOne(t *testing.T) {
	base := []string{"PATH=/bin", "HOME=/root"}
	got := withImageGodebug(base)
	if godebugOf(got) != imageGodebug || len(base) != 2 {
		t.Errorf("without GODEBUG: %v (and the environment given is %v)", got, base)
	}
	own := []string{"PATH=/bin", "GODEBUG=madvdontneed=1"}
	if got := withImageGodebug(own); godebugOf(got) != "madvdontneed=1" || len(got) != 2 {
		t.Errorf("with GODEBUG of its own: %v", got)
	}
	if godebugOf(base) != "" {
		t.Errorf("no GODEBUG read as %q", godebugOf(base))
	}
}
