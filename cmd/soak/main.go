// Command soak runs two gateway processes under crashes and faults and prints
// the invariants the gateway promises, each of which must be 0; it exits 1
// when one is not, or when the run could not be carried out. `make soak` runs
// it in full; docs/reliability.md describes what it does and what a pass
// shows.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/ackgate/ackgate/internal/soak"
	"github.com/ackgate/ackgate/internal/soak/faultydown"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

// wantsShort looks for -short ahead of parsing, since it changes the
// defaults of every other flag.
func wantsShort(args []string) bool {
	short := false
	for _, a := range args {
		if a == "--" {
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if name != "short" || !strings.HasPrefix(a, "-") {
			continue
		}
		short = true
		if hasValue {
			short, _ = strconv.ParseBool(value)
		}
	}
	return short
}

// errViolated is returned when the run finished and an invariant is not 0.
var errViolated = errors.New("invariants violated")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// -short picks the base the other flags then adjust.
	cfg := soak.DefaultConfig()
	if wantsShort(args) {
		cfg = soak.ShortConfig()
	}
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Bool("short", false, "the short soak of `make test`: 300 messages, one kill, one Redis restart, no Postgres restart")
	fs.StringVar(&cfg.Gateway, "gateway", cfg.Gateway, "path of the built gateway binary")
	fs.StringVar(&cfg.Postgres, "postgres", cfg.Postgres, `"private" for a cluster of the soak's own (needed for Postgres restarts), or the URL of an empty database`)
	fs.StringVar(&cfg.PGBinDir, "pg-bin", cfg.PGBinDir, "directory with initdb and postgres (found when empty)")
	fs.StringVar(&cfg.RedisServer, "redis-server", cfg.RedisServer, "redis-server binary (from PATH when empty)")
	fs.StringVar(&cfg.WorkDir, "workdir", cfg.WorkDir, "directory for the routes file and logs (a temporary one when empty)")
	fs.IntVar(&cfg.Messages, "messages", cfg.Messages, "messages to publish")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "messages published per second")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "push requests in flight at most")
	fs.IntVar(&cfg.Kills, "kills", cfg.Kills, "gateway SIGKILLs, alternating between the two, spread over publication")
	fs.IntVar(&cfg.RedisRestarts, "redis-restarts", cfg.RedisRestarts, "Redis restarts that lose its data")
	fs.IntVar(&cfg.PostgresRestarts, "postgres-restarts", cfg.PostgresRestarts, "Postgres crashes and restarts (private cluster only)")
	fs.DurationVar(&cfg.RestartPause, "restart-pause", cfg.RestartPause, "how long a killed gateway stays down")
	fs.Float64Var(&cfg.Faults.Status5xx, "fail-rate", cfg.Faults.Status5xx, "share of effect calls answered 503 without applying")
	fs.Float64Var(&cfg.Faults.LoseResponse, "lose-rate", cfg.Faults.LoseResponse, "share of effect calls applied and then cut off without an answer")
	fs.Float64Var(&cfg.Faults.Slow, "slow-rate", cfg.Faults.Slow, "share of effect calls applied and answered after the ack deadline")
	fs.Float64Var(&cfg.Faults.LookupDown, "lookup-down-rate", cfg.Faults.LookupDown, "share of lookups answered 503")
	fs.Float64Var(&cfg.PoisonRate, "poison-rate", cfg.PoisonRate, "share of messages the downstream always refuses")
	fs.Float64Var(&cfg.ReuseRate, "reuse-rate", cfg.ReuseRate, "share of messages published again under the same id with a changed payload")
	fs.Float64Var(&cfg.DuplicateRate, "duplicate-rate", cfg.DuplicateRate, "share of deliveries pushed as two copies at once")
	fs.Float64Var(&cfg.RedeliverAfterAckRate, "redeliver-rate", cfg.RedeliverAfterAckRate, "share of acked messages delivered once more")
	fs.DurationVar(&cfg.MinBackoff, "min-backoff", cfg.MinBackoff, "subscription retry policy: first backoff")
	fs.DurationVar(&cfg.MaxBackoff, "max-backoff", cfg.MaxBackoff, "subscription retry policy: longest backoff")
	fs.IntVar(&cfg.MaxDeliveryAttempts, "max-delivery-attempts", cfg.MaxDeliveryAttempts, "subscription dead-letter policy: deliveries before it gives up")
	fs.StringVar(&cfg.Broker, "broker", cfg.Broker, `"pushsim" (the repository's push simulator) or "emulator" (Google's Pub/Sub emulator, package google-cloud-cli-pubsub-emulator)`)
	fs.StringVar(&cfg.EmulatorLauncher, "emulator", cfg.EmulatorLauncher, "the emulator's cloud-pubsub-emulator launcher (found under gcloud's SDK when empty)")
	fs.BoolVar(&cfg.EmulatorDeadLetter, "emulator-dead-letter", cfg.EmulatorDeadLetter, "give the emulator's subscriptions a dead-letter policy of -max-delivery-attempts; without one every route dead-letters at the gateway")
	fs.DurationVar(&cfg.OperatorEvery, "operator-every", cfg.OperatorEvery, "how often the soak's operator resolves parked operations and replays dead letters through the admin API (0: never)")
	fs.DurationVar(&cfg.SettleTimeout, "settle-timeout", cfg.SettleTimeout, "once publication ends, how long to wait for the broker to be done with every message; one still delivered then is a violation")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the random choices (faults, poison, reuse)")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "bound on the whole run")
	fs.DurationVar(&cfg.RelayDrain, "relay-drain", cfg.RelayDrain, "once the subscription is done, how long to wait for the relay to settle every handed-off operation")
	broken := fs.String("break", "", `make the downstream and the local route's statement lie, to see the checker fail the run: "double-apply" or "lie"`)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if cfg.Broken, err = faultydown.ParseBroken(*broken); err != nil {
		return err
	}
	cfg.Progress = stderr

	rep, err := soak.Run(ctx, cfg)
	if err != nil {
		return err
	}
	rep.Print(stdout)
	if rep.Verdict.Violations() > 0 {
		return errViolated
	}
	return nil
}
