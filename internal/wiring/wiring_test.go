package wiring_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/internal/wiring"
	"github.com/ackgate/ackgate/storage"
	"github.com/ackgate/ackgate/telemetry"
)

const routesYAML = `routes:
  - name: orders
    broker: pubsub
    auth: none
    shape: unsafe
    effect:
      url: http://127.0.0.1:1/effects
      evidence: status_only
  - name: guarded
    broker: pubsub
    auth: none
    verification_token_env: GUARDED_TOKEN
    shape: unsafe
    effect:
      url: http://127.0.0.1:1/effects
      evidence: status_only
`

func options(t *testing.T, vars map[string]string) wiring.Options {
	t.Helper()
	getenv := func(k string) string { return vars[k] }
	s, err := config.LoadSettings(getenv)
	if err != nil {
		t.Fatal(err)
	}
	routes, err := config.ParseRoutes([]byte(routesYAML))
	if err != nil {
		t.Fatal(err)
	}
	tel, err := telemetry.WithPrometheus(sdktrace.NewTracerProvider(), resource.Empty())
	if err != nil {
		t.Fatal(err)
	}
	return wiring.Options{Settings: s, Routes: routes, Getenv: getenv, Telemetry: tel}
}

// A route's missing secret stops New before it connects anywhere: the
// database here does not exist, and the error is still the secret's.
func TestNewChecksSecretsBeforeConnecting(t *testing.T) {
	t.Parallel()
	o := options(t, map[string]string{"GATEWAY_DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?sslmode=disable"})
	gw, err := wiring.New(context.Background(), o)
	if err == nil {
		gw.Close()
		t.Fatal("New succeeded without the route's verification token")
	}
	if !strings.Contains(err.Error(), `route "guarded": verification_token_env: environment variable GUARDED_TOKEN is not set`) {
		t.Fatalf("New = %v, want the missing secret named", err)
	}
}

// A database that is reachable but not yet migrated: New succeeds (migrating
// is `gateway migrate`'s job), /readyz answers 503 naming the pending
// migrations until they are applied, and 200 after.
func TestReadyWaitsForMigrations(t *testing.T) {
	t.Parallel()
	dbURL := testenv.DatabaseURL(t)
	o := options(t, map[string]string{
		"GATEWAY_DATABASE_URL": dbURL,
		"GATEWAY_REDIS_URL":    "redis://" + testenv.Redis(t),
		"GUARDED_TOKEN":        "guarded-token-0123",
	})
	gw, err := wiring.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	if err := gw.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "migrations pending") {
		t.Fatalf("Ready before migrating = %v", err)
	}
	srv := httptest.NewServer(gw.Ingest)
	t.Cleanup(srv.Close)
	readyz := func() int {
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := readyz(); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before migrating = %d", code)
	}
	if err := storage.Migrate(context.Background(), dbURL); err != nil {
		t.Fatal(err)
	}
	if code := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz after migrating = %d", code)
	}
}

// Postgres and Redis that do not answer at start do not stop New: the
// gateway comes up unready, saying which is missing, and the clients
// connect once the services are there.
func TestNewStartsWithoutItsServices(t *testing.T) {
	t.Parallel()
	o := options(t, map[string]string{
		"GATEWAY_DATABASE_URL": "postgres://ackgate@127.0.0.1:1/none?sslmode=disable&connect_timeout=2",
		"GATEWAY_REDIS_URL":    "redis://127.0.0.1:1/0",
		"GUARDED_TOKEN":        "guarded-token-0123",
	})
	gw, err := wiring.New(context.Background(), o)
	if err != nil {
		t.Fatalf("New with Postgres and Redis down = %v, want a gateway that waits for them", err)
	}
	t.Cleanup(gw.Close)
	if err := gw.Ready(context.Background()); err == nil || !strings.HasPrefix(err.Error(), "postgres:") {
		t.Fatalf("Ready = %v, want postgres named", err)
	}
}

// A server that answers and refuses what was asked of it will not change
// its mind by waiting: a database that does not exist stops the start.
func TestNewRefusesADatabaseThatDoesNotExist(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.DefaultDatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	if base := os.Getenv("ACKGATE_TEST_DATABASE_URL"); base != "" {
		if u, err = url.Parse(base); err != nil {
			t.Fatal(err)
		}
	}
	u.Path = "/ackgate_no_such_database"
	o := options(t, map[string]string{
		"GATEWAY_DATABASE_URL": u.String(),
		"GATEWAY_REDIS_URL":    "redis://" + testenv.Redis(t),
		"GUARDED_TOKEN":        "guarded-token-0123",
	})
	gw, err := wiring.New(context.Background(), o)
	if err == nil {
		gw.Close()
		t.Fatal("New succeeded against a database that does not exist")
	}
	if !strings.Contains(err.Error(), "3D000") {
		t.Fatalf("New = %v, want the server's refusal (3D000)", err)
	}
}

// Every session of the gateway's pool plans as storage.PlanAsLookups says:
// without it, the ledger's statements keep plans cached while the table
// was small, which read the whole table as it grows.
func TestGatewaySessionsPlanAsLookups(t *testing.T) {
	t.Parallel()
	dbURL := testenv.DatabaseURL(t)
	o := options(t, map[string]string{
		"GATEWAY_DATABASE_URL": dbURL,
		"GATEWAY_REDIS_URL":    "redis://" + testenv.Redis(t),
		"GUARDED_TOKEN":        "guarded-token-0123",
	})
	gw, err := wiring.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	want := map[string]string{}
	storage.PlanAsLookups(want)
	if len(want) == 0 {
		t.Fatal("PlanAsLookups sets nothing")
	}
	for name, v := range want {
		var got string
		if err := gw.Pool.QueryRow(context.Background(), "SELECT current_setting($1)", name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != v {
			t.Errorf("%s = %q in the gateway's sessions, want %q", name, got, v)
		}
	}
}

// A local route whose role does not exist stops the gateway at start, when
// Postgres answers: left to run time, every delivery would be nacked as a
// configuration fault (or, before, dead-lettered and acked as terminal).
func TestNewRefusesALocalRouteWhoseRoleDoesNotExist(t *testing.T) {
	t.Parallel()
	o := options(t, map[string]string{
		"GATEWAY_DATABASE_URL": testenv.DatabaseURL(t),
		"GATEWAY_REDIS_URL":    "redis://" + testenv.Redis(t),
		"GUARDED_TOKEN":        "guarded-token-0123",
	})
	routes, err := config.ParseRoutes([]byte(`routes:
  - name: local-orders
    broker: pubsub
    auth: none
    shape: local
    dead_letter: gateway
    local:
      sql: SELECT $1::text
      params: [idempotency_key]
      role: ackgate_no_such_role
`))
	if err != nil {
		t.Fatal(err)
	}
	o.Routes = routes
	gw, err := wiring.New(context.Background(), o)
	if err == nil {
		gw.Close()
		t.Fatal("New started a local route whose role does not exist")
	}
	if !strings.Contains(err.Error(), "local-orders") || !strings.Contains(err.Error(), "ackgate_no_such_role") {
		t.Fatalf("New = %v, want the route and its role named", err)
	}
}
