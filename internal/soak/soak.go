// Package soak runs ackgate under crashes and faults and then checks, from
// records that do not depend on each other, that the gateway kept its
// promise: no effect applied twice, no ack without an effect, no conflicting
// payload executed, and every message accounted for.
//
// A run is two `gateway serve` processes on one Postgres and one Redis,
// driven by a Pub/Sub push simulator (pushsim) or by Google's Pub/Sub
// emulator (internal/emulator), and calling a downstream that injects faults
// and keeps its own record of every effect (faultydown). An operator of the
// soak's own settles what the gateway parks, through the admin API.
// While messages flow, the run SIGKILLs and restarts each gateway, restarts
// Redis with its data lost and, with a private cluster, crashes and restarts
// Postgres. It uses only the gateway binary, its routes file, the ledger's
// tables, its admin API and the table the local route writes, so it
// measures the product as deployed, not its internals.
//
// docs/reliability.md explains what a passing run shows and what it does not.
package soak

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ackgate/ackgate/internal/emulator"
	"github.com/ackgate/ackgate/internal/soak/faultydown"
	"github.com/ackgate/ackgate/internal/soak/pushsim"
)

// AckDeadline is the subscriptions' ack deadline, Pub/Sub's default and the
// shortest it allows. The simulator uses it as the push request timeout and
// the routes declare it.
const AckDeadline = 10 * time.Second

// PrivatePostgres asks for a cluster of the soak's own.
const PrivatePostgres = "private"

// Brokers a run can publish to.
const (
	// BrokerPushSim is the repository's push simulator: two copies of a
	// delivery at once, redeliveries after an ack, exponential backoff.
	BrokerPushSim = "pushsim"
	// BrokerEmulator is Google's Pub/Sub emulator: its own envelope,
	// message ids and redelivery, one push at a time per subscription.
	BrokerEmulator = "emulator"
)

// Config is one run.
type Config struct {
	// Gateway is the path of a built gateway binary.
	Gateway string
	// Postgres is PrivatePostgres, or the URL of an empty database to use as
	// it is. Postgres restarts need the private cluster.
	Postgres string
	// PGBinDir holds initdb and postgres; found when empty.
	PGBinDir string
	// RedisServer is the redis-server binary.
	RedisServer string
	// WorkDir receives the routes file and the logs; a temporary directory
	// when empty, removed after a run whose invariants all hold.
	WorkDir string

	Messages int
	// Rate is messages published per second; Concurrency caps push requests
	// in flight.
	Rate        float64
	Concurrency int

	// Faults during publication, spread evenly over it.
	Kills, RedisRestarts, PostgresRestarts int
	// RestartPause is how long a killed gateway stays down.
	RestartPause time.Duration

	// Downstream faults; SlowDelay is set past the ack deadline by Run.
	Faults faultydown.Faults
	// PoisonRate: messages the downstream always refuses (half terminal,
	// half retryable). ReuseRate: messages published again under the same id
	// with a changed payload.
	PoisonRate, ReuseRate float64
	// Broker is BrokerPushSim or BrokerEmulator.
	Broker string
	// EmulatorLauncher is the emulator's launcher; found when empty.
	EmulatorLauncher string
	// EmulatorDeadLetter gives the emulator's subscriptions a dead-letter
	// policy of MaxDeliveryAttempts. Without one nothing but an ack ever
	// stops a message, so every route then dead-letters at the gateway.
	EmulatorDeadLetter bool
	// Broker habits. With the emulator, DuplicateRate is the share of
	// messages its publisher publishes twice (a new message id, the same
	// key and payload), backoff is the emulator's own, and the rest do not
	// apply.
	DuplicateRate, RedeliverAfterAckRate float64
	MinBackoff, MaxBackoff               time.Duration
	MaxDeliveryAttempts                  int
	// OperatorEvery is how often the soak's operator goes through the
	// lanes (see operator); 0 leaves them alone.
	OperatorEvery time.Duration
	// SettleTimeout bounds the wait, once publication ended, for the broker
	// to be done with every message; one it still delivers then is counted
	// as an invariant violation.
	SettleTimeout time.Duration

	Seed uint64
	// Broken makes the downstream and the local route's statement lie, to
	// show the checker catches it.
	Broken faultydown.Broken
	// Timeout bounds the whole run.
	Timeout time.Duration
	// RelayDrain bounds the wait, once the subscription is done, for the
	// relay to settle every handed-off operation; what is still open then
	// is counted as an invariant violation.
	RelayDrain time.Duration
	// Progress receives a line per fault and a status line now and then.
	Progress io.Writer

	// What a failover drill (cmd/drill) changes.
	//
	// Redis, when set, is the gateways' Redis settings (GATEWAY_REDIS_URL,
	// _ADDRS, _MASTER_NAME, _CLUSTER) for a Sentinel or a Cluster the
	// caller runs: the soak starts no Redis then, and restarts none.
	Redis map[string]string
	// GatewayEnv is added to both gateways' settings.
	GatewayEnv map[string]string
	// Hosts are the addresses the soak's own services listen on and the
	// gateways reach them at, each 127.0.0.1 when empty: apart, so that a
	// partition can cut one and not the others.
	Hosts Hosts
	// Placement puts each gateway somewhere else than this host's loopback:
	// a command prefix (ip netns exec NAME) and the host its listeners bind.
	Placement [2]Placement
	// Events are the caller's faults, each run once when publication
	// reaches its share. With events the run records every push answer and
	// each gateway's readiness, and reports what each event cost.
	Events []Event
	// OnReady, when set, is told where everything listens once the run is
	// set up, before publication starts: what an event needs to aim at.
	OnReady func(Services)
}

