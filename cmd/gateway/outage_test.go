package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/internal/testenv"
)

// readyz answers the status of GET /readyz and its reason, or 0 when the
// process does not answer at all.
func readyz(addr string) (int, string) {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var body struct{ Reason string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.Reason
}

// adminOps lists the operations of message id through the admin API, as an
// operator would read them: the ledger's own tables are the ledger's
// business.
func adminOps(t *testing.T, env gatewayEnv, messageID string) []map[string]any {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+env["GATEWAY_ADMIN_ADDR"]+"/v1/operations?message_id="+url.QueryEscape(messageID), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+env["GATEWAY_ADMIN_TOKEN"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/operations?message_id=%s: %s", messageID, resp.Status)
	}
	var list struct {
		Operations []map[string]any `json:"operations"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	return list.Operations
}

// A gateway started while Postgres and Redis are both down comes up and
// stays up: /readyz answers 503 naming what is missing, deliveries are
// nacked without reaching the downstream, and once each service is back
// the gateway uses it without a restart. Then each service goes away and
// comes back under the running gateway, Postgres with an immediate
// shutdown. The process never exits, every delivery answered while a
// service was missing is a nack, and each message ends with exactly one
// effect and its evidence.
func TestServeStaysUpWhileDependenciesAreDown(t *testing.T) {
	t.Parallel()
	bin := buildGateway(t)
	pg := testenv.PrivateCluster(t)
	dbURL := pg.CreateDatabase("outage")
	rds := testenv.RedisServer(t)
	down := newDownstream(t)
	env := newGatewayEnv(t, dbURL, rds.Addr(), writeRoutes(t, down.srv.URL))
	mig := exec.Command(bin, "migrate")
	mig.Env = env.list()
	if out, err := mig.CombinedOutput(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	addr := env["GATEWAY_LISTEN_ADDR"]

	pg.Stop()
	rds.Stop()
	proc := &gatewayProc{cmd: exec.Command(bin, "serve"), logs: &testenv.SyncBuffer{}, done: make(chan struct{})}
	proc.cmd.Env = env.list()
	proc.cmd.Stderr = proc.logs
	if err := proc.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = proc.cmd.Wait(); close(proc.done) }()
	t.Cleanup(func() {
		_ = proc.cmd.Process.Kill()
		<-proc.done
		if t.Failed() {
			t.Logf("gateway logs:\n%s", proc.logs.String())
		}
	})
	alive := func(step string) {
		t.Helper()
		select {
		case <-proc.done:
			t.Fatalf("%s: the gateway exited (%v)", step, proc.cmd.ProcessState)
		default:
		}
	}

	// unready waits for /readyz to answer 503 naming what; a gateway that
	// is still starting may not answer at all yet.
	unready := func(what string) {
		t.Helper()
		var code int
		var reason string
		testenv.Eventually(t, testenv.StepTimeout, func() bool {
			select {
			case <-proc.done:
				return true
			default:
			}
			code, reason = readyz(addr)
			return code == http.StatusServiceUnavailable && strings.HasPrefix(reason, what)
		}, func() string { return fmt.Sprintf("/readyz = %d %q, want 503 naming %s", code, reason, what) })
		alive("waiting for /readyz to name " + what)
	}
	ready := func() {
		t.Helper()
		var code int
		var reason string
		testenv.Eventually(t, testenv.StepTimeout, func() bool {
			code, reason = readyz(addr)
			return code == http.StatusOK
		}, func() string { return fmt.Sprintf("/readyz = %d %q, want 200", code, reason) })
	}
	nacked := 0
	// refused pushes id a few times while a service is missing: each answer
	// must be a nack that reached nothing downstream.
	refused := func(id string) {
		t.Helper()
		before := down.calls.Load()
		for range 3 {
			code := pushQuiet(addr, id)
			if code < 500 {
				t.Fatalf("push %s while a service is down answered %d, want a 5xx nack (0: no answer)", id, code)
			}
			nacked++
		}
		if n := down.calls.Load() - before; n != 0 {
			t.Fatalf("push %s while a service is down reached the downstream %d times", id, n)
		}
	}
	// acked pushes id until it is acked: after a service returns, the first
	// deliveries may still find a connection that broke or a lease hold left
	// by Redis's lost data, and are nacked; the broker would redeliver.
	acked := func(id string) {
		t.Helper()
		var code int
		testenv.Eventually(t, 2*testenv.StepTimeout, func() bool {
			code = pushQuiet(addr, id)
			return code == http.StatusNoContent
		}, func() string { return fmt.Sprintf("push %s answered %d, never 204", id, code) })
	}

	// Both down at start.
	unready("postgres")
	alive("both services down at start")
	refused("m-1")

	// Postgres back, Redis still down.
	pg.Start()
	unready("redis")
	refused("m-1")

	// Both back: the same message goes through, once.
	rds.Start()
	ready()
	acked("m-1")
	alive("both services back")

	// Postgres goes away under the running gateway, immediate shutdown.
	pg.Stop()
	unready("postgres")
	refused("m-2")
	pg.Start()
	ready()
	acked("m-2")

	// Redis goes away, and comes back empty.
	rds.Stop()
	unready("redis")
	refused("m-3")
	rds.Start()
	ready()
	acked("m-3")
	alive("after every outage")

	if nacked != 12 {
		t.Fatalf("%d nacks counted, want 12", nacked)
	}
	// Each message took effect once, and the ledger holds its evidence.
	if n := down.calls.Load(); n != 3 {
		t.Fatalf("the downstream was called %d times for 3 messages", n)
	}
	for _, id := range []string{"m-1", "m-2", "m-3"} {
		ops := adminOps(t, env, id)
		if len(ops) != 1 {
			t.Fatalf("message %s has %d operations", id, len(ops))
		}
		if st, res := ops[0]["state"], ops[0]["result_id"]; (st != "acknowledged" && st != "ack_pending") || res == nil || res == "" {
			t.Fatalf("message %s: operation is %v with result %v, want acknowledged with its result", id, st, res)
		}
	}
	if strings.Count(proc.logs.String(), `"msg":"gateway serving"`) != 1 {
		t.Fatalf("the gateway started serving more than once:\n%s", proc.logs.String())
	}
}
