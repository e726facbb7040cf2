// Command drill fails over the services a gateway depends on while two
// gateway replicas carry steady load, and prints what each failover cost and
// whether the gateway kept its promise through it. `make drill` runs it;
// docs/reliability.md keeps the figures of a real run. It is not part of
// `make test`: it runs Patroni, etcd, a Redis Cluster, Sentinels and a
// network namespace, needs root, and takes minutes.
//
// Each stage is a soak (internal/soak) without its own faults, with the
// stage's failovers as its events:
//
//   - patroni: Postgres under Patroni (primary and replica, etcd), reached
//     through a multi-host URL with target_session_attrs=read-write; a
//     switchover, then the leader killed outright.
//   - redis-cluster: a Redis Cluster of three primaries with a replica each;
//     a primary killed.
//   - redis-sentinel: a Redis primary and replica under three Sentinels; a
//     failover asked of the Sentinels, then the primary killed.
//   - partition: the second gateway in a network namespace; its link to
//     Redis cut for a while, then its link to Redis and Postgres, each time
//     while it holds leases.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ackgate/ackgate/internal/drill"
	"github.com/ackgate/ackgate/internal/soak"
	"github.com/ackgate/ackgate/internal/soak/faultydown"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "drill:", err)
		os.Exit(1)
	}
}

var allStages = []string{"patroni", "redis-cluster", "redis-sentinel", "partition"}

type options struct {
	gateway   string
	messages  int
	rate      float64
	dir       string
	partition time.Duration
	pgBinDir  string
	sync      bool
	stages    []string
	progress  io.Writer
}

// errViolated: a stage finished and an invariant is not 0.
var errViolated = errors.New("invariants violated")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := options{progress: stderr}
	fs := flag.NewFlagSet("drill", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.gateway, "gateway", "bin/gateway", "path of the built gateway binary")
	fs.IntVar(&o.messages, "messages", 2400, "messages published in each stage")
	fs.Float64Var(&o.rate, "rate", 40, "messages published per second")
	fs.StringVar(&o.dir, "workdir", "", "directory for every stage's services and logs (a temporary one when empty, kept)")
	fs.DurationVar(&o.partition, "partition", 12*time.Second, "how long each partition lasts")
	fs.StringVar(&o.pgBinDir, "pg-bin", "", "directory with the PostgreSQL server binaries (found when empty)")
	fs.BoolVar(&o.sync, "patroni-sync", true, "run Patroni in synchronous mode; false replicates asynchronously, and a primary's death may lose acknowledged commits")
	stages := fs.String("stages", strings.Join(allStages, ","), "stages to run, in order: "+strings.Join(allStages, ", "))
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, s := range strings.Split(*stages, ",") {
		if !contains(allStages, s) {
			return fmt.Errorf("unknown stage %q (want some of %s)", s, strings.Join(allStages, ", "))
		}
		o.stages = append(o.stages, s)
	}
	if _, err := os.Stat(o.gateway); err != nil {
		return fmt.Errorf("gateway binary: %w (build it with `make build`)", err)
	}
	if os.Geteuid() != 0 {
		return errors.New("the drill runs Postgres as the postgres user and creates a network namespace: run it as root")
	}
	if o.dir == "" {
		d, err := os.MkdirTemp("", "ackgate-drill-")
		if err != nil {
			return err
		}
		o.dir = d
	}
	if o.pgBinDir == "" {
		dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		if len(dirs) == 0 {
			return errors.New("no PostgreSQL server binaries under /usr/lib/postgresql: apt-get install postgresql")
		}
		o.pgBinDir = dirs[len(dirs)-1]
	}
	fmt.Fprintf(stdout, "ackgate drill: %s; %d messages per stage at %.0f/s, 2 gateways; work dir %s\n",
		strings.Join(o.stages, ", "), o.messages, o.rate, o.dir)
	var summary []string
	failed := false
	for _, name := range o.stages {
		dir := filepath.Join(o.dir, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\n=== stage %s\n", name)
		rep, err := stage(ctx, name, dir, o)
		if err != nil {
			return fmt.Errorf("stage %s: %w (logs in %s)", name, err, dir)
		}
		rep.Print(stdout)
		v := rep.Verdict
		if v.Violations() > 0 {
			failed = true
		}
		for _, e := range rep.Events {
			summary = append(summary, summaryLine(name, e))
		}
		summary = append(summary, fmt.Sprintf("  %-15s invariants: two effects %d, acks without evidence %d, unaccounted %d, never settled %d",
			name, v.TwoEffects.Count, v.AcksWithoutEffect.Count, v.Unaccounted.Count, v.NeverSettled.Count))
	}
	fmt.Fprintln(stdout, "\n=== summary (deliveries not acked after each failover, and for how long)")
	for _, l := range summary {
		fmt.Fprintln(stdout, l)
	}
	if failed {
		fmt.Fprintln(stdout, "FAIL")
		return errViolated
	}
	fmt.Fprintln(stdout, "PASS")
	return nil
}

