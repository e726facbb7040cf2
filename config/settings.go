package config

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/admincred"
	"github.com/ackgate/ackgate/internal/seal"
	"github.com/kelseyhightower/envconfig"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// EnvPrefix is the prefix of every process setting's environment variable.
const EnvPrefix = "GATEWAY"

// MinAdminTokenLen is the shortest admin token serve accepts.
const MinAdminTokenLen = 16

// MinKeyHashSecretLen is the shortest key hash secret accepted: 32 bytes,
// the size of the HMAC-SHA256 output it keys.
const MinKeyHashSecretLen = 32

// maxInFlightLimit keeps the admission's slots a sane allocation.
const maxInFlightLimit = 1 << 20

// maxAdmissionWait is the longest a delivery may wait for a slot: the gate
// leaves at least two seconds before a broker's deadline to commit and
// answer, and a wait must leave half of that.
const maxAdmissionWait = time.Second

// minMemoryLimit and maxMemoryLimit bound MemoryLimit. Below 32 MiB the
// gateway's own live memory with a few connections is at the limit, and the
// collector would run without pause; above 1 TiB the value is a typo.
const (
	minMemoryLimit = 32 << 20
	maxMemoryLimit = 1 << 40
)

// maxClockSkewLimit is the largest MaxClockSkew accepted: beyond a day the
// bound no longer tells a skewed clock from a forged time.
const maxClockSkewLimit = 24 * time.Hour

