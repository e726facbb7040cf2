// Command gateway is ackgate: serve, migrate, check-config and the operator's
// ops commands.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/ackgate/ackgate/telemetry"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if len(os.Args) > 1 && os.Args[1] == "serve" {
			logFailure(os.Stderr, os.Getenv, err)
		} else {
			fmt.Fprintln(os.Stderr, "gateway:", err)
		}
		// ops commands say whether a refusal, a bad request or an
		// unavailable gateway stopped them (see cmd/gateway/recovery.go).
		var coded interface{ ExitCode() int }
		if errors.As(err, &coded) {
			os.Exit(coded.ExitCode())
		}
		os.Exit(1)
	}
}

const usage = `usage: gateway <command>

commands:
  serve          run the ingest and admin listeners
  migrate        apply the ledger's database migrations
  check-config   validate the settings and the routes file, then exit
  version        print the version this binary was built as
  ops show ID    print an operation's evidence record (-json for all of it)
  ops list       list operations: -route, -state, -message_id, -key, -limit, -cursor; -q for ids only
  ops resolve ID --kind happened|not_happened|abandon [--result-id R] --reason TEXT [--note TEXT]
                 record what became of an operation's effect (under the token's credential name)
  ops replay ID --reason TEXT [--note TEXT]
                 give a terminally failed operation one more attempt, same key
  ops outbox retry|cancel ID --reason TEXT [--note TEXT]
                 make a handoff's outbox entry due now, or stop relaying it (its
                 operation ends terminal_failure, and a replay hands it back)
  ops dead-letters
                 list terminal operations and conflict records: -route, -limit, -cursor
  ops poison     list messages kept without a usable identity: -route, -limit, -cursor
  ops routes     list the routes the gateway serves, with their contract versions

ops read GATEWAY_ADMIN_URL (default http://127.0.0.1 on GATEWAY_ADMIN_ADDR's
port, :8081) and GATEWAY_ADMIN_TOKEN. Exit status: 0 done; 2 a flag or
argument the command does not take; 3 refused (409: nothing changed); 4 a
bad request, token, operation id or route name (4xx); 5 unavailable (5xx,
unreachable: try again); 1 anything else.

Settings come from GATEWAY_* environment variables; "gateway help env" lists them.
`

// run is the whole program; main only supplies the process's environment, so
// tests can start the gateway in-process with their own.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageError("no command given")
	}
	switch args[0] {
	case "serve":
		return serve(ctx, getenv, stdout, stderr)
	case "migrate":
		return migrate(ctx, getenv, stdout)
	case "check-config":
		return checkConfig(getenv, stdout)
	case "ops":
		return ops(ctx, args[1:], getenv, stdout)
	case "version":
		_, err := fmt.Fprintln(stdout, telemetry.Version())
		return err
	case "help", "-h", "--help":
		return help(args[1:], stdout)
	}
	fmt.Fprint(stderr, usage)
	return usageError(fmt.Sprintf("unknown command %s", clean(args[0])))
}