// Services is where a run's parts listen.
type Services struct {
	// Redis is the soak's own Redis (host:port), "" with Config.Redis.
	Redis string
	// Postgres is the ledger's database URL; Downstream the effects'
	// base URL; Gateways each gateway's ingest address.
	Postgres, Downstream string
	Gateways             []string
}

// Hosts are where the soak's own services listen.
type Hosts struct{ Downstream, Redis, Postgres string }

// Placement is where one gateway runs.
type Placement struct {
	Prefix []string
	Host   string
}

// Event is a fault of the caller's.
type Event struct {
	// At is the share of publication after which it runs (0 to 1).
	At   float64
	Name string
	Run  func(ctx context.Context) error
}

// DefaultConfig is the full soak behind `make soak`.
func DefaultConfig() Config {
	return Config{
		Gateway:  "bin/gateway",
		Postgres: PrivatePostgres,
		Messages: 10000, Rate: 120, Concurrency: 32,
		Kills: 8, RedisRestarts: 2, PostgresRestarts: 1, RestartPause: time.Second,
		Faults:     faultydown.Faults{Status5xx: 0.04, LoseResponse: 0.03, Slow: 0.01, LookupDown: 0.1},
		PoisonRate: 0.01, ReuseRate: 0.02, DuplicateRate: 0.05, RedeliverAfterAckRate: 0.03,
		MinBackoff: 250 * time.Millisecond, MaxBackoff: 5 * time.Second, MaxDeliveryAttempts: 20,
		Broker: BrokerPushSim, EmulatorDeadLetter: true, OperatorEvery: 5 * time.Second, SettleTimeout: 10 * time.Minute,
		Seed: 1, Timeout: 30 * time.Minute, RelayDrain: 2 * time.Minute,
	}
}

// ShortConfig is the soak inside `make test`: a few hundred messages, one
// gateway kill, one Redis restart, no Postgres restart.
func ShortConfig() Config {
	c := DefaultConfig()
	c.Messages, c.Rate = 300, 60
	c.Kills, c.RedisRestarts, c.PostgresRestarts = 1, 1, 0
	c.MinBackoff, c.MaxBackoff, c.MaxDeliveryAttempts = 100*time.Millisecond, 2*time.Second, 12
	c.OperatorEvery, c.SettleTimeout = 3*time.Second, 3*time.Minute
	c.Timeout = 5 * time.Minute
	return c
}

func (c *Config) validate() error {
	switch {
	case c.Messages < 1:
		return errors.New("messages must be at least 1")
	case c.Rate <= 0:
		return errors.New("rate must be positive")
	case c.Kills < 0 || c.RedisRestarts < 0 || c.PostgresRestarts < 0:
		return errors.New("fault counts cannot be negative")
	case c.PostgresRestarts > 0 && c.Postgres != PrivatePostgres:
		return errors.New("restarting Postgres needs the private cluster (-postgres private): a shared server is not the soak's to restart")
	case c.RedisRestarts > 0 && c.Redis != nil:
		return errors.New("restarting Redis needs the soak's own: a given Redis is not the soak's to restart")
	case c.Gateway == "":
		return errors.New("no gateway binary given")
	case c.Timeout <= 0:
		return errors.New("timeout must be positive")
	case c.RelayDrain < 0:
		return errors.New("relay drain cannot be negative")
	case c.Broker != BrokerPushSim && c.Broker != BrokerEmulator:
		return errBrokerName(c.Broker)
	case c.Broker == BrokerEmulator && c.EmulatorDeadLetter && (c.MaxDeliveryAttempts < 5 || c.MaxDeliveryAttempts > 100):
		return errors.New("the emulator's dead-letter policy takes 5 to 100 delivery attempts")
	case c.SettleTimeout <= 0:
		return errors.New("settle timeout must be positive")
	}
	if _, err := os.Stat(c.Gateway); err != nil {
		return fmt.Errorf("gateway binary: %w (build it with `make build`)", err)
	}
	return nil
}

// route is one route of the soak's routes file and its downstream endpoint.
type route struct {
	name     string
	shape    string
	endpoint faultydown.Endpoint
	// deadLetter is the route's dead-letter policy.
	deadLetter string
}

// Shapes whose evidence is a commit rather than a downstream answer.
const (
	shapeHandoff = "handoff"
	shapeLocal   = "local"
)

// The five shapes: a provider that deduplicates by key, one that does not
// but answers lookups, one that does neither; two handoffs to the relay,
// one whose provider applies every call and answers lookups, so that a
// blind resend would show as a second effect, and one whose provider
// deduplicates by key and has no lookup, so that the relay settles a lost
// answer by retrying inside the dedupe window; and a statement in the
// ledger's own database, which has no endpoint. The dead-letter policies
// differ so that both are exercised; a handoff route can only dead-letter
// at the gateway, since the broker was acked long before the relay gives
// up.
var routes = []route{
	{"soak-idempotent", "idempotent", faultydown.Endpoint{Name: "idempotent", Dedupe: true}, "gateway"},
	{"soak-lookup", "lookup", faultydown.Endpoint{Name: "lookup", Lookup: true}, "broker"},
	{"soak-unsafe", "unsafe", faultydown.Endpoint{Name: "unsafe"}, "gateway"},
	{"soak-handoff", shapeHandoff, faultydown.Endpoint{Name: "handoff", Lookup: true}, "gateway"},
	{"soak-handoff-dedupe", shapeHandoff, faultydown.Endpoint{Name: "handoff-dedupe", Dedupe: true}, "gateway"},
	{"soak-local", shapeLocal, faultydown.Endpoint{}, "gateway"},
}

