// Command gateway is ackgate: serve, migrate and check-config.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

const usage = `usage: gateway <command>

commands:
  serve          run the ingest and admin listeners
  migrate        apply the ledger's database migrations
  check-config   validate the settings and the routes file, then exit
  ops show ID    print an operation's evidence record (from the admin API)
  ops list       list operations: -route, -state, -message_id, -key, -limit, -cursor

Settings come from GATEWAY_* environment variables; "gateway help env" lists them.
`

// run is the whole program; main only supplies the process's environment, so
// tests can start the gateway in-process with their own.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
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
	case "help", "-h", "--help":
		return help(args[1:], stdout)
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}