func summaryLine(stage string, e soak.EventRecord) string {
	nacks := "no delivery nacked"
	if e.Nacked > 0 {
		nacks = fmt.Sprintf("%d nacked, acked again from +%s (%d later)", e.NackedBefore, e.Recovered.Round(100*time.Millisecond),
			e.Nacked-e.NackedBefore)
	}
	unready := make([]string, len(e.Unready))
	for i, d := range e.Unready {
		unready[i] = d.Round(100 * time.Millisecond).String()
	}
	status := ""
	if e.Err != "" {
		status = " (EVENT FAILED: " + e.Err + ")"
	}
	return fmt.Sprintf("  %-15s %-44s took %6s; %s; /readyz not 200: %s%s", stage, e.Name,
		e.End.Sub(e.Start).Round(100*time.Millisecond), nacks, strings.Join(unready, " / "), status)
}

// base is every stage's soak: steady load and none of the soak's own
// faults, so that what is nacked is what the failover cost. No key is
// reused: a changed payload on a route that leaves dead letters to the
// broker is nacked until the subscription gives up, which would read as a
// failover that never ends. A few acked messages come again, so that path
// runs through the failovers too.
func base(o options, dir string) soak.Config {
	c := soak.DefaultConfig()
	c.Gateway, c.WorkDir, c.Progress = o.gateway, dir, o.progress
	c.PGBinDir = o.pgBinDir
	c.Messages, c.Rate = o.messages, o.rate
	c.Kills, c.RedisRestarts, c.PostgresRestarts = 0, 0, 0
	c.Faults = faultydown.Faults{}
	c.PoisonRate, c.ReuseRate, c.DuplicateRate, c.RedeliverAfterAckRate = 0, 0, 0, 0.02
	c.SettleTimeout = 5 * time.Minute
	c.Timeout = 20 * time.Minute
	return c
}

func stage(ctx context.Context, name, dir string, o options) (*soak.Report, error) {
	c := base(o, dir)
	switch name {
	case "patroni":
		etcd, err := drill.StartEtcd(ctx, dir)
		if err != nil {
			return nil, err
		}
		defer etcd.Close()
		pg, err := drill.StartPatroni(ctx, dir, etcd.URL, o.pgBinDir, o.sync)
		if err != nil {
			return nil, err
		}
		defer pg.Close()
		if err := pg.CreateDatabase(ctx, "drill"); err != nil {
			return nil, err
		}
		c.Postgres = pg.URL("drill")
		c.Events = []soak.Event{
			{At: 0.3, Name: "patroni switchover", Run: pg.Switchover},
			{At: 0.65, Name: "patroni leader SIGKILLed (Patroni and Postgres)", Run: func(ctx context.Context) error {
				_, err := pg.KillLeader(ctx)
				return err
			}},
		}
	case "redis-cluster":
		cl, err := drill.StartRedisCluster(ctx, dir)
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		c.Redis = map[string]string{"GATEWAY_REDIS_ADDRS": strings.Join(cl.Addrs(), ","), "GATEWAY_REDIS_CLUSTER": "true"}
		c.Events = []soak.Event{{At: 0.4, Name: "redis cluster primary SIGKILLed", Run: func(ctx context.Context) error {
			_, err := cl.KillPrimary(ctx)
			return err
		}}}
	case "redis-sentinel":
		s, err := drill.StartSentinel(ctx, dir)
		if err != nil {
			return nil, err
		}
		defer s.Close()
		c.Redis = map[string]string{"GATEWAY_REDIS_ADDRS": strings.Join(s.Addrs(), ","), "GATEWAY_REDIS_MASTER_NAME": s.Master}
		c.Events = []soak.Event{
			{At: 0.3, Name: "sentinel failover (asked)", Run: s.Failover},
			{At: 0.65, Name: "sentinel primary SIGKILLed", Run: s.KillPrimary},
		}
	case "partition":
		ns, err := drill.NewNetns("ackgate-drill", 203)
		if err != nil {
			return nil, err
		}
		defer ns.Close()
		c.Hosts = soak.Hosts{Downstream: ns.Downstream, Redis: ns.Redis, Postgres: ns.Postgres}
		c.Placement[1] = soak.Placement{Prefix: ns.Prefix(), Host: ns.NSIP}
		cut := func(addrs ...string) func(ctx context.Context) error {
			return func(ctx context.Context) error {
				if err := ns.Partition(addrs...); err != nil {
					return err
				}
				select {
				case <-ctx.Done():
				case <-time.After(o.partition):
				}
				return ns.Heal()
			}
		}
		c.Events = []soak.Event{
			{At: 0.3, Name: fmt.Sprintf("gateway 2 cut from Redis for %s", o.partition), Run: cut(ns.Redis)},
			{At: 0.65, Name: fmt.Sprintf("gateway 2 cut from Redis and Postgres for %s", o.partition), Run: cut(ns.Redis, ns.Postgres)},
		}
	}
	return soak.Run(ctx, c)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
