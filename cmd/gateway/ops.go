package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

// ops is the operator's side of the admin API: "what happened to message X?"
// from a shell. It talks to a running gateway's admin listener rather than to
// the database, so it sees exactly what the API shows and needs only the
// admin token, never database credentials.
//
// The admin URL is GATEWAY_ADMIN_URL, or http://127.0.0.1 on the port of
// GATEWAY_ADMIN_ADDR (default :8081); the token is GATEWAY_ADMIN_TOKEN.
func ops(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	const want = "want show, list, resolve, replay, outbox, dead-letters, poison or routes"
	if len(args) == 0 {
		return usageError("ops: " + want)
	}
	// The client's own error (no token, a bad address) waits for its first
	// request, so that flags are checked first: a usage error is a usage
	// error with or without a token.
	c := newAdminClient(getenv)
	err := opsCommand(ctx, c, args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil // -h: the flag package has printed the flags
	}
	return err
}

func opsCommand(ctx context.Context, c *adminClient, args []string, getenv func(string) string, stdout io.Writer) error {
	const want = "want show, list, resolve, replay, outbox, dead-letters, poison or routes"
	switch args[0] {
	case "show":
		return opsShow(ctx, c, args[1:], stdout)
	case "list":
		return opsList(ctx, c, args[1:], stdout)
	case "resolve":
		return opsResolve(ctx, c, args[1:], getenv, stdout)
	case "replay":
		return opsReplay(ctx, c, args[1:], getenv, stdout)
	case "outbox":
		return opsOutbox(ctx, c, args[1:], getenv, stdout)
	case "dead-letters":
		return opsDeadLetters(ctx, c, args[1:], stdout)
	case "poison":
		return opsPoison(ctx, c, args[1:], stdout)
	case "routes":
		return opsRoutes(ctx, c, args[1:], stdout)
	}
	return usageError(fmt.Sprintf("ops: unknown subcommand %q (%s)", args[0], want))
}

type adminClient struct {
	base  string
	token string
	http  *http.Client
	// err is why no request can be made; every request returns it.
	err error
}

func newAdminClient(getenv func(string) string) *adminClient {
	base := strings.TrimRight(getenv("GATEWAY_ADMIN_URL"), "/")
	if base == "" {
		addr := getenv("GATEWAY_ADMIN_ADDR")
		if addr == "" {
			addr = ":8081"
		}
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return &adminClient{err: fmt.Errorf("ops: GATEWAY_ADMIN_ADDR %q: %w", addr, err)}
		}
		base = "http://127.0.0.1:" + port
	}
	token := getenv("GATEWAY_ADMIN_TOKEN")
	if token == "" {
		return &adminClient{err: errors.New("ops: GATEWAY_ADMIN_TOKEN is required (make run prints the line to export)")}
	}
	return &adminClient{base: base, token: token, http: &http.Client{Timeout: 10 * time.Second}}
}

func (c *adminClient) get(ctx context.Context, path string, q url.Values, v any) error {
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	_, err := c.do(ctx, http.MethodGet, path, nil, v)
	return err
}

// post sends body as JSON and decodes the answer into v, returning the
// answer's headers.
func (c *adminClient) post(ctx context.Context, path string, body, v any) (http.Header, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	return c.do(ctx, http.MethodPost, path, raw, v)
}

func (c *adminClient) do(ctx context.Context, method, path string, body []byte, v any) (http.Header, error) {
	if c.err != nil {
		return nil, c.err
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, &exitError{code: exitUnavailable, err: fmt.Errorf("ops: admin API: %w", err)}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, &exitError{code: exitUnavailable, err: fmt.Errorf("ops: admin API: %w", err)}
	}
	if resp.StatusCode != http.StatusOK {
		var p struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(raw, &p)
		err := fmt.Errorf("ops: admin API answered %d: %s", resp.StatusCode, clean(p.Error))
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			err = fmt.Errorf("%w (try again in %ss)", err, clean(ra))
		}
		return nil, &exitError{code: exitCodeFor(resp.StatusCode), err: err}
	}
	return resp.Header, json.Unmarshal(raw, v)
}

