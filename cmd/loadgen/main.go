// Command loadgen measures what the gateway's evidence costs, by running the
// gateway side by side with three systems that do the same work with less or
// none of it, in one invocation on one machine:
//
//   - op: the two statements a ledger cannot do with less (INSERT the intent,
//     UPDATE it to confirmed; two commits) through pgx, with no HTTP at all;
//   - forwarder: a naive push endpoint that decodes the message, forwards it
//     to the downstream with the message id as Idempotency-Key and acks on a
//     2xx, keeping no ledger;
//   - bare: the gateway's steps (a fenced Redis lease, the intent row, the
//     effect, the evidence row, the answer, then the ack mark) written as
//     plainly as they can be, in a process of its own (bare.go): the bound
//     any implementation of the design meets on this machine;
//   - ackgate: a real gateway process (built from ./cmd/gateway, migrated and
//     served against a database of its own), pushed by the same client code
//     as the forwarder and calling the same in-process downstream.
//
// Throughput alone on a shared machine says little; the ratios between the
// four, taken minutes apart under the same noise, say how far the evidence
// is from the speed of the database. Costs are read from the servers' own
// counters, not inferred from the client: pg_stat_database transactions,
// pg_current_wal_lsn, Redis INFO commandstats, the gateway process's
// /proc status (peak RSS, CPU), and pg_stat_activity wait events sampled
// while each phase runs.
//
// It is a binary rather than a go test benchmark because it measures a
// gateway process as deployed (its own runtime, connection pools, logging and
// memory), and because it can be pointed at a gateway that is already
// running (-target). `make bench` runs it at the defaults; docs/performance.md
// has the figures of real runs and how to read them.
//
// Everything it talks to is on loopback, and every loop is bounded by a count
// and by -max-duration.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if serveForwarderIfAsked() || serveBareIfAsked() {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

// run is the whole program, so that a test can run it in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	_, err = execute(ctx, cfg, stdout, stderr)
	return err
}
