package handlers_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/handlers"
	"github.com/ackgate/ackgate/storage"
)

// The recovery lanes' answers, from a gateway on real Postgres, Redis and
// a real downstream, validated against openapi.yaml: resolutions and
// replays with every status they answer, the records they leave, and the
// dead-letter list.
func TestOpenAPIRecoveryAnswers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("mail", "unsafe", "broker", "")+routeYAML("ledgered", "unsafe", "gateway", ""))
	c := &specClient{t: t, v: newSpecValidator(t)}
	post := func(path, body string, want int, rc reqCheck) []byte {
		t.Helper()
		return c.do(exchange{method: http.MethodPost, url: e.admin.URL + path, body: []byte(body), token: adminToken, want: want, request: rc})
	}
	get := func(path string, want int, rc reqCheck) []byte {
		t.Helper()
		return c.do(exchange{method: http.MethodGet, url: e.admin.URL + path, token: adminToken, want: want, request: rc})
	}

	happened := e.indeterminate("mail", msg{ID: "m-1", Data: "x"})
	notHappened := e.indeterminate("mail", msg{ID: "m-2", Data: "x"})
	abandoned := e.indeterminate("ledgered", msg{ID: "m-3", Data: "x"})
	brokerDead := e.indeterminate("mail", msg{ID: "m-4", Data: "x"})
	wantStatus(t, e.push("ledgered", msg{ID: "m-3", Data: "other"}), http.StatusNoContent) // a conflict record

	// 200: each kind, and the same request again.
	body := `{"kind":"happened","result_id":"r-7","reason":"in the provider's log","note":"ticket OPS-1"}`
	rec := decode[adminapi.EvidenceRecord](t, post("/v1/operations/"+happened+"/resolve", body, http.StatusOK, requestConforms))
	if rec.Evidence.ManualIntervention == nil || len(rec.ManualInterventions) != 1 {
		t.Errorf("record after happened: %+v", rec.Evidence)
	}
	post("/v1/operations/"+happened+"/resolve", body, http.StatusOK, requestConforms)
	post("/v1/operations/"+notHappened+"/resolve", `{"kind":"not_happened","reason":"not in the log"}`, http.StatusOK, requestConforms)
	post("/v1/operations/"+abandoned+"/resolve", `{"kind":"abandon","reason":"refunded by hand"}`, http.StatusOK, requestConforms)
	post("/v1/operations/"+brokerDead+"/resolve", `{"kind":"abandon","reason":"refunded by hand"}`, http.StatusOK, requestConforms)
	get("/v1/operations/"+notHappened, http.StatusOK, requestConforms)

	// The dead-letter list: a gateway dead letter, a broker one, a conflict
	// record; a page and the page after it.
	list := decode[adminapi.DeadLetterList](t, get("/v1/dead-letters", http.StatusOK, requestConforms))
	by := map[string]bool{}
	for _, d := range list.DeadLetters {
		by[d.DeadLetteredBy+"/"+string(d.State)] = true
	}
	if len(list.DeadLetters) != 3 || !by["gateway/terminal_failure"] || !by["broker/terminal_failure"] || !by["gateway/conflicting"] {
		t.Fatalf("dead letters: %+v", list.DeadLetters)
	}
	page := decode[adminapi.DeadLetterList](t, get("/v1/dead-letters?limit=2", http.StatusOK, requestConforms))
	if len(page.DeadLetters) != 2 || page.NextCursor == "" {
		t.Fatalf("first page: %+v", page)
	}
	get("/v1/dead-letters?route=ledgered&limit=1&cursor="+page.NextCursor, http.StatusOK, requestConforms)
	get("/v1/dead-letters?limit=0", http.StatusBadRequest, requestViolates)
	get("/v1/dead-letters?cursor=bm90IGEgY3Vyc29y", http.StatusBadRequest, requestConforms)
	c.do(exchange{method: http.MethodGet, url: e.admin.URL + "/v1/dead-letters", want: http.StatusUnauthorized, request: requestViolates})

	// 200: a replay, and its record.
	rec = decode[adminapi.EvidenceRecord](t, post("/v1/operations/"+abandoned+"/replay", `{"reason":"the downstream is fixed"}`, http.StatusOK, requestConforms))
	if rec.Operation.State != gate.StatePendingEffect || len(rec.ManualInterventions) != 2 {
		t.Errorf("record after replay: %s, %+v", rec.Operation.State, rec.ManualInterventions)
	}

	// 400: what the spec refuses too, and what only the gate can judge.
	for _, b := range []string{
		`{"kind":"happened","reason":"r","actor":"admin"}`,
		`{"kind":"abandon","result_id":"x","reason":"r","actor":"admin"}`,
		`{"kind":"maybe","reason":"r","actor":"admin"}`,
		`{"kind":"abandon","reason":"r","note":7}`,
		`{"kind":"abandon","reason":"r","actor":"admin","force":true}`,
		`{"kind":"replay","reason":"r","actor":"admin"}`,
	} {
		post("/v1/operations/"+brokerDead+"/resolve", b, http.StatusBadRequest, requestViolates)
	}
	post("/v1/operations/"+brokerDead+"/resolve", `{"kind":"abandon","reason":" ","actor":"admin"}`, http.StatusBadRequest, requestConforms)
	post("/v1/operations/"+brokerDead+"/replay", `{"reason":"r","actor":"admin","kind":"replay"}`, http.StatusBadRequest, requestViolates)
	// 404, 409, 413, 401.
	post("/v1/operations/op_aaaaaaaaaaaaaaaaaaaaaaaaaa/replay", `{"reason":"r","actor":"admin"}`, http.StatusNotFound, requestConforms)
	post("/v1/operations/"+happened+"/replay", `{"reason":"r","actor":"admin"}`, http.StatusConflict, requestConforms)
	post("/v1/operations/"+brokerDead+"/resolve", `{"kind":"not_happened","reason":"r","actor":"admin"}`, http.StatusConflict, requestConforms)
	post("/v1/operations/"+brokerDead+"/replay", `{"reason":"`+strings.Repeat("r", 20<<10)+`","actor":"admin"}`, http.StatusRequestEntityTooLarge, requestViolates)
	c.do(exchange{method: http.MethodPost, url: e.admin.URL + "/v1/operations/" + brokerDead + "/replay", body: []byte(`{"reason":"r","actor":"admin"}`),
		want: http.StatusUnauthorized, request: requestViolates})

	// 503 with Retry-After: someone holds the operation's lease.
	ctx := context.Background()
	lease, err := storage.NewReservations(e.rdb).Acquire(ctx, brokerDead, "someone-else", time.Minute, e.record(brokerDead).Operation.Fence)
	if err != nil {
		t.Fatal(err)
	}
	post("/v1/operations/"+brokerDead+"/replay", `{"reason":"r","actor":"admin"}`, http.StatusServiceUnavailable, requestConforms)
	if err := storage.NewReservations(e.rdb).Release(ctx, lease); err != nil {
		t.Fatal(err)
	}

	// 503 without: a process built without the recovery lanes' parts, and
	// an evidence store that is down.
	bare := httptest.NewServer(handlers.NewAdmin(handlers.AdminOptions{Token: adminToken, Evidence: brokenStore{}}))
	t.Cleanup(bare.Close)
	c.do(exchange{method: http.MethodPost, url: bare.URL + "/v1/operations/" + brokerDead + "/replay", body: []byte(`{"reason":"r","actor":"admin"}`),
		token: adminToken, want: http.StatusServiceUnavailable})
	c.do(exchange{method: http.MethodGet, url: bare.URL + "/v1/dead-letters", token: adminToken, want: http.StatusServiceUnavailable})
}

