package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	gwconfig "github.com/ackgate/ackgate/config"
)

// defaultPostgresURL is the role and database scripts/services.sh creates; the
// role needs CREATEDB, since every run gets a database of its own.
const defaultPostgresURL = "postgres://ackgate:ackgate@127.0.0.1:5432/ackgate?sslmode=disable"

// Systems, in the order a phase runs them.
const (
	sysOp        = "op"
	sysForwarder = "forwarder"
	sysBare      = "bare"
	sysAckgate   = "ackgate"
)

var allSystems = []string{sysOp, sysForwarder, sysBare, sysAckgate}

type config struct {
	// The main phase: the throughput comparison.
	N, C int
	// The latency phase at one in flight; 0 skips it.
	N1 int
	// The memory phase: the gateway alone at MemC in flight, the downstream
	// answering after MemDelay; MemN 0 skips it.
	MemN, MemC int
	MemDelay   time.Duration
	// The handoff phase (handoff.go): HandoffN messages at C in flight to a
	// handoff route; 0 skips it.
	HandoffN int
	// Warmup messages per system and phase, not measured.
	Warmup int
	// Shares of the messages that are also redelivered after their ack, and
	// that go to the SNS route instead of the Pub/Sub one.
	Redeliver, SNS float64
	PayloadBytes   int
	Systems        []string

	PostgresURL string // server on which the run's own database is created
	RedisAddr   string // empty: a private redis-server
	GatewayBin  string // empty: go build ./cmd/gateway
	// GatewayDBParams is added to the gateway's database URL query, for
	// example pool_max_conns=16.
	GatewayDBParams string
	GatewayLogLevel string
	// GatewayMemoryLimit is GATEWAY_MEMORY_LIMIT for the gateway started
	// (a size such as 56MiB); empty passes none of its own.
	GatewayMemoryLimit string
	// memoryLimit says what limit the gateway started runs under, for the
	// report; set by validate.
	memoryLimit string

	// Target mode: a gateway that is already running.
	Target         string // its ingest base URL
	TargetRoute    string
	TargetSNSRoute string
	TargetDBURL    string // its database, for its transaction counts
	TargetPID      int    // its process, for RSS and CPU
	DownstreamAddr string // where the in-process downstream listens

	RequestTimeout time.Duration
	MaxDuration    time.Duration
	// Settle is how long to wait for an external gateway's database
	// backends to publish their statistics; Postgres does so at most about
	// 10 s after they go idle.
	Settle time.Duration
	// Idle is how long the cluster's own WAL rate is sampled before each
	// phase, with nothing of this tool running.
	Idle time.Duration
	// Vacuum runs VACUUM (ANALYZE) over the run's own database before each
	// phase, so that what earlier phases' writes owe is not done by
	// autovacuum during a later one.
	Vacuum bool
	KeepDB bool
	Quiet  bool
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	var systems string
	fs.IntVar(&c.N, "n", 20000, "unique messages per system in the main phase")
	fs.IntVar(&c.C, "c", 16, "messages in flight in the main phase")
	fs.IntVar(&c.N1, "n1", 2000, "messages per system at 1 in flight (0 skips the phase)")
	fs.IntVar(&c.MemN, "mem-n", 5000, "messages to the gateway in the memory phase (0 skips it)")
	fs.IntVar(&c.HandoffN, "handoff-n", 2000, "messages to the gateway's handoff route in the handoff phase, push path and relay side by side (0 skips it; not with -target)")
	fs.IntVar(&c.MemC, "mem-c", 1000, "messages in flight in the memory phase")
	fs.DurationVar(&c.MemDelay, "mem-delay", 100*time.Millisecond, "downstream answer delay in the memory phase")
	fs.IntVar(&c.Warmup, "warmup", 200, "unmeasured messages per system before each phase")
	fs.Float64Var(&c.Redeliver, "redeliver", 0, "share of messages pushed a second time after their ack (0 to 1)")
	fs.Float64Var(&c.SNS, "sns", 0, "share of messages sent as SNS notifications instead of Pub/Sub pushes (0 to 1)")
	fs.IntVar(&c.PayloadBytes, "payload", 256, "bytes of message data")
	fs.StringVar(&systems, "systems", strings.Join(allSystems, ","), "systems to run, comma-separated: op, forwarder, bare, ackgate (with -target, bare by default only with -redis-addr)")
	fs.StringVar(&c.PostgresURL, "postgres-url", envOr("ACKGATE_TEST_DATABASE_URL", defaultPostgresURL), "Postgres on loopback where the run's database is created (the role needs CREATEDB)")
	fs.StringVar(&c.RedisAddr, "redis-addr", "", "Redis for the gateway (host:port on loopback); empty starts a private redis-server, whose counters nothing else touches")
	fs.StringVar(&c.GatewayBin, "gateway-bin", "", "gateway binary; empty builds ./cmd/gateway (run from the repository)")
	fs.StringVar(&c.GatewayDBParams, "gateway-db-params", "", "query parameters added to the gateway's database URL, e.g. pool_max_conns=16")
	fs.StringVar(&c.GatewayLogLevel, "gateway-log-level", "info", "GATEWAY_LOG_LEVEL of the gateway started (its log goes to a temporary file)")
	fs.StringVar(&c.GatewayMemoryLimit, "gateway-memory-limit", "", "GATEWAY_MEMORY_LIMIT of the gateway started, e.g. 56MiB as the chart passes a pod's limit (GATEWAY_MEMORY_LIMIT_RATIO of it becomes the Go runtime's soft limit); empty: none unless the environment sets one")
	fs.StringVar(&c.Target, "target", "", "ingest URL of a gateway already running (loopback); nothing is started")
	fs.StringVar(&c.TargetRoute, "target-route", "loadgen", "with -target: its Pub/Sub route, which must call the downstream at -downstream-addr")
	fs.StringVar(&c.TargetSNSRoute, "target-sns-route", "loadgen-sns", "with -target and -sns: its SNS route (auth: none)")
	fs.StringVar(&c.TargetDBURL, "target-database-url", "", "with -target: the gateway's database, for its transaction counts")
	fs.IntVar(&c.TargetPID, "target-pid", 0, "with -target: the gateway's process id, for its RSS and CPU")
	fs.StringVar(&c.DownstreamAddr, "downstream-addr", "127.0.0.1:0", "listen address of the in-process downstream")
	fs.DurationVar(&c.RequestTimeout, "request-timeout", 30*time.Second, "client timeout of one push")
	fs.DurationVar(&c.MaxDuration, "max-duration", 30*time.Minute, "the whole run stops after this")
	fs.DurationVar(&c.Settle, "settle", 11*time.Second, "with -target: wait this long after a phase for Postgres statistics")
	fs.DurationVar(&c.Idle, "idle", 3*time.Second, "before each phase, sample the WAL the rest of the cluster writes for this long (0: none)")
	fs.BoolVar(&c.Vacuum, "vacuum", true, "before each phase, VACUUM (ANALYZE) the run's own database, so that autovacuum does not do during one phase what earlier phases' writes owe (its time and WAL are reported)")
	fs.BoolVar(&c.KeepDB, "keep-db", false, "keep the run's database afterwards")
	fs.BoolVar(&c.Quiet, "quiet", false, "no progress lines on stderr")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for s := range strings.SplitSeq(systems, ",") {
		if s = strings.TrimSpace(s); s != "" {
			c.Systems = append(c.Systems, s)
		}
	}
	systemsSet := false
	fs.Visit(func(f *flag.Flag) { systemsSet = systemsSet || f.Name == "systems" })
	if !systemsSet && c.Target != "" && c.RedisAddr == "" {
		// The bare pipeline needs a Redis, and a private one would be read
		// as the target's: by default it runs only when -redis-addr names
		// the target's.
		c.Systems = slices.DeleteFunc(c.Systems, func(s string) bool { return s == sysBare })
	}
	return c, c.validate()
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func (c *config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	// Bounds keep a typo from turning into hours of load or thousands of
	// connections.
	if c.N < 1 || c.N > 10_000_000 {
		bad("-n %d: want 1 to 10000000", c.N)
	}
	if c.C < 1 || c.C > 5000 {
		bad("-c %d: want 1 to 5000", c.C)
	}
	if c.N1 < 0 || c.N1 > 1_000_000 {
		bad("-n1 %d: want 0 to 1000000", c.N1)
	}
	if c.HandoffN < 0 || c.HandoffN > 1_000_000 {
		bad("-handoff-n %d: want 0 to 1000000", c.HandoffN)
	}
	if c.MemN < 0 || c.MemN > 1_000_000 {
		bad("-mem-n %d: want 0 to 1000000", c.MemN)
	}
	if c.MemC < 1 || c.MemC > 5000 {
		bad("-mem-c %d: want 1 to 5000", c.MemC)
	}
	if c.MemDelay < 0 || c.MemDelay > 5*time.Second {
		bad("-mem-delay %s: want 0 to 5s (the route's effect timeout)", c.MemDelay)
	}
	if c.Warmup < 0 || c.Warmup > 100_000 {
		bad("-warmup %d: want 0 to 100000", c.Warmup)
	}
	if c.Redeliver < 0 || c.Redeliver > 1 {
		bad("-redeliver %g: want a share from 0 to 1", c.Redeliver)
	}
	if c.SNS < 0 || c.SNS > 1 {
		bad("-sns %g: want a share from 0 to 1", c.SNS)
	}
	if c.PayloadBytes < 1 || c.PayloadBytes > 512<<10 {
		bad("-payload %d: want 1 to 524288", c.PayloadBytes)
	}
	if len(c.Systems) == 0 {
		bad("-systems: name at least one of %s", strings.Join(allSystems, ", "))
	}
	for _, s := range c.Systems {
		if !slices.Contains(allSystems, s) {
			bad("-systems: %q is not one of %s", s, strings.Join(allSystems, ", "))
		}
	}
	if c.RequestTimeout <= 0 || c.MaxDuration <= 0 || c.Settle < 0 || c.Idle < 0 || c.Idle > time.Minute {
		bad("-request-timeout and -max-duration must be positive, -settle not negative, -idle from 0 to 1m")
	}
	if err := loopbackURL(c.PostgresURL, "postgres", "postgresql"); err != nil {
		bad("-postgres-url: %v", err)
	}
	if c.RedisAddr != "" {
		if err := loopbackHostPort(c.RedisAddr); err != nil {
			bad("-redis-addr: %v", err)
		}
	}
	if err := loopbackHostPort(c.DownstreamAddr); err != nil {
		bad("-downstream-addr: %v", err)
	}
	if c.Target != "" {
		if err := loopbackURL(c.Target, "http"); err != nil {
			bad("-target: %v", err)
		}
		if c.TargetDBURL != "" {
			if err := loopbackURL(c.TargetDBURL, "postgres", "postgresql"); err != nil {
				bad("-target-database-url: %v", err)
			}
		}
		if c.TargetPID < 0 {
			bad("-target-pid %d is not a process id", c.TargetPID)
		}
		if c.runs(sysBare) && c.RedisAddr == "" {
			// A private Redis would be read as the target's.
			bad("-systems bare with -target needs -redis-addr")
		}
	} else if c.TargetDBURL != "" || c.TargetPID != 0 {
		bad("-target-database-url and -target-pid only apply with -target")
	}
	if c.GatewayDBParams != "" {
		if _, err := url.ParseQuery(c.GatewayDBParams); err != nil {
			bad("-gateway-db-params: %v", err)
		}
	}
	if c.Target != "" {
		c.memoryLimit = "the target's own"
		if c.GatewayMemoryLimit != "" {
			bad("-gateway-memory-limit applies only to a gateway this run starts, not with -target")
		}
	} else {
		var err error
		if c.memoryLimit, err = describeMemoryLimit(c.GatewayMemoryLimit, os.Getenv); err != nil {
			bad("-gateway-memory-limit: %v", err)
		}
	}
	return errors.Join(errs...)
}

// describeMemoryLimit says which memory limit a gateway started with flag
// (the -gateway-memory-limit value) and the environment getenv runs under,
// read the way the gateway reads it, so that the report states the limit
// behind its peak RSS.
func describeMemoryLimit(flag string, getenv func(string) string) (string, error) {
	env := func(k string) string {
		if k == "GATEWAY_MEMORY_LIMIT" && flag != "" {
			return flag
		}
		return getenv(k)
	}
	limit := env("GATEWAY_MEMORY_LIMIT")
	if limit == "" {
		if v := getenv("GOMEMLIMIT"); v != "" {
			return "GOMEMLIMIT=" + v + " (from the environment)", nil
		}
		return "none", nil
	}
	s, err := gwconfig.LoadSettings(func(k string) string {
		switch k {
		case "GATEWAY_MEMORY_LIMIT", "GATEWAY_MEMORY_LIMIT_RATIO":
			return env(k)
		}
		return ""
	})
	if err != nil {
		return "", err
	}
	from := "-gateway-memory-limit"
	if flag == "" {
		from = "the environment"
	}
	return fmt.Sprintf("GATEWAY_MEMORY_LIMIT=%s (from %s): Go runtime soft limit %.1f MiB (ratio %g)",
		limit, from, float64(s.SoftMemoryLimit())/(1<<20), s.MemoryLimitRatio), nil
}

func (c *config) runs(system string) bool { return slices.Contains(c.Systems, system) }

// loopbackURL requires an absolute URL with one of schemes whose host is a
// loopback address: the tool generates load, and must never aim it at a
// machine someone else uses.
func loopbackURL(raw string, schemes ...string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("not a URL")
	}
	if !slices.Contains(schemes, u.Scheme) {
		return fmt.Errorf("scheme %q: want %s", u.Scheme, strings.Join(schemes, " or "))
	}
	if !isLoopback(u.Hostname()) {
		return fmt.Errorf("host %q is not a loopback address", u.Hostname())
	}
	return nil
}

func loopbackHostPort(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if !isLoopback(host) {
		return fmt.Errorf("host %q is not a loopback address", host)
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