// dedupeRoutes names the routes whose provider deduplicates by key.
func dedupeRoutes() map[string]bool {
	out := map[string]bool{}
	for _, r := range routes {
		if r.endpoint.Dedupe {
			out[r.name] = true
		}
	}
	return out
}

// localTable is what the local route's statement writes: one row per
// effect, with the message's data as it came. The idempotency key is
// deliberately not unique here: the soak measures the gateway, so a second
// execution must show as a second row rather than be refused by the table.
// Poisoned messages fail inside the statement: a CHECK refuses the terminal
// ones (SQLSTATE 23514), and a trigger fails the retryable ones with a
// serialization failure (40001), every time.
const localTable = `
CREATE TABLE IF NOT EXISTS soak_local_effects (
    id              bigserial PRIMARY KEY,
    idempotency_key text NOT NULL,
    operation_id    text NOT NULL,
    data            bytea NOT NULL,
    CONSTRAINT soak_local_terminal_poison
        CHECK (position('"poison":"terminal"' in convert_from(data, 'UTF8')) = 0)
);
CREATE INDEX IF NOT EXISTS soak_local_effects_key ON soak_local_effects (idempotency_key);
CREATE OR REPLACE FUNCTION soak_local_retryable_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF position('"poison":"retryable"' in convert_from(NEW.data, 'UTF8')) > 0 THEN
        RAISE EXCEPTION 'poisoned: refused, nothing written' USING ERRCODE = '40001';
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS soak_local_retryable_poison ON soak_local_effects;
CREATE TRIGGER soak_local_retryable_poison BEFORE INSERT ON soak_local_effects
    FOR EACH ROW EXECUTE FUNCTION soak_local_retryable_poison();
`

// localSQL is the local route's statement. A broken run breaks it the way
// it breaks the downstream, so that the checker is seen to notice on the
// local shape too: double-apply writes two rows per execution, and lie
// returns a fresh row id without writing anything.
func localSQL(broken faultydown.Broken) string {
	switch broken {
	case faultydown.DoubleApply:
		return `INSERT INTO soak_local_effects (idempotency_key, operation_id, data) SELECT $1::text, $2::text, $3::bytea FROM generate_series(1, 2) RETURNING id`
	case faultydown.Lie:
		return `SELECT nextval(pg_get_serial_sequence('soak_local_effects', 'id')) WHERE $1::text IS NOT NULL AND $2::text IS NOT NULL AND $3::bytea IS NOT NULL`
	}
	return `INSERT INTO soak_local_effects (idempotency_key, operation_id, data) VALUES ($1, $2, $3) RETURNING id`
}

// shapes maps each route to its shape, for the checker.
func shapes() map[string]string {
	out := make(map[string]string, len(routes))
	for _, r := range routes {
		out[r.name] = r.shape
	}
	return out
}

func subscription(r string) string { return "projects/soak/subscriptions/" + r }

// routesOptions are what differs between brokers.
type routesOptions struct {
	// KeyAttribute keys operations on this attribute instead of the message
	// id: the emulator chooses message ids, so a publisher's duplicate or a
	// changed payload can only share a key through an attribute.
	KeyAttribute string
	// AllAtGateway dead-letters every route at the gateway: without a
	// broker dead-letter policy, a message refused for ever would be
	// pushed for ever.
	AllAtGateway bool
}

// routesYAML is the routes file. The effect timeout is well inside the ack
// deadline, so a slow downstream is given up on and the gateway still
// answers (nack) before the broker stops waiting. The reconciler looks at
// lookup routes' parked operations after 2 s, not 30 s, so that it settles
// some within a run.
func routesYAML(downstream string, broken faultydown.Broken, o routesOptions) string {
	out := "# Written by the soak (internal/soak) for one run.\nroutes:\n"
	for _, r := range routes {
		if o.AllAtGateway {
			r.deadLetter = "gateway"
		}
		out += fmt.Sprintf(`  - name: %s
    broker: pubsub
    auth: none
    sources: [%s]
    fingerprint:
      version: 1
      data: true
`, r.name, subscription(r.name))
		if o.KeyAttribute != "" {
			out += fmt.Sprintf("    operation_key:\n      kind: attribute\n      name: %s\n", o.KeyAttribute)
		}
		if r.shape == shapeLocal {
			out += fmt.Sprintf(`    shape: local
    local:
      sql: %q
      params: [idempotency_key, operation_id, data_bytes]
      timeout: 2s
    max_attempts: 4
    dead_letter: %s
    ack_deadline: %s
`, localSQL(broken), r.deadLetter, AckDeadline)
			continue
		}
		out += fmt.Sprintf(`    effect:
      url: %s/%s/effects
      timeout: 3s
      result_id_header: X-Result-Id
`, downstream, r.endpoint.Name)
		if r.endpoint.Lookup {
			out += fmt.Sprintf("      lookup_url: %s/%s/effects/{key}\n", downstream, r.endpoint.Name)
		}
		out += fmt.Sprintf("    shape: %s\n", r.shape)
		if r.endpoint.Dedupe {
			out += "    dedupe_window: 24h\n"
		}
		if r.endpoint.Lookup {
			out += "    reconcile:\n      interval: 2s\n      max_interval: 10s\n"
		}
		if r.shape == shapeHandoff {
			// Quick passes, so that the relay's retries and its attempt
			// limit play out within a run.
			out += "    handoff:\n      retry_min: 200ms\n      retry_max: 2s\n"
		}
		out += fmt.Sprintf(`    max_attempts: 4
    dead_letter: %s
    ack_deadline: %s
    renewal:
      interval: 2s
      max_extension: 10s
`, r.deadLetter, AckDeadline)
	}
	return out
}

