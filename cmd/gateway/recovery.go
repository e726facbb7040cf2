package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

// The recovery lanes from a shell: resolve an operation the gateway cannot
// settle by itself, replay a terminal one, list the dead letters. Like the
// other ops they go through the admin API, which decides and records;
// these commands only carry the operator's words and say what came back.

// Exit statuses of gateway ops besides 0 and 1 (anything else), so that a
// script can tell "refused, nothing changed" from "try again".
const (
	exitUsage       = 2 // flags or arguments the command does not take
	exitRefused     = 3 // 409: not in this state; nothing was changed
	exitRequest     = 4 // 400, 401, 404, 413: the request, the token or the id is wrong
	exitUnavailable = 5 // 503 or another 5xx, 429, or the admin API unreachable: try again
)

// exitError is an error with the process exit status it calls for.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// ExitCode is what main exits with.
func (e *exitError) ExitCode() int { return e.code }

func usageError(msg string) error { return &exitError{code: exitUsage, err: errors.New(msg)} }

func exitCodeFor(status int) int {
	switch {
	case status == http.StatusConflict:
		return exitRefused
	case status >= 500, status == http.StatusTooManyRequests:
		return exitUnavailable
	case status >= 400:
		return exitRequest
	}
	return 1
}

// parseWithID parses fs from args, which hold exactly one operation id
// before, between or after the flags.
func parseWithID(fs *flag.FlagSet, args []string) (string, error) {
	var ids []string
	for {
		if err := fs.Parse(args); err != nil {
			return "", &exitError{code: exitUsage, err: err}
		}
		if fs.NArg() == 0 {
			break
		}
		ids = append(ids, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(ids) != 1 {
		return "", usageError(fs.Name() + ": want exactly one operation id")
	}
	return ids[0], nil
}

// actorFlag is kept for scripts written before named credentials: the
// gateway records the name of the credential in GATEWAY_ADMIN_TOKEN as the
// actor, and refuses an --actor that names anyone else. --note carries free
// text instead.
func actorFlag(fs *flag.FlagSet, _ func(string) string) (actor, note *string) {
	actor = fs.String("actor", "", "deprecated: the actor is the name of the credential in GATEWAY_ADMIN_TOKEN; if given, it must be that name")
	note = fs.String("note", "", "free text kept with the reason (a ticket, on whose behalf)")
	return actor, note
}

func needText(name, v string) error {
	if v == "" {
		return usageError("--" + name + " is required")
	}
	return nil
}

func opsResolve(ctx context.Context, c *adminClient, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ops resolve", flag.ContinueOnError)
	kind := fs.String("kind", "", "what happened to the effect: happened, not_happened or abandon")
	resultID := fs.String("result-id", "", "the effect's result id at the downstream (with --kind happened)")
	reason := fs.String("reason", "", "why, kept in the evidence record")
	actor, note := actorFlag(fs, getenv)
	asJSON := fs.Bool("json", false, "print the evidence record as JSON")
	id, err := parseWithID(fs, args)
	if err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{{"kind", *kind}, {"reason", *reason}} {
		if err := needText(f.name, f.v); err != nil {
			return err
		}
	}
	req := adminapi.ResolveRequest{Kind: gate.ResolutionKind(*kind), ResultID: *resultID, Reason: *reason, Note: *note, Actor: *actor}
	var rec adminapi.EvidenceRecord
	h, err := c.post(ctx, "/v1/operations/"+url.PathEscape(id)+"/resolve", req, &rec)
	if err != nil {
		return err
	}
	return printResolved(stdout, h, &rec, *asJSON)
}

func opsReplay(ctx context.Context, c *adminClient, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ops replay", flag.ContinueOnError)
	reason := fs.String("reason", "", "why, kept in the evidence record")
	actor, note := actorFlag(fs, getenv)
	asJSON := fs.Bool("json", false, "print the evidence record as JSON")
	id, err := parseWithID(fs, args)
	if err != nil {
		return err
	}
	if err := needText("reason", *reason); err != nil {
		return err
	}
	var rec adminapi.EvidenceRecord
	h, err := c.post(ctx, "/v1/operations/"+url.PathEscape(id)+"/replay", adminapi.ReplayRequest{Reason: *reason, Note: *note, Actor: *actor}, &rec)
	if err != nil {
		return err
	}
	return printResolved(stdout, h, &rec, *asJSON)
}

// opsOutbox acts on a handoff's outbox entry: retry makes it due now,
// cancel stops relaying it (its operation ends terminal, replayable). The
// entry is named by its operation's id, as the API names it.
func opsOutbox(ctx context.Context, c *adminClient, args []string, getenv func(string) string, stdout io.Writer) error {
	const want = "want retry or cancel, then an operation id"
	if len(args) == 0 {
		return usageError("ops outbox: " + want)
	}
	action := args[0]
	if action != "retry" && action != "cancel" {
		return usageError(fmt.Sprintf("ops outbox: unknown action %q (%s)", action, want))
	}
	fs := flag.NewFlagSet("ops outbox "+action, flag.ContinueOnError)
	reason := fs.String("reason", "", "why, kept in the evidence record")
	actor, note := actorFlag(fs, getenv)
	asJSON := fs.Bool("json", false, "print the evidence record as JSON")
	id, err := parseWithID(fs, args[1:])
	if err != nil {
		return err
	}
	if err := needText("reason", *reason); err != nil {
		return err
	}
	var rec adminapi.EvidenceRecord
	h, err := c.post(ctx, "/v1/outbox/"+url.PathEscape(id)+"/"+action, adminapi.OutboxActionRequest{Reason: *reason, Note: *note, Actor: *actor}, &rec)
	if err != nil {
		return err
	}
	return printResolved(stdout, h, &rec, *asJSON)
}

// printResolved says what a resolution did and what happens next.
func printResolved(stdout io.Writer, h http.Header, rec *adminapi.EvidenceRecord, asJSON bool) error {
	if asJSON {
		return writeJSON(stdout, rec)
	}
	op := rec.Operation
	if h.Get("X-Ackgate-Resolution") == "already_applied" {
		cleanf(stdout, "%s: already recorded, nothing changed\n", op.ID)
	} else {
		cleanf(stdout, "%s: recorded\n", op.ID)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	cleanf(tw, "state\t%s\n", op.State)
	if mi := rec.Evidence.ManualIntervention; mi != nil {
		cleanf(tw, "intervention\t%s\n", *mi)
	}
	cleanf(tw, "idempotency key\t%s\n", op.IdempotencyKey)
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case op.State == gate.StatePendingEffect && op.Grant > op.AttemptCount:
		fmt.Fprintln(stdout, "\nOne attempt is granted. The gateway keeps no message bodies: the next delivery of the message makes it,")
		fmt.Fprintln(stdout, "a broker redelivery or the message re-published (see docs/operations.md, Recovery lanes).")
	case op.State.Confirmed():
		fmt.Fprintln(stdout, "\nThe next delivery of the message is acked without calling the downstream.")
	}
	fmt.Fprintln(stdout, "\n"+clean(rec.Statement))
	return nil
}

func opsDeadLetters(ctx context.Context, c *adminClient, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ops dead-letters", flag.ContinueOnError)
	q := url.Values{}
	fs.Func("route", "only this route's terminal records", func(v string) error { q.Set("route", v); return nil })
	fs.Func("limit", "page size, 1 to 500 (default 50)", func(v string) error { q.Set("limit", v); return nil })
	fs.Func("cursor", "the page after this cursor", func(v string) error { q.Set("cursor", v); return nil })
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := c.knownRoute(ctx, q.Get("route")); err != nil {
		return err
	}
	var list adminapi.DeadLetterList
	if err := c.get(ctx, "/v1/dead-letters", q, &list); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tROUTE\tSTATE\tBY\tAGE\tREPLAYABLE\tMESSAGE\tREASON")
	for _, d := range list.DeadLetters {
		cleanf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.OperationID, d.Route, d.State, d.DeadLetteredBy,
			(time.Duration(d.AgeSeconds) * time.Second).String(), strconv.FormatBool(d.Replayable), d.MessageID, gate.Bound(d.Reason, 80))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if list.NextCursor != "" {
		cleanf(stdout, "more: -cursor %s\n", list.NextCursor)
	}
	return nil
}