func opsShow(ctx context.Context, c *adminClient, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ops show", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the evidence record as JSON")
	id, err := parseWithID(fs, args)
	if err != nil {
		return err
	}
	var rec adminapi.EvidenceRecord
	if err := c.get(ctx, "/v1/operations/"+url.PathEscape(id), nil, &rec); err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(stdout, rec)
	}
	op, ev := rec.Operation, rec.Evidence
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { cleanf(tw, "%s\t%v\n", k, v) }
	row("operation", op.ID)
	row("route", op.Route)
	row("key", op.Key)
	row("state", op.State)
	row("trace id", ev.TraceID)
	row("idempotency key", op.IdempotencyKey)
	row("result id", op.ResultID)
	row("fence", op.Fence)
	row("attempts", op.AttemptCount)
	row("deliveries", op.DeliveryCount)
	if ev.NegativeOrDeadLetter != "" {
		row("reason", ev.NegativeOrDeadLetter)
	}
	if ev.ManualIntervention != nil {
		row("intervention", *ev.ManualIntervention)
	}
	row("contract", op.ContractVersion)
	row("retained until", op.RetainUntil.Format(time.RFC3339))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "\ntransitions:")
	for _, t := range rec.Transitions {
		cleanf(stdout, "  %s  %-20s fence %d  %s\n", t.At.Format(time.RFC3339Nano), t.To, t.Fence, t.Reason)
	}
	fmt.Fprintln(stdout, "\nattempts:")
	for _, a := range rec.Attempts {
		outcome := string(a.Outcome)
		if outcome == "" {
			outcome = "(no outcome recorded)"
		}
		status := "-"
		if a.StatusCode != 0 {
			status = strconv.Itoa(a.StatusCode)
		}
		cleanf(stdout, "  %d  %s  %-7s fence %d  %-10s status %s  %s\n", a.N, a.StartedAt.Format(time.RFC3339Nano), a.Kind, a.Fence, outcome, status, a.Reason)
	}
	fmt.Fprintln(stdout, "\ndeliveries:")
	for _, d := range rec.Deliveries {
		note := ""
		if d.Anomaly != "" {
			note = " [" + clean(string(d.Anomaly)) + "]"
		}
		cleanf(stdout, "  %s  %s  %-6s %s", d.ReceivedAt.Format(time.RFC3339Nano), d.MessageID, d.Decision, d.Reason)
		cleanf(stdout, "%s  trace %s\n", note, d.TraceID)
	}
	fmt.Fprintln(stdout, "\n"+clean(rec.Statement))
	return nil
}

func opsList(ctx context.Context, c *adminClient, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ops list", flag.ContinueOnError)
	q := url.Values{}
	for _, name := range []string{"route", "state", "message_id", "key", "limit", "cursor"} {
		fs.Func(name, "filter: "+name, func(v string) error { q.Set(name, v); return nil })
	}
	quiet := fs.Bool("q", false, "print only the operation ids, one a line")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := c.knownRoute(ctx, q.Get("route")); err != nil {
		return err
	}
	var list adminapi.OperationList
	if err := c.get(ctx, "/v1/operations", q, &list); err != nil {
		return err
	}
	if *quiet {
		for _, op := range list.Operations {
			cleanf(stdout, "%s\n", op.ID)
		}
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tROUTE\tSTATE\tKEY\tUPDATED\tTRACE")
	for _, op := range list.Operations {
		cleanf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", op.ID, op.Route, op.State, op.Key, op.UpdatedAt.Format(time.RFC3339), op.TraceID)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if list.NextCursor != "" {
		cleanf(stdout, "more: -cursor %s\n", list.NextCursor)
	}
	return nil
}

// knownRoute fails when route is set and the gateway has no route of that
// name: a filter on a misspelt route would otherwise list nothing, which
// reads as "no such operations".
func (c *adminClient) knownRoute(ctx context.Context, route string) error {
	if route == "" {
		return nil
	}
	var contract json.RawMessage
	err := c.get(ctx, "/v1/routes/"+url.PathEscape(route), nil, &contract)
	var coded *exitError
	if errors.As(err, &coded) && coded.code == exitRequest && strings.Contains(err.Error(), "answered 404") {
		return &exitError{code: exitRequest, err: fmt.Errorf("ops: the gateway has no route %s (gateway ops routes lists them)", clean(route))}
	}
	return err
}

// parseFlags parses fs from args, which hold flags only; anything the
// command does not take is a usage error (exit status 2), and -h prints
// the flags and is not an error.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	if fs.NArg() != 0 {
		return usageError(fmt.Sprintf("%s: unexpected argument %s", fs.Name(), clean(fs.Arg(0))))
	}
	return nil
}

func opsPoison(ctx context.Context, c *adminClient, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ops poison", flag.ContinueOnError)
	q := url.Values{}
	fs.Func("route", "only this route's poison records", func(v string) error { q.Set("route", v); return nil })
	fs.Func("limit", "page size, 1 to 500 (default 50)", func(v string) error { q.Set("limit", v); return nil })
	fs.Func("cursor", "the page after this cursor", func(v string) error { q.Set("cursor", v); return nil })
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := c.knownRoute(ctx, q.Get("route")); err != nil {
		return err
	}
	var list adminapi.PoisonList
	if err := c.get(ctx, "/v1/poison", q, &list); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ROUTE\tMESSAGE\tCOUNT\tLAST SEEN\tACKED\tREASON")
	for _, p := range list.Poison {
		msg := p.MessageID
		if msg == "" {
			msg = "-"
		}
		cleanf(tw, "%s\t%s\t%d\t%s\t%t\t%s\n", p.Route, msg, p.Count, p.LastSeen.Format(time.RFC3339), p.Acked, gate.Bound(p.Reason, 80))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if list.NextCursor != "" {
		cleanf(stdout, "more: -cursor %s\n", list.NextCursor)
	}
	return nil
}

func opsRoutes(ctx context.Context, c *adminClient, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ops routes", flag.ContinueOnError)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var list adminapi.RouteList
	if err := c.get(ctx, "/v1/routes", nil, &list); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ROUTE\tBROKER\tSHAPE\tDEAD LETTER\tCONTRACT")
	for _, r := range list.Routes {
		cleanf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Name, r.Broker, r.Shape, r.DeadLetter, r.ContractVersion)
	}
	return tw.Flush()
}