// Report is a finished run.
type Report struct {
	Config           Config
	Publish, Total   time.Duration
	Messages, Reused int
	// Republished counts the emulator publisher's duplicates;
	// Publications, every payload published, the operator's too.
	Republished, Publications int
	Poisoned                  map[string]int
	// Faults carried out.
	Kills            []int // per gateway
	RedisRestarts    int
	PostgresRestarts int
	Broker           pushsim.Stats
	// PushesWithAttempt counts emulator pushes that carried
	// deliveryAttempt; Held, the messages the emulator still held once the
	// run was done with them.
	PushesWithAttempt, Held int
	Operator                OperatorStats
	// Started is when the run began. Events are the caller's faults as
	// they ran, and what each cost.
	Started    time.Time
	Events     []EventRecord
	Downstream []faultydown.EndpointRecord
	Verdict    Verdict
	// KeptDir holds the logs when the run did not pass.
	KeptDir string
}

// Run performs one soak. A non-nil error means the run itself could not be
// carried out; violated invariants are in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	r := &runner{cfg: cfg, report: &Report{Config: cfg, Poisoned: map[string]int{}, Kills: make([]int, 2)}}
	defer r.cleanup()
	if err := r.setUp(ctx); err != nil {
		r.keep = true
		return nil, fmt.Errorf("soak: %w (logs in %s)", err, r.dir)
	}
	if err := r.drive(ctx); err != nil {
		r.keep = true
		return nil, fmt.Errorf("soak: %w (logs in %s)", err, r.dir)
	}
	if err := r.check(ctx); err != nil {
		r.keep = true
		return nil, fmt.Errorf("soak: %w (logs in %s)", err, r.dir)
	}
	if r.report.Verdict.Violations() > 0 {
		r.keep = true
		r.report.KeptDir = r.dir
	}
	return r.report, nil
}

type runner struct {
	cfg    Config
	report *Report
	start  time.Time

	dir, ownDir string // ownDir is set when the soak created dir
	keep        bool
	closers     []func()

	down     *faultydown.Server
	downURL  string
	redis    *redisServer
	pg       *pgCluster
	dbURL    string
	gateways []*gatewayProc
	admin    *adminClient
	broker   broker
	emu      *emuBroker // the broker, when it is the emulator
	operator *operator

	// pubs are every publication, the operator's too, by handle order of
	// publishing; byTrace finds one by the trace id its deliveries carry.
	mu      sync.Mutex
	pubs    []publication
	byTrace map[string]int

	// Filled at the end, for the checker.
	held    []int
	lanes   map[string]*OpLanes
	actions []OperatorAction
}

// publication is one published payload and its broker handle.
type publication struct {
	msg    pushsim.Message
	intent Intent
	handle int
}

// again is the same payload published once more: a new trace id (its own
// publication), everything else as it was.
func (p publication) again() publication {
	trace := randomHex(16)
	attrs := make(map[string]string, len(p.msg.Attributes))
	for k, v := range p.msg.Attributes {
		attrs[k] = v
	}
	attrs["googclient_traceparent"] = "00-" + trace + "-" + randomHex(8) + "-01"
	p.msg.Attributes = attrs
	p.intent.TraceID = trace
	p.intent.Acked, p.intent.DeadLettered, p.intent.StillDelivered = false, false, false
	return p
}

// publish hands p to the broker and keeps it.
func (r *runner) publish(ctx context.Context, p publication) {
	p.msg.PublishTime = time.Now()
	h := r.broker.Publish(ctx, p.msg)
	r.mu.Lock()
	defer r.mu.Unlock()
	p.handle = h
	r.byTrace[p.intent.TraceID] = len(r.pubs)
	r.pubs = append(r.pubs, p)
}

// publicationOf finds the publication one of rec's deliveries carried.
func (r *runner) publicationOf(rec *adminRecord) (publication, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range rec.Deliveries {
		if i, ok := r.byTrace[d.TraceID]; ok {
			return r.pubs[i], true
		}
	}
	return publication{}, false
}

// delivering reports whether the broker is still delivering a publication
// of route's message id (key).
func (r *runner) delivering(route, id string) bool {
	r.mu.Lock()
	pubs := slices.Clone(r.pubs)
	r.mu.Unlock()
	for _, p := range pubs {
		if p.intent.Route == route && p.intent.MessageID == id {
			if _, done := r.broker.Settled(p.handle); !done {
				return true
			}
		}
	}
	return false
}

