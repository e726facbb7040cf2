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
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ackgate/ackgate/adminapi"
)

// ops is the operator's side of the admin API: "what happened to message X?"
// from a shell. It talks to a running gateway's admin listener rather than to
// the database, so it sees exactly what the API shows and needs only the
// admin token, never database credentials.
//
// The admin URL is GATEWAY_ADMIN_URL, or http://127.0.0.1 on the port of
// GATEWAY_ADMIN_ADDR (default :8081); the token is GATEWAY_ADMIN_TOKEN.
func ops(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	const want = "want show, list, resolve, replay or dead-letters"
	if len(args) == 0 {
		return usageError("ops: " + want)
	}
	c, err := newAdminClient(getenv)
	if err != nil {
		return err
	}
	switch args[0] {
	case "show":
		return opsShow(ctx, c, args[1:], stdout)
	case "list":
		return opsList(ctx, c, args[1:], stdout)
	case "resolve":
		return opsResolve(ctx, c, args[1:], getenv, stdout)
	case "replay":
		return opsReplay(ctx, c, args[1:], getenv, stdout)
	case "dead-letters":
		return opsDeadLetters(ctx, c, args[1:], stdout)
	}
	return usageError(fmt.Sprintf("ops: unknown subcommand %q (%s)", args[0], want))
}

type adminClient struct {
	base  string
	token string
	http  *http.Client
}

func newAdminClient(getenv func(string) string) (*adminClient, error) {
	base := strings.TrimRight(getenv("GATEWAY_ADMIN_URL"), "/")
	if base == "" {
		addr := getenv("GATEWAY_ADMIN_ADDR")
		if addr == "" {
			addr = ":8081"
		}
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("ops: GATEWAY_ADMIN_ADDR %q: %w", addr, err)
		}
		base = "http://127.0.0.1:" + port
	}
	token := getenv("GATEWAY_ADMIN_TOKEN")
	if token == "" {
		return nil, errors.New("ops: GATEWAY_ADMIN_TOKEN is required")
	}
	return &adminClient{base: base, token: token, http: &http.Client{Timeout: 10 * time.Second}}, nil
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
		err := fmt.Errorf("ops: admin API answered %d: %s", resp.StatusCode, p.Error)
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			err = fmt.Errorf("%w (try again in %ss)", err, ra)
		}
		return nil, &exitError{code: exitCodeFor(resp.StatusCode), err: err}
	}
	return resp.Header, json.Unmarshal(raw, v)
}

func opsShow(ctx context.Context, c *adminClient, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ops show", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the evidence record as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("ops show: want exactly one operation id")
	}
	var rec adminapi.EvidenceRecord
	if err := c.get(ctx, "/v1/operations/"+url.PathEscape(fs.Arg(0)), nil, &rec); err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rec)
	}
	op, ev := rec.Operation, rec.Evidence
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
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
		fmt.Fprintf(stdout, "  %s  %-20s fence %d  %s\n", t.At.Format(time.RFC3339Nano), t.To, t.Fence, t.Reason)
	}
	fmt.Fprintln(stdout, "\ndeliveries:")
	for _, d := range rec.Deliveries {
		note := ""
		if d.Anomaly != "" {
			note = " [" + d.Anomaly + "]"
		}
		fmt.Fprintf(stdout, "  %s  %s  %-6s %s%s  trace %s\n", d.ReceivedAt.Format(time.RFC3339Nano), d.MessageID, d.Decision, d.Reason, note, d.TraceID)
	}
	fmt.Fprintln(stdout, "\n"+rec.Statement)
	return nil
}

func opsList(ctx context.Context, c *adminClient, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ops list", flag.ContinueOnError)
	q := url.Values{}
	for _, name := range []string{"route", "state", "message_id", "key", "limit", "cursor"} {
		fs.Func(name, "filter: "+name, func(v string) error { q.Set(name, v); return nil })
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	var list adminapi.OperationList
	if err := c.get(ctx, "/v1/operations", q, &list); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tROUTE\tSTATE\tKEY\tUPDATED\tTRACE")
	for _, op := range list.Operations {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", op.ID, op.Route, op.State, op.Key, op.UpdatedAt.Format(time.RFC3339), op.TraceID)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if list.NextCursor != "" {
		fmt.Fprintf(stdout, "more: -cursor %s\n", list.NextCursor)
	}
	return nil
}
