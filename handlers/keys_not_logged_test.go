package handlers_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

// keyRoutes key on an attribute, a JSON pointer and a private attribute.
const keyRoutes = `
  - name: byattr
    broker: pubsub
    auth: none
    shape: unsafe
    dead_letter: gateway
    operation_key: {kind: attribute, name: order_id}
    fingerprint: {attributes: [region]}
    effect: {url: "{{DOWN}}/effects", result_id_header: X-Result-Id}
  - name: bypointer
    broker: pubsub
    auth: none
    shape: unsafe
    dead_letter: broker
    operation_key: {kind: json_pointer, name: /order/id}
    effect: {url: "{{DOWN}}/effects", result_id_header: X-Result-Id}
  - name: byprivate
    broker: pubsub
    auth: none
    shape: unsafe
    dead_letter: gateway
    operation_key: {kind: attribute, name: card}
    private: [card]
    effect: {url: "{{DOWN}}/effects", result_id_header: X-Result-Id}
`

// Logs and stored reasons name operations by id, never by the publisher's
// key or an attribute's value: deliveries with known keys and attribute
// values go through every path a delivery can take (acked, redelivered,
// refused terminally, retried, lost and resolved, an identity the gateway
// refuses), with every log line captured at debug level, and neither the
// logs nor any reason column of the ledger holds one of them. That
// includes a key reused with another payload: the conflict's reason names
// the operation it conflicts with, not the key both share.
func TestLogsAndReasonsNeverCarryKeysOrAttributeValues(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, false, keyRoutes, map[string]string{"GATEWAY_KEY_HASH_SECRET": keyHashSecret})
	secrets := []string{"KEYATTR7731", "KEYPTR8842", "KEYPRIV9953", "REGIONVAL4410", "NOTEVAL2207",
		"KEYATTRTERM5501", "KEYPTRLOST6602", "KEYPRIVRETRY7703", "KEYLONG", "KEYCONFLICT3318", "REGIONOTHER6620"}
	attrs := func(kv ...string) map[string]string {
		m := map[string]string{"region": "REGIONVAL4410", "note": "NOTEVAL2207"}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}

	// Acked, then redelivered.
	for range 2 {
		wantStatus(t, e.push("byattr", msg{ID: "m-attr", Data: "x", Attrs: attrs("order_id", "KEYATTR7731")}), http.StatusNoContent)
		wantStatus(t, e.push("bypointer", msg{ID: "m-ptr", Data: `{"order":{"id":"KEYPTR8842"}}`, Attrs: attrs()}), http.StatusNoContent)
		wantStatus(t, e.push("byprivate", msg{ID: "m-priv", Data: "x", Attrs: attrs("card", "KEYPRIV9953")}), http.StatusNoContent)
	}
	// Refused by the downstream for good: dead-lettered by the gateway.
	e.down.set(status(http.StatusUnprocessableEntity))
	wantStatus(t, e.push("byattr", msg{ID: "m-term", Data: "x", Attrs: attrs("order_id", "KEYATTRTERM5501")}), http.StatusNoContent)
	// Busy: retried later.
	e.down.set(status(http.StatusServiceUnavailable))
	wantStatus(t, e.push("byprivate", msg{ID: "m-retry", Data: "x", Attrs: attrs("card", "KEYPRIVRETRY7703")}), http.StatusServiceUnavailable)
	// The answer lost after the effect: indeterminate, then resolved.
	lost := msg{ID: "m-lost", Data: `{"order":{"id":"KEYPTRLOST6602"}}`, Attrs: attrs()}
	id := e.indeterminate("bypointer", lost)
	wantAnswer(t, e.resolveOp(id, adminapi.ResolveRequest{Kind: gate.ResolveAbandon, Reason: "refunded by hand", Actor: "alice"}), http.StatusOK)
	e.down.set(nil)
	// A key reused with another payload: the region attribute is in the
	// route's fingerprint, so the second message conflicts with the first,
	// under each dead-letter policy (dead-lettered in the ledger by byattr,
	// left to the broker by bypointer).
	wantStatus(t, e.push("byattr", msg{ID: "m-conf-1", Data: "x", Attrs: attrs("order_id", "KEYCONFLICT3318")}), http.StatusNoContent)
	conflicting := msg{ID: "m-conf-2", Data: "x", Attrs: attrs("order_id", "KEYCONFLICT3318", "region", "REGIONOTHER6620")}
	wantStatus(t, e.push("byattr", conflicting), http.StatusNoContent)
	wantStatus(t, e.push("byattr", conflicting), http.StatusNoContent)
	wantStatus(t, e.push("bypointer", msg{ID: "m-conf-3", Data: `{"order":{"id":"KEYCONFLICT3318"},"v":1}`}), http.StatusNoContent)
	wantStatus(t, e.push("bypointer", msg{ID: "m-conf-4", Data: `{"order":{"id":"KEYCONFLICT3318"},"v":2}`}), http.StatusServiceUnavailable)
	var list adminapi.OperationList
	e.adminGet("/v1/operations?state=conflicting", &list)
	if len(list.Operations) != 2 {
		t.Fatalf("conflicting records: %+v, want one per route", list.Operations)
	}
	for _, op := range list.Operations {
		if rec := e.record(op.ID); rec.Operation.Reason == "" || !strings.Contains(rec.Operation.Reason, rec.Operation.ConflictOf) {
			t.Errorf("conflict %s: reason %q does not name the operation %s it conflicts with", op.ID, rec.Operation.Reason, rec.Operation.ConflictOf)
		}
	}
	// Identities the gateway refuses: a key too long, one with a NUL.
	long := "KEYLONG" + strings.Repeat("x", 600)
	wantStatus(t, e.push("byattr", msg{ID: "m-long", Data: "x", Attrs: attrs("order_id", long)}), http.StatusNoContent)
	wantStatus(t, e.pushRaw("byprivate", []byte(`{"message":{"data":"`+base64.StdEncoding.EncodeToString([]byte("x"))+
		`","messageId":"m-nul","attributes":{"card":"KEYPRIV9953\u0000"}},"subscription":"projects/p/subscriptions/s"}`)), http.StatusNoContent)

	logs := e.logs.String()
	if !strings.Contains(logs, `"msg":"delivery answered"`) || !strings.Contains(logs, id) {
		t.Fatalf("the logs do not show the deliveries at all:\n%s", logs)
	}
	for _, s := range secrets {
		if i := strings.Index(logs, s); i >= 0 {
			start := strings.LastIndex(logs[:i], "\n") + 1
			end := i + strings.Index(logs[i:], "\n")
			t.Errorf("the logs carry %q:\n%s", s, logs[start:end])
		}
	}

	// Every reason the ledger keeps, in whatever table.
	ctx := context.Background()
	rows, err := e.pool.Query(ctx, `SELECT table_name FROM information_schema.columns
		WHERE table_schema = current_schema() AND column_name = 'reason'`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(tables) < 5 {
		t.Fatalf("tables with a reason: %v %v", tables, err)
	}
	reasons := 0
	for _, table := range tables {
		rows, err := e.pool.Query(ctx, `SELECT reason FROM `+pgx.Identifier{table}.Sanitize())
		if err != nil {
			t.Fatal(err)
		}
		all, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range all {
			reasons++
			for _, s := range secrets {
				if strings.Contains(r, s) {
					t.Errorf("%s keeps a reason with %q: %q", table, s, r)
				}
			}
		}
	}
	if reasons < 10 {
		t.Fatalf("only %d reasons were recorded; the deliveries did not run", reasons)
	}
}