func (r *runner) progress(format string, args ...any) {
	fmt.Fprintf(r.cfg.Progress, "soak %6.1fs: %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

func (r *runner) cleanup() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
	if r.ownDir != "" && !r.keep {
		os.RemoveAll(r.ownDir)
	}
}

func (r *runner) logFile(name string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(r.dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	r.closers = append(r.closers, func() { f.Close() })
	return f, nil
}

func (r *runner) setUp(ctx context.Context) error {
	r.start = time.Now()
	r.report.Started = r.start
	r.dir = r.cfg.WorkDir
	if r.dir == "" {
		d, err := os.MkdirTemp("", "ackgate-soak-")
		if err != nil {
			return err
		}
		r.dir, r.ownDir = d, d
	}
	if err := os.MkdirAll(filepath.Join(r.dir, "redis"), 0o755); err != nil {
		return err
	}

	f := r.cfg.Faults
	f.SlowDelay = AckDeadline + time.Second
	var eps []faultydown.Endpoint
	for _, rt := range routes {
		if rt.endpoint.Name != "" {
			eps = append(eps, rt.endpoint)
		}
	}
	r.down = faultydown.New(eps, f, r.cfg.Broken, r.cfg.Seed)
	ln, err := net.Listen("tcp", net.JoinHostPort(orLoopback(r.cfg.Hosts.Downstream), "0"))
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: r.down, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	r.closers = append(r.closers, func() { srv.Close() })
	r.downURL = "http://" + ln.Addr().String()

	redisSettings := r.cfg.Redis
	if redisSettings == nil {
		redisLog, err := r.logFile("redis.log")
		if err != nil {
			return err
		}
		bin := r.cfg.RedisServer
		if bin == "" {
			if bin, err = exec.LookPath("redis-server"); err != nil {
				bin = "/usr/bin/redis-server"
			}
		}
		if r.redis, err = startRedis(ctx, bin, orLoopback(r.cfg.Hosts.Redis), filepath.Join(r.dir, "redis"), redisLog); err != nil {
			return err
		}
		r.closers = append(r.closers, r.redis.stop)
		redisSettings = map[string]string{"GATEWAY_REDIS_URL": "redis://" + r.redis.addr() + "/0"}
	}

	if r.cfg.Postgres == PrivatePostgres {
		binDir, err := pgBinDir(r.cfg.PGBinDir)
		if err != nil {
			return err
		}
		pgLog, err := r.logFile("postgres.log")
		if err != nil {
			return err
		}
		if r.pg, err = startPostgres(ctx, binDir, orLoopback(r.cfg.Hosts.Postgres), pgLog); err != nil {
			return err
		}
		r.closers = append(r.closers, r.pg.cleanup)
		if r.dbURL, err = createDatabase(ctx, r.pg.url("postgres"), "soak"); err != nil {
			return err
		}
	} else {
		r.dbURL = r.cfg.Postgres
	}

	routesFile := filepath.Join(r.dir, "routes.yaml")
	ro := routesOptions{}
	if r.cfg.Broker == BrokerEmulator {
		ro.KeyAttribute, ro.AllAtGateway = keyAttribute, !r.cfg.EmulatorDeadLetter
	}
	if err := os.WriteFile(routesFile, []byte(routesYAML(r.downURL, r.cfg.Broken, ro)), 0o644); err != nil {
		return err
	}
	settings := map[string]string{
		"GATEWAY_DATABASE_URL":     r.dbURL,
		"GATEWAY_ROUTES_FILE":      routesFile,
		"GATEWAY_ADMIN_TOKEN":      "soak-admin-token-0123456789",
		"GATEWAY_SHUTDOWN_TIMEOUT": "15s",
		"GATEWAY_LOG_LEVEL":        "warn",
		// The relay looks for due outbox entries often, and the reconciler
		// for due checks, so that both settle within a run rather than
		// within the defaults' pace.
		"GATEWAY_RELAY_POLL":     "100ms",
		"GATEWAY_RECONCILE_POLL": "500ms",
	}
	for _, m := range []map[string]string{redisSettings, r.cfg.GatewayEnv} {
		for k, v := range m {
			settings[k] = v
		}
	}
	if err := runGateway(ctx, r.cfg.Gateway, gatewayEnv(settings), "migrate"); err != nil {
		return err
	}
	if err := createLocalTable(ctx, r.dbURL); err != nil {
		return err
	}
	var admins []string
	for i := range 2 {
		listen, err := freePort()
		if err != nil {
			return err
		}
		admin, err := freePort()
		if err != nil {
			return err
		}
		host := r.cfg.Placement[i].Host
		if host == "" {
			host = "127.0.0.1"
		}
		s := map[string]string{
			"GATEWAY_LISTEN_ADDR": net.JoinHostPort(host, strconv.Itoa(listen)),
			"GATEWAY_ADMIN_ADDR":  net.JoinHostPort(host, strconv.Itoa(admin)),
			"GATEWAY_INSTANCE_ID": fmt.Sprintf("soak-gateway-%d", i+1),
		}
		for k, v := range settings {
			s[k] = v
		}
		log, err := r.logFile(fmt.Sprintf("gateway-%d.log", i+1))
		if err != nil {
			return err
		}
		g := &gatewayProc{name: fmt.Sprintf("gateway %d", i+1), bin: r.cfg.Gateway, prefix: r.cfg.Placement[i].Prefix,
			env: gatewayEnv(s), listen: s["GATEWAY_LISTEN_ADDR"], log: log}
		if err := g.start(ctx); err != nil {
			return err
		}
		r.closers = append(r.closers, g.stop)
		r.gateways = append(r.gateways, g)
		admins = append(admins, "http://"+s["GATEWAY_ADMIN_ADDR"])
	}
	r.admin = newAdminClient(admins, settings["GATEWAY_ADMIN_TOKEN"])
	r.operator = newOperator(r, r.admin)
	r.byTrace = map[string]int{}

	endpoints := make([]string, len(r.gateways))
	for i, g := range r.gateways {
		endpoints[i] = "http://" + g.listen
	}
	if err := r.startBroker(ctx, endpoints); err != nil {
		return err
	}
	if r.cfg.OnReady != nil {
		sv := Services{Postgres: r.dbURL, Downstream: r.downURL}
		if r.redis != nil {
			sv.Redis = r.redis.addr()
		}
		for _, g := range r.gateways {
			sv.Gateways = append(sv.Gateways, g.listen)
		}
		r.cfg.OnReady(sv)
	}
	pg, rds := "the given database", "the given one"
	if r.pg != nil {
		pg = "a private cluster"
	}
	if r.redis != nil {
		rds = r.redis.addr()
	}
	r.progress("ready: 2 gateways, broker %s, redis %s, postgres %s, downstream %s, work dir %s",
		r.cfg.Broker, rds, pg, r.downURL, r.dir)
	return nil
}

func orLoopback(host string) string {
	if host != "" {
		return host
	}
	return "127.0.0.1"
}

func (r *runner) startBroker(ctx context.Context, endpoints []string) error {
	if r.cfg.Broker == BrokerPushSim {
		sim, err := pushsim.New(pushsim.Config{
			Endpoints: endpoints, AckDeadline: AckDeadline,
			MinBackoff: r.cfg.MinBackoff, MaxBackoff: r.cfg.MaxBackoff, MaxDeliveryAttempts: r.cfg.MaxDeliveryAttempts,
			DuplicateRate: r.cfg.DuplicateRate, RedeliverAfterAckRate: r.cfg.RedeliverAfterAckRate,
			RedeliverAfterAckDelay: 2 * time.Second, Concurrency: r.cfg.Concurrency, Seed: r.cfg.Seed,
			Timeline: len(r.cfg.Events) > 0,
		})
		if err != nil {
			return err
		}
		r.broker = sim
		r.closers = append(r.closers, sim.Close)
		return nil
	}
	launcher := r.cfg.EmulatorLauncher
	if launcher == "" {
		var err error
		if launcher, err = emulator.Find(); err != nil {
			return err
		}
	}
	log, err := r.logFile("emulator.log")
	if err != nil {
		return err
	}
	names := make([]string, len(routes))
	for i, rt := range routes {
		names[i] = rt.name
	}
	ec := emuConfig{Launcher: launcher, Log: log, Gateways: endpoints, Routes: names, AckDeadline: AckDeadline, Seed: r.cfg.Seed}
	if r.cfg.EmulatorDeadLetter {
		ec.MaxDeliveryAttempts = r.cfg.MaxDeliveryAttempts
	}
	if r.emu, err = newEmuBroker(ctx, ec); err != nil {
		return err
	}
	r.broker = r.emu
	r.closers = append(r.closers, r.emu.Close)
	return nil
}

// planned is a message ready to publish.
type planned struct {
	msg    pushsim.Message
	intent Intent
	// after is the index of the message it follows (for a changed payload
	// under a reused key).
	after int
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

func (r *runner) plan() []planned {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, r.cfg.Seed+1))
	run := randomHex(4)
	var out, reused []planned
	mk := func(i, variant int, rt route, poison string) planned {
		id := fmt.Sprintf("soak-%s-%05d", run, i)
		doc := map[string]any{"id": id, "n": i, "variant": variant}
		if poison != "" {
			doc["poison"] = poison
		}
		data, _ := json.Marshal(doc)
		sum := sha256.Sum256(data)
		trace := randomHex(16)
		return planned{
			msg: pushsim.Message{
				Route: rt.name, Subscription: subscription(rt.name), ID: id, Data: data,
				Attributes: map[string]string{"googclient_traceparent": "00-" + trace + "-" + randomHex(8) + "-01"},
			},
			intent: Intent{Route: rt.name, MessageID: id, Variant: variant, TraceID: trace, BodySHA256: hex.EncodeToString(sum[:])},
			after:  i,
		}
	}
	for i := range r.cfg.Messages {
		rt := routes[i%len(routes)]
		poison := ""
		if rng.Float64() < r.cfg.PoisonRate {
			poison = []string{"terminal", "retryable"}[rng.IntN(2)]
			r.report.Poisoned[poison]++
		}
		orig := mk(i, 0, rt, poison)
		out = append(out, orig)
		if rng.Float64() < r.cfg.ReuseRate {
			p := mk(i, 1, rt, "")
			// Up to about a second later: sometimes while the original is in
			// flight, sometimes after it was acked.
			p.after = i + rng.IntN(int(r.cfg.Rate)+1)
			reused = append(reused, p)
		}
		// The emulator never pushes two copies at once; its publisher's
		// duplicates (the same key and payload under a new message id)
		// are the duplicates it can have.
		if r.cfg.Broker == BrokerEmulator && rng.Float64() < r.cfg.DuplicateRate {
			again := publication{msg: orig.msg, intent: orig.intent}.again()
			d := planned{msg: again.msg, intent: again.intent, after: i + rng.IntN(int(r.cfg.Rate)/2+1)}
			reused = append(reused, d)
			r.report.Republished++
		}
	}
	sort.SliceStable(reused, func(a, b int) bool { return reused[a].after < reused[b].after })
	r.report.Messages, r.report.Reused = len(out), len(reused)-r.report.Republished
	// Merge: each changed payload goes out right after the message it follows.
	merged := make([]planned, 0, len(out)+len(reused))
	j := 0
	for i, p := range out {
		merged = append(merged, p)
		for j < len(reused) && reused[j].after <= i {
			merged = append(merged, reused[j])
			j++
		}
	}
	return append(merged, reused[j:]...)
}

// faultEvent is a fault fired once publication reaches a share of the run.
type faultEvent struct {
	at   float64
	kind string
	// event indexes Config.Events for kind "event".
	event int
}

// faultPlan spreads each kind of fault evenly over publication, the Redis
// and Postgres restarts offset from the kills so that each hits on its own.
func faultPlan(kills, redis, pg int) []faultEvent {
	total := kills + redis + pg
	half := 1 / float64(2*(total+1))
	var ev []faultEvent
	for i := range kills {
		ev = append(ev, faultEvent{at: float64(i+1) / float64(kills+1), kind: "kill"})
	}
	for i := range redis {
		ev = append(ev, faultEvent{at: float64(i+1)/float64(redis+1) + half, kind: "redis"})
	}
	for i := range pg {
		ev = append(ev, faultEvent{at: float64(i+1)/float64(pg+1) - half, kind: "postgres"})
	}
	sort.SliceStable(ev, func(i, j int) bool { return ev[i].at < ev[j].at })
	return ev
}

func (r *runner) drive(ctx context.Context) error {
	msgs := r.plan()
	ctx, abort := context.WithCancel(ctx)
	defer abort()
	var published atomic.Int64
	var faultErr error
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		if err := r.injectFaults(ctx, &published); err != nil {
			faultErr = err
			abort()
		}
	}()
	stopStatus := r.statusLines(ctx, &published, len(msgs))
	defer stopStatus()
	stopOperator := func() {}
	if r.cfg.OperatorEvery > 0 {
		stopOperator = r.operator.run(ctx, r.cfg.OperatorEvery)
	}
	defer func() { stopOperator() }()
	var ready *readiness
	if len(r.cfg.Events) > 0 {
		var stopWatch func()
		ready, stopWatch = r.watchReadiness(ctx)
		defer stopWatch()
	}

	interval := time.Duration(float64(time.Second) / r.cfg.Rate)
	begin := time.Now()
	r.progress("publishing %d messages (%d with a reused key and a changed payload, %d published twice) at %.0f/s to the %s",
		r.report.Messages, r.report.Reused, r.report.Republished, r.cfg.Rate, r.cfg.Broker)
	for i, p := range msgs {
		if wait := time.Until(begin.Add(time.Duration(i) * interval)); wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		if ctx.Err() != nil {
			break
		}
		r.publish(ctx, publication{msg: p.msg, intent: p.intent})
		published.Add(1)
	}
	r.report.Publish = time.Since(begin)
	<-faultsDone
	if faultErr != nil {
		return faultErr
	}
	r.progress("published; waiting for every message to be acked or dead-lettered by the subscription")
	deadline := time.Now().Add(r.cfg.SettleTimeout)
	for round := 0; ; round++ {
		r.awaitSettled(ctx, deadline)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("run did not finish: %w", err)
		}
		if round == 0 && len(r.cfg.Events) > 0 {
			r.mu.Lock()
			costs(r.report.Events, r.broker.Timeline(), ready, time.Now())
			r.mu.Unlock()
		}
		if r.cfg.OperatorEvery <= 0 {
			break
		}
		// The broker is done (or out of time): what is still parked now
		// gets the operator's last look, and what it publishes again gets
		// delivered before the run ends.
		stopOperator()
		stopOperator = func() {}
		n := r.operator.round(ctx, true)
		if n == 0 && r.broker.Unsettled() == 0 || round == 3 || time.Now().After(deadline) {
			break
		}
		r.progress("the operator published %d messages again; waiting for them", n)
	}
	if r.emu != nil {
		held, err := r.emu.held(ctx, AckDeadline)
		if err != nil {
			return fmt.Errorf("emulator backlog: %w", err)
		}
		r.held = held
		r.report.Held = len(held)
		r.report.PushesWithAttempt = r.emu.pushesWithAttempt()
		r.progress("the emulator held %d messages after the run was done with them", len(held))
	}
	r.drainRelay(ctx)
	r.actions, r.report.Operator = r.operator.snapshot()
	lanes, err := r.readLanes(ctx, r.admin, r.operator.touched())
	if err != nil {
		return err
	}
	r.lanes = lanes
	r.report.Broker = r.broker.Stats()
	return nil
}

