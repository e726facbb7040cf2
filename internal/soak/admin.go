package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// The soak reads what the operator lanes did through the admin API, as an
// operator would, and acts on them through it: the API is the product's
// contract, while the ledger's tables are its insides and may change.

// adminOp is an operation as GET /v1/operations lists it.
type adminOp struct {
	ID             string `json:"id"`
	Route          string `json:"route"`
	Key            string `json:"key"`
	State          string `json:"state"`
	Shape          string `json:"shape"`
	IdempotencyKey string `json:"idempotency_key"`
	ResultID       string `json:"result_id"`
	ConflictOf     string `json:"conflict_of"`
	AttemptCount   int    `json:"attempt_count"`
	Grant          int    `json:"grant"`
	Checks         int    `json:"checks"`
}

// adminRecord is an operation's evidence record, GET /v1/operations/{id}.
type adminRecord struct {
	Operation  adminOp `json:"operation"`
	Deliveries []struct {
		TraceID string `json:"trace_id"`
	} `json:"deliveries"`
	Attempts []struct {
		Kind    string `json:"kind"`
		Outcome string `json:"outcome"`
	} `json:"attempts"`
	Transitions []struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"transitions"`
	Interventions []struct {
		Kind  string `json:"kind"`
		Actor string `json:"actor"`
		From  string `json:"from"`
		To    string `json:"to"`
	} `json:"manual_interventions"`
}

// adminDeadLetter is one entry of GET /v1/dead-letters.
type adminDeadLetter struct {
	OperationID string `json:"operation_id"`
	Route       string `json:"route"`
	State       string `json:"state"`
	Replayable  bool   `json:"replayable"`
}

// adminClient talks to the gateways' admin listeners, trying the next one
// when a gateway is down (the soak kills them).
type adminClient struct {
	urls  []string
	token string
	http  *http.Client
}

func newAdminClient(urls []string, token string) *adminClient {
	return &adminClient{urls: urls, token: token, http: &http.Client{Timeout: 30 * time.Second}}
}

// errUnreachable: no gateway's admin listener answered.
var errUnreachable = errors.New("no admin listener answered")

// do sends one request and decodes a 200's body into out; it returns the
// status (0 when no listener answered).
func (a *adminClient) do(ctx context.Context, method, path string, in, out any) (int, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return 0, err
		}
	}
	var lastErr error
	for _, base := range a.urls {
		req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+a.token)
		if in != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := a.http.Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
		resp.Body.Close()
		if err != nil {
			lastErr = err
			continue
		}
		if resp.StatusCode >= 500 {
			// Its Postgres may be restarting, or it is shutting down: ask
			// the other one.
			lastErr = fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
			continue
		}
		if resp.StatusCode == http.StatusOK && out != nil {
			if err := json.Unmarshal(b, out); err != nil {
				return resp.StatusCode, fmt.Errorf("%s %s: %w", method, path, err)
			}
		}
		return resp.StatusCode, nil
	}
	return 0, fmt.Errorf("%w: %v", errUnreachable, lastErr)
}

func (a *adminClient) get(ctx context.Context, path string, out any) error {
	status, err := a.do(ctx, http.MethodGet, path, nil, out)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", path, status)
	}
	return nil
}

// operations lists every operation in state (all states when ""), page by
// page.
func (a *adminClient) operations(ctx context.Context, state string) ([]adminOp, error) {
	var out []adminOp
	cursor := ""
	for {
		q := url.Values{"limit": {"500"}}
		if state != "" {
			q.Set("state", state)
		}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page struct {
			Operations []adminOp `json:"operations"`
			NextCursor string    `json:"next_cursor"`
		}
		if err := a.get(ctx, "/v1/operations?"+q.Encode(), &page); err != nil {
			return nil, err
		}
		out = append(out, page.Operations...)
		if page.NextCursor == "" {
			return out, nil
		}
		cursor = page.NextCursor
	}
}

func (a *adminClient) record(ctx context.Context, id string) (*adminRecord, error) {
	var rec adminRecord
	if err := a.get(ctx, "/v1/operations/"+url.PathEscape(id), &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

func (a *adminClient) deadLetters(ctx context.Context) ([]adminDeadLetter, error) {
	var out []adminDeadLetter
	cursor := ""
	for {
		q := url.Values{"limit": {"500"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page struct {
			DeadLetters []adminDeadLetter `json:"dead_letters"`
			NextCursor  string            `json:"next_cursor"`
		}
		if err := a.get(ctx, "/v1/dead-letters?"+q.Encode(), &page); err != nil {
			return nil, err
		}
		out = append(out, page.DeadLetters...)
		if page.NextCursor == "" {
			return out, nil
		}
		cursor = page.NextCursor
	}
}

// resolve posts a resolution (kind happened, not_happened, abandon) or a
// replay (kind replay) and reports whether the gateway applied it: 200.
// A 409 (the operation moved on meanwhile) is not an error.
func (a *adminClient) resolve(ctx context.Context, id, kind, resultID, reason string) (bool, error) {
	path := "/v1/operations/" + url.PathEscape(id) + "/resolve"
	// The actor is the credential the request carries; the note says
	// which of the soak's hands it was.
	body := map[string]string{"kind": kind, "reason": reason, "note": operatorNote}
	if kind == "replay" {
		path = "/v1/operations/" + url.PathEscape(id) + "/replay"
		delete(body, "kind")
	}
	if resultID != "" {
		body["result_id"] = resultID
	}
	status, err := a.do(ctx, http.MethodPost, path, body, nil)
	switch {
	case err != nil:
		return false, err
	case status == http.StatusOK:
		return true, nil
	case status == http.StatusConflict:
		return false, nil
	}
	return false, fmt.Errorf("POST %s: status %d", path, status)
}