// A handoff route's outbox entry, made due now and cancelled over the admin
// API, answers as openapi.yaml says, and each action is in the record under
// the credential's name.
func TestOpenAPIOutboxActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("relayed", "handoff", "gateway", "    handoff:\n      retry_min: 1s\n")+
		routeYAML("mail", "unsafe", "broker", ""))
	c := &specClient{t: t, v: newSpecValidator(t)}
	post := func(path, body string, want int, rc reqCheck) []byte {
		t.Helper()
		return c.do(exchange{method: http.MethodPost, url: e.admin.URL + path, body: []byte(body), token: adminToken, want: want, request: rc})
	}
	wantStatus(t, e.push("relayed", msg{ID: "h-1", Data: "x"}), http.StatusNoContent)
	id := e.routes["relayed"].OperationID("h-1")
	unsafe := e.indeterminate("mail", msg{ID: "m-1", Data: "x"})

	rec := decode[adminapi.EvidenceRecord](t, post("/v1/outbox/"+id+"/retry", `{"reason":"downstream is back","note":"OPS-2"}`, http.StatusOK, requestConforms))
	if n := len(rec.ManualInterventions); n != 1 || rec.ManualInterventions[0].Kind != gate.OutboxRetryNow ||
		rec.ManualInterventions[0].Actor != handlers.ActorPrefix+"admin" || rec.Operation.State != gate.StatePendingEffect {
		t.Fatalf("after retry: %s, %+v", rec.Operation.State, rec.ManualInterventions)
	}
	post("/v1/outbox/"+id+"/retry", `{"reason":" "}`, http.StatusBadRequest, requestConforms)
	post("/v1/outbox/"+id+"/retry", `{"reason":"r","force":true}`, http.StatusBadRequest, requestViolates)
	post("/v1/outbox/op_aaaaaaaaaaaaaaaaaaaaaaaaaa/retry", `{"reason":"r"}`, http.StatusNotFound, requestConforms)
	post("/v1/outbox/"+unsafe+"/cancel", `{"reason":"r"}`, http.StatusConflict, requestConforms)
	post("/v1/operations/"+id+"/resolve", `{"kind":"cancel","reason":"r"}`, http.StatusBadRequest, requestViolates)

	rec = decode[adminapi.EvidenceRecord](t, post("/v1/outbox/"+id+"/cancel", `{"reason":"order withdrawn"}`, http.StatusOK, requestConforms))
	last := rec.ManualInterventions[len(rec.ManualInterventions)-1]
	if rec.Operation.State != gate.StateTerminalFailure || last.Kind != gate.ResolveCancel || len(rec.DeadLetters) != 1 {
		t.Fatalf("after cancel: %s, %+v, %+v", rec.Operation.State, last, rec.DeadLetters)
	}
	post("/v1/outbox/"+id+"/cancel", `{"reason":"order withdrawn"}`, http.StatusOK, requestConforms)
	post("/v1/outbox/"+id+"/retry", `{"reason":"r"}`, http.StatusConflict, requestConforms)
	if st := e.record(id).Operation.State; st != gate.StateTerminalFailure {
		t.Fatalf("a refused retry moved the operation to %s", st)
	}
}