// awaitSettled waits until the broker is done with every publication, or
// until deadline.
func (r *runner) awaitSettled(ctx context.Context, deadline time.Time) {
	for {
		n := r.broker.Unsettled()
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.progress("%d messages still being delivered after %s: counted as never settled", n, r.cfg.SettleTimeout)
			return
		}
	}
}

// drainRelay waits, with the gateways still running, until no handed-off
// operation is open: each is confirmed, parked or terminal. The broker was
// acked at the handoff, so the subscription being done says nothing of the
// relay's progress.
func (r *runner) drainRelay(ctx context.Context) {
	if r.cfg.RelayDrain <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RelayDrain)
	defer cancel()
	last := -1
	for {
		n, err := openHandoffs(ctx, r.dbURL)
		switch {
		case err == nil && n == 0:
			r.progress("relay drained: no handed-off operation is open")
			return
		case err == nil && n != last:
			r.progress("waiting for the relay: %d handed-off operations open", n)
			last = n
		}
		select {
		case <-ctx.Done():
			r.progress("relay not drained after %s: %d handed-off operations open", r.cfg.RelayDrain, last)
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func localRoute() string {
	for _, rt := range routes {
		if rt.shape == shapeLocal {
			return rt.name
		}
	}
	return ""
}

func (r *runner) statusLines(ctx context.Context, published *atomic.Int64, total int) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			st := r.broker.Stats()
			r.progress("published %d/%d, pushes %d, acked %d, dead-lettered %d", published.Load(), total,
				st.Deliveries, st.Acked, st.DeadLettered)
		}
	})
	return func() { cancel(); wg.Wait() }
}