// Settings are the process settings, read from GATEWAY_* environment
// variables. The struct tags are envconfig's: they name the variable, its
// default and its description (see Usage).
type Settings struct {
	DatabaseURL string `envconfig:"DATABASE_URL" default:"postgres://ackgate:ackgate@127.0.0.1:5432/ackgate?sslmode=disable" desc:"Postgres URL or key=value DSN of the ledger"`

	// RedisURL is used alone for a standalone Redis. With RedisAddrs set, the
	// addresses replace its host, and the URL still supplies username,
	// password, database and TLS (rediss://).
	RedisURL              string   `envconfig:"REDIS_URL" default:"redis://127.0.0.1:6379/0" desc:"Redis URL; with REDIS_ADDRS it only supplies credentials, db and TLS"`
	RedisAddrs            []string `envconfig:"REDIS_ADDRS" desc:"comma-separated Sentinel or Cluster addresses (host:port)"`
	RedisMasterName       string   `envconfig:"REDIS_MASTER_NAME" desc:"Sentinel master name; set to use Sentinel"`
	RedisSentinelPassword string   `envconfig:"REDIS_SENTINEL_PASSWORD" desc:"password of the Sentinel nodes themselves"`
	RedisCluster          bool     `envconfig:"REDIS_CLUSTER" default:"false" desc:"treat REDIS_ADDRS as Cluster seeds even when there is only one"`

	RoutesFile string `envconfig:"ROUTES_FILE" desc:"path of the routes YAML file (required for serve and check-config)"`
	ListenAddr string `envconfig:"LISTEN_ADDR" default:":8080" desc:"ingest listener"`
	AdminAddr  string `envconfig:"ADMIN_ADDR" default:":8081" desc:"admin listener"`
	AdminToken string `envconfig:"ADMIN_TOKEN" desc:"bearer token of the admin API, known as the credential admin (serve needs it or ADMIN_TOKENS / ADMIN_TOKENS_FILE; at least 16 characters)"`
	// AdminTokens and AdminTokensFile name each operator's own token, so
	// that resolutions record who made them (package admincred).
	AdminTokens     string `envconfig:"ADMIN_TOKENS" desc:"named admin credentials, NAME=TOKEN or NAME=sha256:HEX, comma-separated; every resolution, replay and console action records the name"`
	AdminTokensFile string `envconfig:"ADMIN_TOKENS_FILE" desc:"file of named admin credentials, one NAME=TOKEN or NAME=sha256:HEX a line (# comments), read at start"`
	// MetricsToken lets a scraper read GET /metrics without the admin token,
	// which also reads evidence records.
	MetricsToken string `envconfig:"METRICS_TOKEN" desc:"optional bearer token that opens GET /metrics on the admin listener and nothing else (at least 16 characters, not the admin token)"`

	MaxBodyBytes      int64         `envconfig:"MAX_BODY_BYTES" default:"1048576" desc:"largest push request body accepted"`
	ReadHeaderTimeout time.Duration `envconfig:"READ_HEADER_TIMEOUT" default:"5s" desc:"http.Server ReadHeaderTimeout"`
	ReadTimeout       time.Duration `envconfig:"READ_TIMEOUT" default:"30s" desc:"http.Server ReadTimeout"`
	WriteTimeout      time.Duration `envconfig:"WRITE_TIMEOUT" default:"60s" desc:"http.Server WriteTimeout; must exceed every route's ack_deadline"`
	IdleTimeout       time.Duration `envconfig:"IDLE_TIMEOUT" default:"120s" desc:"http.Server IdleTimeout"`
	ShutdownTimeout   time.Duration `envconfig:"SHUTDOWN_TIMEOUT" default:"25s" desc:"time given to in-flight deliveries on shutdown"`
	// MaxInFlight bounds the process's memory under a broker's concurrency:
	// deliveries past it wait for a slot, and are nacked if none frees within
	// AdmissionWait. The wait is short so that it never eats the margin the
	// gate keeps before a broker's deadline (at least a second is left).
	//
	// MaxBodyBytesInFlight bounds the bytes of push bodies those deliveries
	// hold, the part of a delivery's memory that the sender decides: at the
	// default, a thousand deliveries of ordinary size fit in it, and only as
	// many bodies of the largest size as the chart's memory limit holds
	// beside them. It must admit at least one body of MaxBodyBytes.
	MaxInFlight          int           `envconfig:"MAX_IN_FLIGHT" default:"1000" desc:"deliveries this process works on at once; more wait for room up to ADMISSION_WAIT, then get a nack (Pub/Sub 429, SNS 503, with Retry-After); 0 sets no bound"`
	MaxBodyBytesInFlight int64         `envconfig:"MAX_BODY_BYTES_IN_FLIGHT" default:"16MiB" desc:"bytes of push bodies the deliveries in flight hold at once, in bytes or with a KiB, MiB or GiB suffix; a delivery past it waits and is nacked as past MAX_IN_FLIGHT; 0 sets no bound, else at least MAX_BODY_BYTES"`
	AdmissionWait        time.Duration `envconfig:"ADMISSION_WAIT" default:"1s" desc:"how long a delivery past MAX_IN_FLIGHT or MAX_BODY_BYTES_IN_FLIGHT waits for room before its nack (0 to 1s)"`
	// MemoryLimit is the memory the process may use, usually its
	// container's limit; MemoryLimitRatio of it becomes the Go runtime's soft
	// limit (SoftMemoryLimit). Without one the collector lets the heap grow to
	// twice what is live before it runs, which at a thousand deliveries in
	// flight is tens of megabytes the process does not need; with one it
	// collects sooner as the process nears the limit, trading CPU for memory.
	// The rest of the limit is left for what the runtime does not count (the
	// binary's pages, thread stacks) and for the live heap overshooting a soft
	// limit under a burst; SoftMemoryLimit keeps at least uncountedReserve of
	// it.
	MemoryLimit      int64   `envconfig:"MEMORY_LIMIT" desc:"memory this process may use, such as its container's limit, in bytes or with a KiB, MiB or GiB suffix; MEMORY_LIMIT_RATIO of it becomes the Go runtime's soft memory limit (unset: none, and GOMEMLIMIT applies if set)"`
	MemoryLimitRatio float64 `envconfig:"MEMORY_LIMIT_RATIO" default:"0.9" desc:"share of MEMORY_LIMIT given to the Go runtime as its soft limit (0.5 to 1), lowered to leave 32MiB of the limit for what the runtime does not count, but not below half of it"`
	// MaxClockSkew bounds how far ahead of this gateway's clock a Pub/Sub
	// publishTime may be: a later one did not come from a broker that keeps
	// our time, and it would hide a message's age from the retention check.
	MaxClockSkew time.Duration `envconfig:"MAX_CLOCK_SKEW" default:"5m" desc:"how far a Pub/Sub publishTime may be ahead of this gateway's clock; a later one is malformed (400)"`
	// KeyHashSecret keys the hash of operation keys drawn from private fields
	// (gate.NewKeyHash); required when a route keys on one.
	KeyHashSecret string `envconfig:"KEY_HASH_SECRET" desc:"secret of the HMAC-SHA256 that operation keys drawn from private fields are kept as (required when a route keys on one, at least 32 characters; changing it makes redeliveries of such messages look new)"`
	// OutboxKey seals a handoff route's private JSON-pointer values while
	// they wait in the outbox (package seal); OutboxOldKeys only open
	// values sealed before a rotation.
	OutboxKey     string   `envconfig:"OUTBOX_KEY" desc:"key that seals a handoff route's private JSON-pointer values in the outbox, as ID:BASE64 (32 bytes, openssl rand -base64 32); required when a handoff route lists a private JSON pointer"`
	OutboxOldKeys []string `envconfig:"OUTBOX_OLD_KEYS" desc:"comma-separated earlier outbox keys (ID:BASE64), kept after a rotation only to open entries sealed with them"`

	// Broker authentication (package brokerauth). The trusted prefixes are
	// for SNS emulators only and stay empty in production.
	OIDCJWKSURL           string   `envconfig:"OIDC_JWKS_URL" default:"https://www.googleapis.com/oauth2/v3/certs" desc:"key set that signs Pub/Sub push tokens; a route's oidc.jwks_url overrides it"`
	SNSTrustedURLPrefixes []string `envconfig:"SNS_TRUSTED_URL_PREFIXES" desc:"emulators only: URL prefixes (each ending in /) trusted for SNS SigningCertURL and SubscribeURL besides SNS's own hosts"`
	// SNSConfirmationMaxAge bounds replays of a captured confirmation: SNS
	// retries a delivery for at most an hour, so an older copy is not SNS's.
	SNSConfirmationMaxAge time.Duration `envconfig:"SNS_CONFIRMATION_MAX_AGE" default:"1h" desc:"oldest SNS SubscriptionConfirmation, by its signed Timestamp, that is still confirmed; older copies are refused as replays (at most 72h, the confirmation token's life)"`

	// Background work beside the push path (package recovery).
	FenceTTL      time.Duration `envconfig:"FENCE_TTL" default:"24h" desc:"how long an operation's fencing counter stays in Redis after the last lease taken on it; at least twice the longest lease a route can hold"`
	LanesRefresh  time.Duration `envconfig:"LANES_REFRESH" default:"15s" desc:"how often the lane gauges are counted in the ledger; scrapes read the last count"`
	ReconcilePoll time.Duration `envconfig:"RECONCILE_POLL" default:"5s" desc:"how often each replica looks for indeterminate operations of lookup routes due for a check"`
	// The handoff relay (recovery.Relay), run only when a route is handoff.
	RelayPoll        time.Duration `envconfig:"RELAY_POLL" default:"500ms" desc:"how often each replica looks for due outbox entries of handoff routes when the last look found none; a handoff the replica commits itself wakes its relay at once"`
	RelayConcurrency int64         `envconfig:"RELAY_CONCURRENCY" default:"64" desc:"most outbox entries of one handoff route one replica relays at the same time (1 to 256); below it the relay adapts to the downstream, starting at 4"`
	PurgeInterval    time.Duration `envconfig:"PURGE_INTERVAL" default:"1m" desc:"pause between runs of the retention purge"`
	PurgeBatch       int64         `envconfig:"PURGE_BATCH" default:"500" desc:"operations one purge statement removes (1 to 10000); each batch is a transaction of its own"`
	// The operator console under /console/ on the admin listener (package
	// console); see checkConsole.
	ConsoleEnabled    bool          `envconfig:"CONSOLE_ENABLED" default:"true" desc:"serve the operator console under /console/ on the admin listener"`
	ConsoleAllowHTTP  bool          `envconfig:"CONSOLE_ALLOW_HTTP" default:"false" desc:"local development only: console cookies without the Secure flag, for a console reached over plain http"`
	ConsoleSessionTTL time.Duration `envconfig:"CONSOLE_SESSION_TTL" default:"8h" desc:"how long a console login lasts (at most 168h)"`
	ConsoleTraceURL   string        `envconfig:"CONSOLE_TRACE_URL" desc:"trace viewer link for the console, with {trace_id} where the id goes (e.g. https://grafana.example/explore?traceId={trace_id})"`

	LogLevel   slog.Level `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	LogFormat  string     `envconfig:"LOG_FORMAT" default:"json" desc:"json or text: the format of every line the process logs, the libraries' included"`
	InstanceID string     `envconfig:"INSTANCE_ID" desc:"name of this replica in leases and evidence (default: host name)"`
}

// maxPurgeBatch bounds one purge statement: past it a batch holds its locks
// and its transaction long enough for deliveries to notice.
const maxPurgeBatch = 10000

// maxRelayConcurrency bounds the relay's parallel calls per replica: each
// holds a lease and a pool connection for its write, so beyond it a replica
// would starve its own push path.
const maxRelayConcurrency = 256

// maxConfirmationAge is how long an SNS confirmation token stays valid;
// a longer bound would only admit copies that cannot confirm anything.
const maxConfirmationAge = 72 * time.Hour

// maxBodyLimit is the largest MaxBodyBytes accepted: a 10 MB Pub/Sub message
// base64-encoded inside its envelope, with room to spare.
const maxBodyLimit = 32 << 20

// LoadSettings reads the process settings through getenv (os.Getenv when
// nil), applies defaults and validates what every subcommand needs. Serve
// additionally calls ValidateServe.
//
// envconfig defines the variables: their names, defaults and descriptions
// come from the struct tags, and envconfig lists them (envVars). envconfig
// itself only reads the process environment, so the values are looked up
// through getenv and parsed by Settings.set; that keeps run(ctx, getenv, ...)
// and parallel tests free of os.Setenv. An empty value counts as unset, so the
// default applies.
func LoadSettings(getenv func(string) string) (Settings, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	vars, err := envVars()
	if err != nil {
		return Settings{}, err
	}
	var s Settings
	var errs []error
	for _, v := range vars {
		raw := getenv(v.key)
		if raw == "" {
			raw = v.def
		}
		if raw == "" {
			continue
		}
		if err := s.set(v.key, raw); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", v.key, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Settings{}, err
	}
	if s.InstanceID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "ackgate-" + strconv.Itoa(os.Getpid())
		}
		s.InstanceID = host
	}
	if err := s.Validate(); err != nil {
		return Settings{}, err
	}
	return s, nil
}

// Validate checks the settings every subcommand relies on.
func (s Settings) Validate() error {
	var errs []error
	add := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s_%s: %s", EnvPrefix, key, fmt.Sprintf(format, a...)))
	}
	if err := checkDatabaseURL(s.DatabaseURL); err != nil {
		add("DATABASE_URL", "%v", err)
	}
	if _, err := s.RedisOptions(); err != nil {
		errs = append(errs, err)
	}
	if s.RedisMasterName != "" && len(s.RedisAddrs) == 0 {
		add("REDIS_MASTER_NAME", "needs GATEWAY_REDIS_ADDRS (the Sentinel addresses)")
	}
	if s.RedisCluster && len(s.RedisAddrs) == 0 {
		add("REDIS_CLUSTER", "needs GATEWAY_REDIS_ADDRS (the Cluster seed addresses)")
	}
	for _, a := range s.RedisAddrs {
		if err := checkHostPort(a, true); err != nil {
			add("REDIS_ADDRS", "%q: %v", a, err)
		}
	}
	if err := checkHostPort(s.ListenAddr, false); err != nil {
		add("LISTEN_ADDR", "%q: %v", s.ListenAddr, err)
	}
	if err := checkHostPort(s.AdminAddr, false); err != nil {
		add("ADMIN_ADDR", "%q: %v", s.AdminAddr, err)
	}
	if s.MaxBodyBytes <= 0 || s.MaxBodyBytes > maxBodyLimit {
		add("MAX_BODY_BYTES", "must be between 1 and %d, got %d", maxBodyLimit, s.MaxBodyBytes)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{
		{"READ_HEADER_TIMEOUT", s.ReadHeaderTimeout},
		{"READ_TIMEOUT", s.ReadTimeout},
		{"WRITE_TIMEOUT", s.WriteTimeout},
		{"IDLE_TIMEOUT", s.IdleTimeout},
		{"SHUTDOWN_TIMEOUT", s.ShutdownTimeout},
	} {
		if d.v <= 0 {
			add(d.key, "must be positive, got %s", d.v)
		}
	}
	if s.MaxInFlight < 0 || s.MaxInFlight > maxInFlightLimit {
		add("MAX_IN_FLIGHT", "must be between 0 (no bound) and %d, got %d", maxInFlightLimit, s.MaxInFlight)
	}
	if s.MaxBodyBytesInFlight != 0 && (s.MaxBodyBytesInFlight < s.MaxBodyBytes || s.MaxBodyBytesInFlight > maxMemoryLimit) {
		add("MAX_BODY_BYTES_IN_FLIGHT", "must be 0 (no bound) or from GATEWAY_MAX_BODY_BYTES (%d) to %s, got %d bytes", s.MaxBodyBytes, formatSize(maxMemoryLimit), s.MaxBodyBytesInFlight)
	}
	if s.AdmissionWait < 0 || s.AdmissionWait > maxAdmissionWait {
		add("ADMISSION_WAIT", "must be between 0 and %s, got %s", maxAdmissionWait, s.AdmissionWait)
	}
	if s.MemoryLimit != 0 && (s.MemoryLimit < minMemoryLimit || s.MemoryLimit > maxMemoryLimit) {
		add("MEMORY_LIMIT", "must be unset or from %s to %s, got %d bytes", formatSize(minMemoryLimit), formatSize(maxMemoryLimit), s.MemoryLimit)
	}
	if !(s.MemoryLimitRatio >= 0.5 && s.MemoryLimitRatio <= 1) {
		add("MEMORY_LIMIT_RATIO", "must be from 0.5 to 1, got %v", s.MemoryLimitRatio)
	}
	if s.MaxClockSkew <= 0 || s.MaxClockSkew > maxClockSkewLimit {
		add("MAX_CLOCK_SKEW", "must be positive and at most %s, got %s", maxClockSkewLimit, s.MaxClockSkew)
	}
	for _, d := range []struct {
		key       string
		v, lo, hi time.Duration
	}{
		{"FENCE_TTL", s.FenceTTL, time.Minute, 90 * 24 * time.Hour},
		{"LANES_REFRESH", s.LanesRefresh, time.Second, time.Hour},
		{"RECONCILE_POLL", s.ReconcilePoll, 100 * time.Millisecond, time.Hour},
		{"RELAY_POLL", s.RelayPoll, 10 * time.Millisecond, time.Minute},
		{"PURGE_INTERVAL", s.PurgeInterval, time.Second, 24 * time.Hour},
	} {
		if d.v < d.lo || d.v > d.hi {
			add(d.key, "must be from %s to %s, got %s", d.lo, d.hi, d.v)
		}
	}
	if s.RelayConcurrency < 1 || s.RelayConcurrency > maxRelayConcurrency {
		add("RELAY_CONCURRENCY", "must be from 1 to %d, got %d", maxRelayConcurrency, s.RelayConcurrency)
	}
	if s.PurgeBatch < 1 || s.PurgeBatch > maxPurgeBatch {
		add("PURGE_BATCH", "must be from 1 to %d, got %d", maxPurgeBatch, s.PurgeBatch)
	}
	if s.ReadHeaderTimeout > 0 && s.ReadTimeout > 0 && s.ReadHeaderTimeout > s.ReadTimeout {
		add("READ_HEADER_TIMEOUT", "%s is longer than GATEWAY_READ_TIMEOUT (%s)", s.ReadHeaderTimeout, s.ReadTimeout)
	}
	if err := checkHTTPURL(s.OIDCJWKSURL); err != nil {
		add("OIDC_JWKS_URL", "%v", err)
	}
	if s.SNSConfirmationMaxAge <= 0 || s.SNSConfirmationMaxAge > maxConfirmationAge {
		add("SNS_CONFIRMATION_MAX_AGE", "must be positive and at most %s, got %s", maxConfirmationAge, s.SNSConfirmationMaxAge)
	}
	for _, p := range s.SNSTrustedURLPrefixes {
		if err := brokerauth.CheckTrustedPrefix(p); err != nil {
			add("SNS_TRUSTED_URL_PREFIXES", "%v", err)
		}
	}
	errs = append(errs, s.checkConsole()...)
	if s.LogFormat != "json" && s.LogFormat != "text" {
		add("LOG_FORMAT", "must be json or text, got %q", s.LogFormat)
	}
	if _, err := s.OutboxKeyring(); err != nil {
		errs = append(errs, err)
	}
	if strings.TrimSpace(s.InstanceID) != s.InstanceID || len(s.InstanceID) > 128 {
		add("INSTANCE_ID", "must be at most 128 characters without surrounding spaces")
	}
	return errors.Join(errs...)
}

// ValidateServe checks what serve needs beyond Validate: a routes file, an
// admin token and two distinct listeners.
func (s Settings) ValidateServe() error {
	var errs []error
	if err := s.ValidateRoutesFile(); err != nil {
		errs = append(errs, err)
	}
	creds, err := s.AdminCredentials()
	switch {
	case err != nil:
		errs = append(errs, err)
	case creds.Len() == 0:
		errs = append(errs, fmt.Errorf("%s_ADMIN_TOKEN: required for serve, unless %s_ADMIN_TOKENS or %s_ADMIN_TOKENS_FILE names credentials", EnvPrefix, EnvPrefix, EnvPrefix))
	}
	switch {
	case s.MetricsToken == "":
	case len(s.MetricsToken) < MinAdminTokenLen:
		errs = append(errs, fmt.Errorf("%s_METRICS_TOKEN: must be at least %d characters", EnvPrefix, MinAdminTokenLen))
	case strings.TrimSpace(s.MetricsToken) != s.MetricsToken:
		errs = append(errs, fmt.Errorf("%s_METRICS_TOKEN: has leading or trailing white space", EnvPrefix))
	case err == nil && creds.Has(s.MetricsToken):
		errs = append(errs, fmt.Errorf("%s_METRICS_TOKEN: must differ from every admin token: it is meant for a scraper that may not read evidence", EnvPrefix))
	}
	if sameListener(s.ListenAddr, s.AdminAddr) {
		errs = append(errs, fmt.Errorf("%s_ADMIN_ADDR: must differ from GATEWAY_LISTEN_ADDR (%q): the admin API never shares the ingest listener", EnvPrefix, s.ListenAddr))
	}
	return errors.Join(errs...)
}

// AdminCredentials are the admin listener's named credentials:
// GATEWAY_ADMIN_TOKEN as the name admin, and those of GATEWAY_ADMIN_TOKENS
// and GATEWAY_ADMIN_TOKENS_FILE (read now). Errors name the variable and
// the entry, never a token.
func (s Settings) AdminCredentials() (*admincred.Set, error) {
	var entries []admincred.Entry
	var errs []error
	if s.AdminToken != "" {
		if err := admincred.CheckToken(s.AdminToken); err != nil {
			errs = append(errs, fmt.Errorf("%s_ADMIN_TOKEN: %w", EnvPrefix, err))
		}
		entries = append(entries, admincred.FromToken(admincred.AdminName, s.AdminToken))
	}
	if s.AdminTokens != "" {
		more, err := admincred.Parse(s.AdminTokens)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s_ADMIN_TOKENS: %w", EnvPrefix, err))
		}
		entries = append(entries, more...)
	}
	if s.AdminTokensFile != "" {
		text, err := os.ReadFile(s.AdminTokensFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s_ADMIN_TOKENS_FILE: %w", EnvPrefix, err))
		} else {
			more, err := admincred.Parse(string(text))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s_ADMIN_TOKENS_FILE %s: %w", EnvPrefix, s.AdminTokensFile, err))
			}
			entries = append(entries, more...)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	set, err := admincred.New(entries...)
	if err != nil {
		return nil, fmt.Errorf("%s_ADMIN_TOKEN, %s_ADMIN_TOKENS, %s_ADMIN_TOKENS_FILE: %w", EnvPrefix, EnvPrefix, EnvPrefix, err)
	}
	return set, nil
}

// ValidateRoutesFile checks that a routes file is named (serve, check-config).
func (s Settings) ValidateRoutesFile() error {
	if strings.TrimSpace(s.RoutesFile) == "" {
		return fmt.Errorf("%s_ROUTES_FILE: required", EnvPrefix)
	}
	return nil
}

// CheckRoutes cross-checks the settings against the loaded routes: a write
// timeout at or below a route's ack deadline would cut off answers the broker
// is still waiting for.
func (s Settings) CheckRoutes(routes []*gate.Route) error {
	var errs []error
	for _, r := range routes {
		if r.AckDeadline >= s.WriteTimeout {
			errs = append(errs, fmt.Errorf("%s_WRITE_TIMEOUT: %s does not exceed route %q's ack_deadline (%s)", EnvPrefix, s.WriteTimeout, r.Name, r.AckDeadline))
		}
	}
	return errors.Join(append(errs, s.CheckKeyHashSecret(routes), s.CheckFenceTTL(routes))...)
}

// interventionLease is the lease an operator's resolution or the
// reconciler holds beyond the route's effect timeout (gate/recovery.go).
const interventionLease = 30 * time.Second

// LongestLease is the longest a lease on one of routes' operations can be
// held: a delivery's ack deadline plus its renewals' cap, or the
// reconciler's lookup plus its margin, whichever is longer.
func LongestLease(routes []*gate.Route) time.Duration {
	var longest time.Duration
	for _, r := range routes {
		longest = max(longest, r.AckDeadline+r.Renewal.MaxExtension, r.Effect.Timeout+interventionLease)
	}
	return longest
}

// CheckFenceTTL refuses a fence TTL shorter than twice the longest lease:
// a counter must never expire while a lease taken under it may still be
// held, or the next Acquire would rebuild it from the ledger's floor, which
// the holder may not have written yet.
func (s Settings) CheckFenceTTL(routes []*gate.Route) error {
	if need := 2 * LongestLease(routes); s.FenceTTL < need {
		return fmt.Errorf("%s_FENCE_TTL: %s is shorter than twice the longest lease a route can hold (%s)", EnvPrefix, s.FenceTTL, need)
	}
	return nil
}

// CheckKeyHashSecret requires GATEWAY_KEY_HASH_SECRET, long enough, when a
// route keys on a private field: without it the key could only be stored
// in clear, which the route forbids.
func (s Settings) CheckKeyHashSecret(routes []*gate.Route) error {
	for _, r := range routes {
		if !r.Key.Hashed {
			continue
		}
		switch {
		case s.KeyHashSecret == "":
			return fmt.Errorf("%s_KEY_HASH_SECRET: required: route %q keys on private field %q, which is kept only as a keyed hash", EnvPrefix, r.Name, r.Key.Name)
		case len(s.KeyHashSecret) < MinKeyHashSecretLen:
			return fmt.Errorf("%s_KEY_HASH_SECRET: must be at least %d characters", EnvPrefix, MinKeyHashSecretLen)
		}
	}
	return nil
}

// OutboxKeyring is the keyring of GATEWAY_OUTBOX_KEY and
// GATEWAY_OUTBOX_OLD_KEYS, or nil when no key is set. Errors name the
// variable and never quote a secret.
func (s Settings) OutboxKeyring() (*seal.Keyring, error) {
	if s.OutboxKey == "" {
		if len(s.OutboxOldKeys) > 0 {
			return nil, fmt.Errorf("%s_OUTBOX_OLD_KEYS: set without %s_OUTBOX_KEY: old keys only open what a current key's predecessors sealed", EnvPrefix, EnvPrefix)
		}
		return nil, nil
	}
	current, err := seal.ParseKey(s.OutboxKey)
	if err != nil {
		return nil, fmt.Errorf("%s_OUTBOX_KEY: %w", EnvPrefix, err)
	}
	old := make([]seal.Key, 0, len(s.OutboxOldKeys))
	for i, raw := range s.OutboxOldKeys {
		k, err := seal.ParseKey(raw)
		if err != nil {
			return nil, fmt.Errorf("%s_OUTBOX_OLD_KEYS: item %d: %w", EnvPrefix, i+1, err)
		}
		old = append(old, k)
	}
	ring, err := seal.NewKeyring(current, old...)
	if err != nil {
		return nil, fmt.Errorf("%s_OUTBOX_KEY, %s_OUTBOX_OLD_KEYS: %w", EnvPrefix, EnvPrefix, err)
	}
	return ring, nil
}

// outboxKeyID is the current outbox key's id, for the settings' log line;
// "" when none (or when it does not parse, which Validate reports).
func (s Settings) outboxKeyID() string {
	k, err := seal.ParseKey(s.OutboxKey)
	if err != nil {
		return ""
	}
	return k.ID
}

// CheckOutboxKey requires GATEWAY_OUTBOX_KEY when a handoff route lists a
// private JSON pointer: its value would otherwise wait in the outbox in
// clear.
func (s Settings) CheckOutboxKey(routes []*gate.Route) error {
	for _, r := range routes {
		if r.Shape != gate.ShapeHandoff {
			continue
		}
		for _, p := range r.Private {
			if strings.HasPrefix(p, "/") && s.OutboxKey == "" {
				return fmt.Errorf("%s_OUTBOX_KEY: required: handoff route %q lists the private JSON pointer %s, which the outbox keeps only sealed", EnvPrefix, r.Name, p)
			}
		}
	}
	return nil
}

// RedisOptions builds the go-redis options for a standalone server (from
// RedisURL), Sentinel (RedisAddrs + RedisMasterName) or Cluster (several
// RedisAddrs, or RedisCluster).
func (s Settings) RedisOptions() (*redis.UniversalOptions, error) {
	o, err := redis.ParseURL(s.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("%s_REDIS_URL: %v", EnvPrefix, redactErr(err, s.RedisURL))
	}
	u := &redis.UniversalOptions{
		Addrs:                 []string{o.Addr},
		ClientName:            o.ClientName,
		DB:                    o.DB,
		Protocol:              o.Protocol,
		Username:              o.Username,
		Password:              o.Password,
		MaxRetries:            o.MaxRetries,
		MinRetryBackoff:       o.MinRetryBackoff,
		MaxRetryBackoff:       o.MaxRetryBackoff,
		DialTimeout:           o.DialTimeout,
		ReadTimeout:           o.ReadTimeout,
		WriteTimeout:          o.WriteTimeout,
		ContextTimeoutEnabled: o.ContextTimeoutEnabled,
		PoolFIFO:              o.PoolFIFO,
		PoolSize:              o.PoolSize,
		PoolTimeout:           o.PoolTimeout,
		MinIdleConns:          o.MinIdleConns,
		MaxIdleConns:          o.MaxIdleConns,
		MaxActiveConns:        o.MaxActiveConns,
		ConnMaxIdleTime:       o.ConnMaxIdleTime,
		ConnMaxLifetime:       o.ConnMaxLifetime,
		TLSConfig:             o.TLSConfig,
		// go-redis would otherwise open every connection with commands that
		// many servers refuse, each refusal an error span in the trace of
		// whatever delivery opened the connection: CLIENT MAINT_NOTIFICATIONS
		// (its "auto" mode), which only Redis Enterprise and Redis Cloud
		// answer, and CLIENT SETINFO, which servers before Redis 7.2 do not
		// know. The gateway needs neither: a connection lost to a maintenance
		// window fails its delivery with a nack that the broker redelivers,
		// and a connection is named by the URL's client_name, not by the
		// library's identity.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		DisableIdentity:          true,
	}
	if len(s.RedisAddrs) > 0 {
		u.Addrs = append([]string(nil), s.RedisAddrs...)
		u.MasterName = s.RedisMasterName
		u.SentinelPassword = s.RedisSentinelPassword
		u.IsClusterMode = s.RedisCluster
		cluster := s.RedisMasterName == "" && (len(s.RedisAddrs) > 1 || s.RedisCluster)
		if cluster && u.DB != 0 {
			return nil, fmt.Errorf("%s_REDIS_URL: database %d selected, but Redis Cluster only has database 0", EnvPrefix, u.DB)
		}
	}
	return u, nil
}

// LogValue keeps secrets out of logs: passwords in URLs and the admin token
// are redacted.
func (s Settings) LogValue() slog.Value {
	token := ""
	if s.AdminToken != "" {
		token = "[redacted]"
	}
	return slog.GroupValue(
		slog.String("database_url", redactURL(s.DatabaseURL)),
		slog.String("redis_url", redactURL(s.RedisURL)),
		slog.Any("redis_addrs", s.RedisAddrs),
		slog.String("redis_master_name", s.RedisMasterName),
		slog.Bool("redis_cluster", s.RedisCluster),
		slog.String("routes_file", s.RoutesFile),
		slog.String("listen_addr", s.ListenAddr),
		slog.String("admin_addr", s.AdminAddr),
		slog.String("admin_token", token),
		slog.Bool("metrics_token_set", s.MetricsToken != ""),
		slog.Bool("admin_tokens_set", s.AdminTokens != ""),
		slog.String("admin_tokens_file", s.AdminTokensFile),
		slog.Int64("max_body_bytes", s.MaxBodyBytes),
		slog.Duration("read_header_timeout", s.ReadHeaderTimeout),
		slog.Duration("read_timeout", s.ReadTimeout),
		slog.Duration("write_timeout", s.WriteTimeout),
		slog.Duration("idle_timeout", s.IdleTimeout),
		slog.Duration("shutdown_timeout", s.ShutdownTimeout),
		slog.Duration("max_clock_skew", s.MaxClockSkew),
		slog.Int("max_in_flight", s.MaxInFlight),
		slog.Int64("max_body_bytes_in_flight", s.MaxBodyBytesInFlight),
		slog.Duration("admission_wait", s.AdmissionWait),
		slog.Int64("memory_limit", s.MemoryLimit),
		slog.Float64("memory_limit_ratio", s.MemoryLimitRatio),
		slog.Bool("key_hash_secret_set", s.KeyHashSecret != ""),
		slog.String("outbox_key_id", s.outboxKeyID()),
		slog.Int("outbox_old_keys", len(s.OutboxOldKeys)),
		slog.String("oidc_jwks_url", s.OIDCJWKSURL),
		slog.Any("sns_trusted_url_prefixes", s.SNSTrustedURLPrefixes),
		slog.Duration("sns_confirmation_max_age", s.SNSConfirmationMaxAge),
		slog.Duration("fence_ttl", s.FenceTTL),
		slog.Duration("lanes_refresh", s.LanesRefresh),
		slog.Duration("reconcile_poll", s.ReconcilePoll),
		slog.Duration("relay_poll", s.RelayPoll),
		slog.Int64("relay_concurrency", s.RelayConcurrency),
		slog.Duration("purge_interval", s.PurgeInterval),
		slog.Int64("purge_batch", s.PurgeBatch),
		slog.Bool("console_enabled", s.ConsoleEnabled),
		slog.Bool("console_allow_http", s.ConsoleAllowHTTP),
		slog.Duration("console_session_ttl", s.ConsoleSessionTTL),
		slog.String("console_trace_url", s.ConsoleTraceURL),
		slog.String("log_level", s.LogLevel.String()),
		slog.String("log_format", s.LogFormat),
		slog.String("instance_id", s.InstanceID),
	)
}

// Usage writes a table of every GATEWAY_* variable, its type, default and
// meaning, for `gateway help` or a startup error.
func Usage(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 1, 0, 3, ' ', 0)
	if err := envconfig.Usagef(EnvPrefix, &Settings{}, tw, envconfig.DefaultTableFormat); err != nil {
		return err
	}
	return tw.Flush()
}

// envVar is one variable as envconfig names it, with its default.
type envVar struct{ key, def string }

// envVarsFormat has envconfig print each variable as KEY=default, one a line,
// with its own usage functions; a struct tag holds neither a newline nor, in
// a key, an equals sign.
const envVarsFormat = "{{range .}}{{usage_key .}}={{usage_default .}}\n{{end}}"

// envVars asks envconfig for the variables Settings defines, so that names
// and defaults cannot drift from what Usage prints.
func envVars() ([]envVar, error) {
	var b strings.Builder
	if err := envconfig.Usagef(EnvPrefix, &Settings{}, &b, envVarsFormat); err != nil {
		return nil, err
	}
	var vars []envVar
	for line := range strings.Lines(b.String()) {
		key, def, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "=")
		vars = append(vars, envVar{key: key, def: def})
	}
	return vars, nil
}

// errNoParser marks a variable that envconfig lists but set does not know: a
// field added to Settings without its case below.
var errNoParser = errors.New("config: no parser for this variable")

// set parses raw into the setting envconfig names key, with errors that say
// what was expected and never more of the value than the value itself.
func (s *Settings) set(key, raw string) error {
	var err error
	switch strings.TrimPrefix(key, EnvPrefix+"_") {
	case "DATABASE_URL":
		s.DatabaseURL = raw
	case "REDIS_URL":
		s.RedisURL = raw
	case "REDIS_ADDRS":
		s.RedisAddrs = parseList(raw)
	case "REDIS_MASTER_NAME":
		s.RedisMasterName = raw
	case "REDIS_SENTINEL_PASSWORD":
		s.RedisSentinelPassword = raw
	case "REDIS_CLUSTER":
		s.RedisCluster, err = parseBool(raw)
	case "ROUTES_FILE":
		s.RoutesFile = raw
	case "LISTEN_ADDR":
		s.ListenAddr = raw
	case "ADMIN_ADDR":
		s.AdminAddr = raw
	case "ADMIN_TOKEN":
		s.AdminToken = raw
	case "METRICS_TOKEN":
		s.MetricsToken = raw
	case "ADMIN_TOKENS":
		s.AdminTokens = raw
	case "ADMIN_TOKENS_FILE":
		s.AdminTokensFile = raw
	case "MAX_BODY_BYTES":
		s.MaxBodyBytes, err = parseInt(raw)
	case "READ_HEADER_TIMEOUT":
		s.ReadHeaderTimeout, err = parseDuration(raw)
	case "READ_TIMEOUT":
		s.ReadTimeout, err = parseDuration(raw)
	case "WRITE_TIMEOUT":
		s.WriteTimeout, err = parseDuration(raw)
	case "IDLE_TIMEOUT":
		s.IdleTimeout, err = parseDuration(raw)
	case "SNS_CONFIRMATION_MAX_AGE":
		s.SNSConfirmationMaxAge, err = parseDuration(raw)
	case "SHUTDOWN_TIMEOUT":
		s.ShutdownTimeout, err = parseDuration(raw)
	case "MAX_CLOCK_SKEW":
		s.MaxClockSkew, err = parseDuration(raw)
	case "MAX_IN_FLIGHT":
		var n int64
		n, err = parseInt(raw)
		s.MaxInFlight = int(min(max(n, -1), maxInFlightLimit+1))
	case "MAX_BODY_BYTES_IN_FLIGHT":
		s.MaxBodyBytesInFlight, err = parseSize(raw)
	case "ADMISSION_WAIT":
		s.AdmissionWait, err = parseDuration(raw)
	case "MEMORY_LIMIT":
		s.MemoryLimit, err = parseSize(raw)
	case "MEMORY_LIMIT_RATIO":
		s.MemoryLimitRatio, err = parseRatio(raw)
	case "KEY_HASH_SECRET":
		s.KeyHashSecret = raw
	case "OUTBOX_KEY":
		s.OutboxKey = raw
	case "OUTBOX_OLD_KEYS":
		s.OutboxOldKeys = parseList(raw)
	case "OIDC_JWKS_URL":
		s.OIDCJWKSURL = raw
	case "SNS_TRUSTED_URL_PREFIXES":
		s.SNSTrustedURLPrefixes = parseList(raw)
	case "FENCE_TTL":
		s.FenceTTL, err = parseDuration(raw)
	case "LANES_REFRESH":
		s.LanesRefresh, err = parseDuration(raw)
	case "RECONCILE_POLL":
		s.ReconcilePoll, err = parseDuration(raw)
	case "RELAY_POLL":
		s.RelayPoll, err = parseDuration(raw)
	case "RELAY_CONCURRENCY":
		s.RelayConcurrency, err = parseInt(raw)
	case "PURGE_INTERVAL":
		s.PurgeInterval, err = parseDuration(raw)
	case "PURGE_BATCH":
		s.PurgeBatch, err = parseInt(raw)
	case "CONSOLE_ENABLED":
		s.ConsoleEnabled, err = parseBool(raw)
	case "CONSOLE_ALLOW_HTTP":
		s.ConsoleAllowHTTP, err = parseBool(raw)
	case "CONSOLE_SESSION_TTL":
		s.ConsoleSessionTTL, err = parseDuration(raw)
	case "CONSOLE_TRACE_URL":
		s.ConsoleTraceURL = raw
	case "LOG_LEVEL":
		err = s.LogLevel.UnmarshalText([]byte(raw))
	case "LOG_FORMAT":
		s.LogFormat = raw
	case "INSTANCE_ID":
		s.InstanceID = raw
	default:
		return errNoParser
	}
	return err
}

func parseDuration(raw string) (time.Duration, error) {
	d, err := time.ParseDuration(raw)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration such as 5s or 2m", raw)
	}
	return d, nil
}

func parseBool(raw string) (bool, error) {
	b, err := strconv.ParseBool(raw)
	if err != nil {
		return false, fmt.Errorf("%q is not true or false", raw)
	}
	return b, nil
}

func parseInt(raw string) (int64, error) {
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not an integer", raw)
	}
	return n, nil
}

// sizeUnits are the suffixes parseSize takes: GOMEMLIMIT's, so that a value
// can move between the two unchanged.
var sizeUnits = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

// parseSize reads a byte count: digits, optionally with a B, KiB, MiB, GiB or
// TiB suffix, as Kubernetes's resourceFieldRef writes a limit (plain bytes)
// and as GOMEMLIMIT takes one.
func parseSize(raw string) (int64, error) {
	digits, shift := raw, uint(0)
	for _, u := range sizeUnits {
		if d, ok := strings.CutSuffix(raw, u.suffix); ok {
			digits, shift = d, u.shift
			break
		}
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("%q is not a size such as 512MiB, 1GiB or a number of bytes", raw)
	}
	return n << shift, nil
}

func formatSize(n int64) string {
	for _, u := range sizeUnits {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

func parseRatio(raw string) (float64, error) {
	f, err := strconv.ParseFloat(raw, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number such as 0.9", raw)
	}
	return f, nil
}

// uncountedReserve is the part of a memory limit the Go runtime's own
// accounting never sees: mostly the binary's pages the process has touched
// (its code and read-only data, about 25 MiB resident once it has served a
// while; docs/performance.md, "What bounds each figure"), then libc and
// thread stacks. A share of the limit alone does not leave it: 10% of 256Mi
// is 25.6 MiB, so a heap held at the soft limit put the process at the
// container's limit.
const uncountedReserve = 32 << 20

// SoftMemoryLimit is the limit serve gives the Go runtime
// (debug.SetMemoryLimit), or 0 when MemoryLimit is unset: MemoryLimitRatio of
// the limit, lowered where needed to leave uncountedReserve beside it, but
// never below half the limit (a smaller soft limit than that would have the
// collector running all the time, for memory the process cannot give back).
func (s Settings) SoftMemoryLimit() int64 {
	if s.MemoryLimit <= 0 {
		return 0
	}
	share := int64(float64(s.MemoryLimit) * s.MemoryLimitRatio)
	return min(share, max(s.MemoryLimit-uncountedReserve, s.MemoryLimit/2))
}

// parseList splits a comma-separated list. Spaces around items and empty
// items are dropped, so "a, b," is the list a, b.
func parseList(raw string) []string {
	var items []string
	for item := range strings.SplitSeq(raw, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}

func checkDatabaseURL(raw string) error {
	if raw == "" {
		return errors.New("required")
	}
	if !strings.Contains(raw, "://") {
		// key=value form ("host=... dbname=..."); pgx parses it at connect.
		if !strings.Contains(raw, "=") {
			return errors.New("must be a postgres:// URL or a key=value DSN")
		}
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a valid URL")
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return fmt.Errorf("scheme %q: must be postgres or postgresql", u.Scheme)
	}
	return nil
}

// checkHostPort accepts host:port with a numeric port; the host may be empty
// (all interfaces) unless needHost.
func checkHostPort(addr string, needHost bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("must be host:port")
	}
	if needHost && host == "" {
		return errors.New("host is missing")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return errors.New("port must be a number from 0 to 65535")
	}
	return nil
}

func sameListener(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || pa != pb || pa == "0" {
		return false
	}
	// An empty host binds every interface, so it collides with any host.
	return ha == hb || ha == "" || hb == ""
}

// redactURL hides the password of a URL; anything unparsable is hidden whole.
func redactURL(raw string) string {
	if raw == "" {
		return ""
	}
	if !strings.Contains(raw, "://") {
		if strings.Contains(raw, "password") {
			return "[redacted]"
		}
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "[redacted]"
	}
	return u.Redacted()
}

// redactErr keeps a URL's password out of an error message.
func redactErr(err error, raw string) error {
	u, perr := url.Parse(raw)
	if perr != nil || u.User == nil {
		return err
	}
	if p, ok := u.User.Password(); ok && p != "" {
		return errors.New(strings.ReplaceAll(err.Error(), p, "xxxxx"))
	}
	return err
}