func (r *runner) injectFaults(ctx context.Context, published *atomic.Int64) error {
	kills := 0
	plan := faultPlan(r.cfg.Kills, r.cfg.RedisRestarts, r.cfg.PostgresRestarts)
	for i, e := range r.cfg.Events {
		plan = append(plan, faultEvent{at: e.At, kind: "event", event: i})
	}
	sort.SliceStable(plan, func(i, j int) bool { return plan[i].at < plan[j].at })
	for _, ev := range plan {
		target := int64(ev.at * float64(r.cfg.Messages))
		for published.Load() < target {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(20 * time.Millisecond):
			}
		}
		switch ev.kind {
		case "kill":
			i := kills % len(r.gateways)
			kills++
			g := r.gateways[i]
			r.progress("SIGKILL %s", g.name)
			g.kill()
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(r.cfg.RestartPause):
			}
			if err := g.start(ctx); err != nil {
				return fmt.Errorf("restart after SIGKILL: %w", err)
			}
			r.report.Kills[i]++
			r.progress("%s is back", g.name)
		case "redis":
			r.progress("restarting Redis without its data")
			if err := r.redis.restart(ctx); err != nil {
				return err
			}
			r.report.RedisRestarts++
			r.progress("Redis is back, empty")
		case "event":
			e := r.cfg.Events[ev.event]
			r.progress("event: %s", e.Name)
			rec := EventRecord{Name: e.Name, Start: time.Now()}
			err := e.Run(ctx)
			rec.End = time.Now()
			if err != nil {
				rec.Err = err.Error()
				r.progress("event %s failed: %v", e.Name, err)
			} else {
				r.progress("event %s done in %s", e.Name, rec.End.Sub(rec.Start).Round(time.Millisecond))
			}
			r.mu.Lock()
			r.report.Events = append(r.report.Events, rec)
			r.mu.Unlock()
		case "postgres":
			r.progress("crashing Postgres (immediate shutdown) and starting it again")
			if err := r.pg.restart(ctx); err != nil {
				return fmt.Errorf("postgres restart: %w", err)
			}
			r.report.PostgresRestarts++
			r.progress("Postgres is back")
		}
	}
	return nil
}

func (r *runner) check(ctx context.Context) error {
	// An orderly stop lets each gateway finish the bookkeeping that follows
	// its last answers before the ledger is read.
	for _, g := range r.gateways {
		g.stop()
	}
	ops, traces, err := readLedger(ctx, r.dbURL)
	if err != nil {
		return err
	}
	rows, err := readLocalRows(ctx, r.dbURL, localRoute())
	if err != nil {
		return err
	}
	for id, l := range r.lanes {
		if op, ok := ops[id]; ok {
			op.Lanes = l
			ops[id] = op
		}
	}
	r.mu.Lock()
	intents := make([]Intent, len(r.pubs))
	for i, p := range r.pubs {
		out, done := r.broker.Settled(p.handle)
		intents[i] = p.intent
		intents[i].Acked, intents[i].DeadLettered, intents[i].StillDelivered = out.Acked, out.DeadLettered, !done
	}
	held := make([]Intent, 0, len(r.held))
	for _, h := range r.held {
		for _, p := range r.pubs {
			if p.handle == h {
				held = append(held, p.intent)
			}
		}
	}
	r.mu.Unlock()
	in := Inputs{Intents: intents, Ops: ops, TraceOps: traces, Shapes: shapes(), LocalRows: rows,
		Dedupe: dedupeRoutes(), OperatorActions: r.actions, Held: held, LanesRead: r.lanes != nil}
	r.report.Downstream = r.down.Records()
	byEndpoint := map[string]string{}
	for _, rt := range routes {
		if rt.endpoint.Name != "" {
			byEndpoint[rt.endpoint.Name] = rt.name
		}
	}
	for _, rec := range r.report.Downstream {
		name := byEndpoint[rec.Endpoint.Name]
		for _, a := range rec.Applications {
			in.Effects = append(in.Effects, Effect{Route: name, Key: a.Key, ResultID: a.ResultID, BodySHA256: a.BodySHA256})
		}
		for _, k := range rec.KeyReuse {
			in.KeyReuse = append(in.KeyReuse, KeyReuse{Route: name, Key: k})
		}
	}
	r.report.Publications = len(intents)
	r.report.Verdict = Check(in)
	r.report.Total = time.Since(r.start)
	return nil
}
