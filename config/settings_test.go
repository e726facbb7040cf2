package config_test

import (
	"bytes"
	"encoding/base64"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/gate"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestSettingsDefaults(t *testing.T) {
	t.Parallel()
	s, err := config.LoadSettings(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	want := config.Settings{
		DatabaseURL:       "postgres://ackgate:ackgate@127.0.0.1:5432/ackgate?sslmode=disable",
		RedisURL:          "redis://127.0.0.1:6379/0",
		ListenAddr:        ":8080",
		AdminAddr:         ":8081",
		MaxBodyBytes:      1 << 20,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		ShutdownTimeout:   25 * time.Second,
		LogLevel:          slog.LevelInfo,
		InstanceID:        host,
	}
	if host == "" {
		want.InstanceID = s.InstanceID
	}
	if s.InstanceID == "" {
		t.Error("InstanceID is empty")
	}
	if !equalSettings(s, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", s, want)
	}
	// Defaults are enough for migrate, not for serve.
	err = s.ValidateServe()
	for _, w := range []string{"GATEWAY_ROUTES_FILE: required", "GATEWAY_ADMIN_TOKEN: required for serve"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("ValidateServe() = %v, want %q", err, w)
		}
	}
}

func equalSettings(a, b config.Settings) bool {
	return a.DatabaseURL == b.DatabaseURL && a.RedisURL == b.RedisURL && strings.Join(a.RedisAddrs, ",") == strings.Join(b.RedisAddrs, ",") &&
		a.RedisMasterName == b.RedisMasterName && a.RedisSentinelPassword == b.RedisSentinelPassword && a.RedisCluster == b.RedisCluster &&
		a.RoutesFile == b.RoutesFile && a.ListenAddr == b.ListenAddr && a.AdminAddr == b.AdminAddr && a.AdminToken == b.AdminToken &&
		a.MaxBodyBytes == b.MaxBodyBytes && a.ReadHeaderTimeout == b.ReadHeaderTimeout && a.ReadTimeout == b.ReadTimeout &&
		a.WriteTimeout == b.WriteTimeout && a.IdleTimeout == b.IdleTimeout && a.ShutdownTimeout == b.ShutdownTimeout &&
		a.LogLevel == b.LogLevel && a.InstanceID == b.InstanceID
}

func TestSettingsFromEnvironment(t *testing.T) {
	t.Parallel()
	s, err := config.LoadSettings(env(map[string]string{
		"GATEWAY_DATABASE_URL":            "postgresql://u:p@db:5432/x",
		"GATEWAY_REDIS_URL":               "redis://:pw@ignored:6379/0",
		"GATEWAY_REDIS_ADDRS":             "s1:26379, s2:26379,,",
		"GATEWAY_REDIS_MASTER_NAME":       "mymaster",
		"GATEWAY_REDIS_SENTINEL_PASSWORD": "spw",
		"GATEWAY_ROUTES_FILE":             "/etc/ackgate/routes.yaml",
		"GATEWAY_LISTEN_ADDR":             "0.0.0.0:9000",
		"GATEWAY_ADMIN_ADDR":              "127.0.0.1:9001",
		"GATEWAY_ADMIN_TOKEN":             "0123456789abcdef",
		"GATEWAY_MAX_BODY_BYTES":          "2097152",
		"GATEWAY_READ_HEADER_TIMEOUT":     "2s",
		"GATEWAY_READ_TIMEOUT":            "10s",
		"GATEWAY_WRITE_TIMEOUT":           "700s",
		"GATEWAY_IDLE_TIMEOUT":            "1m",
		"GATEWAY_SHUTDOWN_TIMEOUT":        "40s",
		"GATEWAY_LOG_LEVEL":               "debug",
		"GATEWAY_INSTANCE_ID":             "gw-1",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := config.Settings{
		DatabaseURL:           "postgresql://u:p@db:5432/x",
		RedisURL:              "redis://:pw@ignored:6379/0",
		RedisAddrs:            []string{"s1:26379", "s2:26379"},
		RedisMasterName:       "mymaster",
		RedisSentinelPassword: "spw",
		RoutesFile:            "/etc/ackgate/routes.yaml",
		ListenAddr:            "0.0.0.0:9000",
		AdminAddr:             "127.0.0.1:9001",
		AdminToken:            "0123456789abcdef",
		MaxBodyBytes:          2 << 20,
		ReadHeaderTimeout:     2 * time.Second,
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          700 * time.Second,
		IdleTimeout:           time.Minute,
		ShutdownTimeout:       40 * time.Second,
		LogLevel:              slog.LevelDebug,
		InstanceID:            "gw-1",
	}
	if !equalSettings(s, want) {
		t.Errorf("settings:\n got %+v\nwant %+v", s, want)
	}
	if err := s.ValidateServe(); err != nil {
		t.Errorf("ValidateServe: %v", err)
	}
}

// TestSettingsFromProcessEnvironment covers main's path: a nil getenv reads
// the process environment.
func TestSettingsFromProcessEnvironment(t *testing.T) {
	t.Setenv("GATEWAY_LISTEN_ADDR", ":18080")
	t.Setenv("GATEWAY_ADMIN_TOKEN", "from-the-process-env")
	s, err := config.LoadSettings(nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.ListenAddr != ":18080" || s.AdminToken != "from-the-process-env" || s.AdminAddr != ":8081" {
		t.Errorf("got %+v", s)
	}
}

func TestInvalidSettings(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"unparsable values", map[string]string{
			"GATEWAY_READ_TIMEOUT":   "30",
			"GATEWAY_MAX_BODY_BYTES": "1MB",
			"GATEWAY_LOG_LEVEL":      "loud",
			"GATEWAY_REDIS_CLUSTER":  "maybe",
		}, []string{
			`GATEWAY_READ_TIMEOUT: "30" is not a duration`,
			`GATEWAY_MAX_BODY_BYTES: "1MB" is not an integer`,
			`GATEWAY_LOG_LEVEL: `,
			`GATEWAY_REDIS_CLUSTER: "maybe" is not true or false`,
		}},
		{"out of range", map[string]string{
			"GATEWAY_WRITE_TIMEOUT":       "-1s",
			"GATEWAY_SHUTDOWN_TIMEOUT":    "0s",
			"GATEWAY_MAX_BODY_BYTES":      "0",
			"GATEWAY_READ_HEADER_TIMEOUT": "1m",
		}, []string{
			"GATEWAY_WRITE_TIMEOUT: must be positive",
			"GATEWAY_SHUTDOWN_TIMEOUT: must be positive",
			"GATEWAY_MAX_BODY_BYTES: must be between 1 and",
			"GATEWAY_READ_HEADER_TIMEOUT: 1m0s is longer than GATEWAY_READ_TIMEOUT",
		}},
		{"bad urls and addresses", map[string]string{
			"GATEWAY_DATABASE_URL": "mysql://u:p@h/db",
			"GATEWAY_REDIS_URL":    "http://h:1",
			"GATEWAY_LISTEN_ADDR":  "8080",
			"GATEWAY_ADMIN_ADDR":   "h:port",
			"GATEWAY_REDIS_ADDRS":  "a:1,b",
		}, []string{
			`GATEWAY_DATABASE_URL: scheme "mysql"`,
			"GATEWAY_REDIS_URL: ",
			`GATEWAY_LISTEN_ADDR: "8080": must be host:port`,
			`GATEWAY_ADMIN_ADDR: "h:port": port must be a number`,
			`GATEWAY_REDIS_ADDRS: "b": must be host:port`,
		}},
		{"sentinel without addresses", map[string]string{"GATEWAY_REDIS_MASTER_NAME": "m"},
			[]string{"GATEWAY_REDIS_MASTER_NAME: needs GATEWAY_REDIS_ADDRS"}},
		{"cluster with a database", map[string]string{
			"GATEWAY_REDIS_URL":   "redis://h:6379/3",
			"GATEWAY_REDIS_ADDRS": "a:7000,b:7000",
		}, []string{"GATEWAY_REDIS_URL: database 3 selected, but Redis Cluster only has database 0"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := config.LoadSettings(env(tc.env))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error:\n%v\nmissing %q", err, w)
				}
			}
		})
	}
}

func TestRedisURLPasswordNotInErrors(t *testing.T) {
	t.Parallel()
	_, err := config.LoadSettings(env(map[string]string{"GATEWAY_REDIS_URL": "redis://:s3cret-pw@h:6379/notanumber"}))
	if err == nil {
		t.Fatal("no error")
	}
	if strings.Contains(err.Error(), "s3cret-pw") {
		t.Errorf("error leaks the password: %v", err)
	}
}

func TestValidateServe(t *testing.T) {
	t.Parallel()
	base := map[string]string{"GATEWAY_ROUTES_FILE": "routes.yaml", "GATEWAY_ADMIN_TOKEN": "0123456789abcdef"}
	cases := []struct {
		name string
		set  map[string]string
		want string
	}{
		{"short token", map[string]string{"GATEWAY_ADMIN_TOKEN": "short"}, "GATEWAY_ADMIN_TOKEN: must be at least 16 characters"},
		{"padded token", map[string]string{"GATEWAY_ADMIN_TOKEN": " 0123456789abcdef"}, "GATEWAY_ADMIN_TOKEN: has leading or trailing white space"},
		{"same listener", map[string]string{"GATEWAY_ADMIN_ADDR": ":8080"}, "GATEWAY_ADMIN_ADDR: must differ from GATEWAY_LISTEN_ADDR"},
		{"overlapping listener", map[string]string{"GATEWAY_ADMIN_ADDR": "127.0.0.1:8080"}, "GATEWAY_ADMIN_ADDR: must differ"},
		{"short metrics token", map[string]string{"GATEWAY_METRICS_TOKEN": "short"}, "GATEWAY_METRICS_TOKEN: must be at least 16 characters"},
		{"metrics token is the admin token", map[string]string{"GATEWAY_METRICS_TOKEN": "0123456789abcdef"}, "GATEWAY_METRICS_TOKEN: must differ from every admin token"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := map[string]string{}
			for k, v := range base {
				m[k] = v
			}
			for k, v := range tc.set {
				m[k] = v
			}
			s, err := config.LoadSettings(env(m))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.ValidateServe(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ValidateServe() = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestRedisOptions(t *testing.T) {
	t.Parallel()
	load := func(m map[string]string) config.Settings {
		t.Helper()
		s, err := config.LoadSettings(env(m))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	o, err := load(nil).RedisOptions()
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Addrs) != 1 || o.Addrs[0] != "127.0.0.1:6379" || o.DB != 0 || o.MasterName != "" || o.IsClusterMode {
		t.Errorf("standalone: %+v", o)
	}
	quiet(t, "standalone", o)

	o, err = load(map[string]string{
		"GATEWAY_REDIS_URL":               "rediss://user:pw@ignored:6379/2",
		"GATEWAY_REDIS_ADDRS":             "s1:26379,s2:26379",
		"GATEWAY_REDIS_MASTER_NAME":       "mymaster",
		"GATEWAY_REDIS_SENTINEL_PASSWORD": "spw",
	}).RedisOptions()
	if err != nil {
		t.Fatal(err)
	}
	if o.MasterName != "mymaster" || len(o.Addrs) != 2 || o.Username != "user" || o.Password != "pw" ||
		o.SentinelPassword != "spw" || o.DB != 2 || o.TLSConfig == nil {
		t.Errorf("sentinel: %+v", o)
	}
	quiet(t, "sentinel", o)

	o, err = load(map[string]string{"GATEWAY_REDIS_ADDRS": "c1:7000", "GATEWAY_REDIS_CLUSTER": "true"}).RedisOptions()
	if err != nil {
		t.Fatal(err)
	}
	if !o.IsClusterMode || len(o.Addrs) != 1 || o.Addrs[0] != "c1:7000" {
		t.Errorf("cluster: %+v", o)
	}
	quiet(t, "cluster", o)
	if co := o.Cluster(); co.MaintNotificationsConfig == nil || co.MaintNotificationsConfig.Mode != maintnotifications.ModeDisabled {
		t.Errorf("cluster: the cluster client's options lost the disabled maintenance notifications")
	}
}

// quiet checks that the options open a connection with nothing but the
// commands every Redis answers: the handshakes go-redis adds by default
// (maintenance notifications, client identity) are refused by many
// servers, and each refusal is an error span in some delivery's trace.
func quiet(t *testing.T, what string, o *redis.UniversalOptions) {
	t.Helper()
	if m := o.MaintNotificationsConfig; m == nil || m.Mode != maintnotifications.ModeDisabled {
		t.Errorf("%s: maintenance notifications are not disabled: %+v", what, m)
	}
	if !o.DisableIdentity {
		t.Errorf("%s: CLIENT SETINFO is sent on every new connection", what)
	}
}

func TestSettingsLogValueRedactsSecrets(t *testing.T) {
	t.Parallel()
	s, err := config.LoadSettings(env(map[string]string{
		"GATEWAY_DATABASE_URL":    "postgres://ackgate:db-secret@db/ackgate",
		"GATEWAY_REDIS_URL":       "redis://:redis-secret@r:6379/0",
		"GATEWAY_ADMIN_TOKEN":     "admin-secret-0123456789",
		"GATEWAY_KEY_HASH_SECRET": "key-hash-secret-0123456789abcdef0123",
	}))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("settings", "settings", s)
	out := buf.String()
	for _, secret := range []string{"db-secret", "redis-secret", "admin-secret", "key-hash-secret"} {
		if strings.Contains(out, secret) {
			t.Errorf("log output contains %q: %s", secret, out)
		}
	}
	if !strings.Contains(out, `"listen_addr":":8080"`) {
		t.Errorf("log output lacks the settings: %s", out)
	}
}

func TestUsageListsEveryVariable(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := config.Usage(&buf); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{
		"GATEWAY_DATABASE_URL", "GATEWAY_REDIS_URL", "GATEWAY_REDIS_ADDRS", "GATEWAY_REDIS_MASTER_NAME",
		"GATEWAY_ROUTES_FILE", "GATEWAY_LISTEN_ADDR", "GATEWAY_ADMIN_ADDR", "GATEWAY_ADMIN_TOKEN",
		"GATEWAY_MAX_BODY_BYTES", "GATEWAY_WRITE_TIMEOUT", "GATEWAY_SHUTDOWN_TIMEOUT", "GATEWAY_LOG_LEVEL",
		"GATEWAY_INSTANCE_ID", "GATEWAY_MAX_CLOCK_SKEW", "GATEWAY_KEY_HASH_SECRET",
		"GATEWAY_MAX_IN_FLIGHT", "GATEWAY_ADMISSION_WAIT", "GATEWAY_MEMORY_LIMIT", "GATEWAY_MEMORY_LIMIT_RATIO",
		"GATEWAY_MAX_BODY_BYTES_IN_FLIGHT",
	} {
		if !strings.Contains(buf.String(), v) {
			t.Errorf("usage lacks %s:\n%s", v, buf.String())
		}
	}
}

func TestCheckRoutesAgainstWriteTimeout(t *testing.T) {
	t.Parallel()
	s, err := config.LoadSettings(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	routes := []*gate.Route{{Name: "fast", AckDeadline: 10 * time.Second}, {Name: "slow", AckDeadline: 600 * time.Second}}
	err = s.CheckRoutes(routes)
	if err == nil || !strings.Contains(err.Error(), `route "slow"`) || strings.Contains(err.Error(), `"fast"`) {
		t.Errorf("CheckRoutes = %v, want an error about route slow only", err)
	}
}

func TestMaxClockSkew(t *testing.T) {
	t.Parallel()
	s, err := config.LoadSettings(env(nil))
	if err != nil || s.MaxClockSkew != 5*time.Minute {
		t.Fatalf("default: %v, %v; want 5m", s.MaxClockSkew, err)
	}
	s, err = config.LoadSettings(env(map[string]string{"GATEWAY_MAX_CLOCK_SKEW": "90s"}))
	if err != nil || s.MaxClockSkew != 90*time.Second {
		t.Fatalf("90s: %v, %v", s.MaxClockSkew, err)
	}
	for _, v := range []string{"0s", "-1m", "25h"} {
		_, err := config.LoadSettings(env(map[string]string{"GATEWAY_MAX_CLOCK_SKEW": v}))
		if err == nil || !strings.Contains(err.Error(), "GATEWAY_MAX_CLOCK_SKEW: must be positive and at most 24h") {
			t.Errorf("%s: %v", v, err)
		}
	}
}

// The background work's settings: defaults, parsing, bounds, and the fence
// TTL held against the longest lease the routes can hold.
func TestRecoverySettings(t *testing.T) {
	t.Parallel()
	s, err := config.LoadSettings(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if s.FenceTTL != 24*time.Hour || s.LanesRefresh != 15*time.Second || s.ReconcilePoll != 5*time.Second ||
		s.PurgeInterval != time.Minute || s.PurgeBatch != 500 || s.RelayPoll != 500*time.Millisecond || s.RelayConcurrency != 64 {
		t.Fatalf("defaults: %+v", s)
	}
	s, err = config.LoadSettings(env(map[string]string{"GATEWAY_RELAY_POLL": "50ms", "GATEWAY_RELAY_CONCURRENCY": "16"}))
	if err != nil || s.RelayPoll != 50*time.Millisecond || s.RelayConcurrency != 16 {
		t.Fatalf("relay settings: %+v, %v", s, err)
	}
	for v, raw := range map[string]string{"GATEWAY_RELAY_POLL": "0s", "GATEWAY_RELAY_CONCURRENCY": "0"} {
		want := map[string]string{"GATEWAY_RELAY_POLL": "GATEWAY_RELAY_POLL: must be from 10ms to 1m0s, got 0s",
			"GATEWAY_RELAY_CONCURRENCY": "GATEWAY_RELAY_CONCURRENCY: must be from 1 to 256, got 0"}[v]
		if _, err := config.LoadSettings(env(map[string]string{v: raw})); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s=%s: %v, want %q", v, raw, err, want)
		}
	}
	s, err = config.LoadSettings(env(map[string]string{"GATEWAY_FENCE_TTL": "2h", "GATEWAY_LANES_REFRESH": "30s",
		"GATEWAY_RECONCILE_POLL": "250ms", "GATEWAY_PURGE_INTERVAL": "10s", "GATEWAY_PURGE_BATCH": "1000"}))
	if err != nil || s.FenceTTL != 2*time.Hour || s.LanesRefresh != 30*time.Second || s.ReconcilePoll != 250*time.Millisecond ||
		s.PurgeInterval != 10*time.Second || s.PurgeBatch != 1000 {
		t.Fatalf("set: %+v, %v", s, err)
	}
	for v, want := range map[string]string{
		"GATEWAY_FENCE_TTL":      "GATEWAY_FENCE_TTL: must be from 1m0s to 2160h0m0s, got 10s",
		"GATEWAY_LANES_REFRESH":  "",
		"GATEWAY_PURGE_BATCH":    "GATEWAY_PURGE_BATCH: must be from 1 to 10000, got 0",
		"GATEWAY_RECONCILE_POLL": "GATEWAY_RECONCILE_POLL: must be from 100ms to 1h0m0s, got 0s",
	} {
		raw := "10s"
		switch v {
		case "GATEWAY_PURGE_BATCH":
			raw = "0"
		case "GATEWAY_RECONCILE_POLL":
			raw = "0s"
		case "GATEWAY_LANES_REFRESH":
			raw, want = "2h", "GATEWAY_LANES_REFRESH: must be from 1s to 1h0m0s, got 2h0m0s"
		}
		if _, err := config.LoadSettings(env(map[string]string{v: raw})); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s=%s: %v, want %q", v, raw, err, want)
		}
	}

	routes := []*gate.Route{
		{Name: "pubsub", AckDeadline: 600 * time.Second, Renewal: gate.Renewal{MaxExtension: 600 * time.Second}},
		{Name: "sns", AckDeadline: 15 * time.Second, Effect: gate.EffectSpec{Timeout: 5 * time.Second}},
	}
	if got := config.LongestLease(routes); got != 20*time.Minute {
		t.Fatalf("longest lease = %s, want 20m", got)
	}
	s.FenceTTL = 39 * time.Minute
	if err := s.CheckFenceTTL(routes); err == nil || !strings.Contains(err.Error(), "GATEWAY_FENCE_TTL: 39m0s is shorter than twice the longest lease a route can hold (40m0s)") {
		t.Errorf("short fence TTL: %v", err)
	}
	s.FenceTTL, s.WriteTimeout = 40*time.Minute, time.Hour
	if err := s.CheckRoutes(routes); err != nil {
		t.Errorf("fence TTL of twice the longest lease: %v", err)
	}
}

func TestAdmissionSettings(t *testing.T) {
	t.Parallel()
	s, err := config.LoadSettings(env(nil))
	if err != nil || s.MaxInFlight != 1000 || s.AdmissionWait != time.Second || s.MaxBodyBytesInFlight != 16<<20 {
		t.Fatalf("defaults: %d, %s, %d bytes, %v; want 1000, 1s and 16 MiB", s.MaxInFlight, s.AdmissionWait, s.MaxBodyBytesInFlight, err)
	}
	s, err = config.LoadSettings(env(map[string]string{"GATEWAY_MAX_IN_FLIGHT": "0", "GATEWAY_ADMISSION_WAIT": "0s",
		"GATEWAY_MAX_BODY_BYTES_IN_FLIGHT": "0"}))
	if err != nil || s.MaxInFlight != 0 || s.AdmissionWait != 0 || s.MaxBodyBytesInFlight != 0 {
		t.Fatalf("no bound, no wait: %d, %s, %d, %v", s.MaxInFlight, s.AdmissionWait, s.MaxBodyBytesInFlight, err)
	}
	s, err = config.LoadSettings(env(map[string]string{"GATEWAY_MAX_BODY_BYTES_IN_FLIGHT": "64MiB"}))
	if err != nil || s.MaxBodyBytesInFlight != 64<<20 {
		t.Fatalf("64MiB: %d, %v", s.MaxBodyBytesInFlight, err)
	}
	for k, v := range map[string]string{
		"GATEWAY_MAX_IN_FLIGHT":  "-1",
		"GATEWAY_ADMISSION_WAIT": "2s",
		// Less than one body of GATEWAY_MAX_BODY_BYTES (1 MiB).
		"GATEWAY_MAX_BODY_BYTES_IN_FLIGHT": "512KiB",
	} {
		_, err := config.LoadSettings(env(map[string]string{k: v}))
		if err == nil || !strings.Contains(err.Error(), k+": must be") {
			t.Errorf("%s=%s: %v", k, v, err)
		}
	}
	_, err = config.LoadSettings(env(map[string]string{"GATEWAY_ADMISSION_WAIT": "-1s"}))
	if err == nil || !strings.Contains(err.Error(), "GATEWAY_ADMISSION_WAIT: must be between 0 and 1s") {
		t.Errorf("negative wait: %v", err)
	}
}

func TestMemoryLimitSettings(t *testing.T) {
	t.Parallel()
	s, err := config.LoadSettings(env(nil))
	if err != nil || s.MemoryLimit != 0 || s.MemoryLimitRatio != 0.9 || s.SoftMemoryLimit() != 0 {
		t.Fatalf("defaults: %d, %v, soft %d, %v; want no limit and ratio 0.9", s.MemoryLimit, s.MemoryLimitRatio, s.SoftMemoryLimit(), err)
	}
	for raw, want := range map[string]int64{
		"268435456": 256 << 20, // a resourceFieldRef's plain bytes
		"256MiB":    256 << 20,
		"1GiB":      1 << 30,
		"65536KiB":  64 << 20,
		"33554432B": 32 << 20,
	} {
		s, err := config.LoadSettings(env(map[string]string{"GATEWAY_MEMORY_LIMIT": raw}))
		if err != nil || s.MemoryLimit != want {
			t.Errorf("GATEWAY_MEMORY_LIMIT=%s: %d, %v; want %d", raw, s.MemoryLimit, err, want)
		}
	}
	// The soft limit is the ratio's share of the limit, lowered to leave 32MiB
	// beside it for the binary's pages, but not below half the limit.
	for _, c := range []struct {
		limit, ratio string
		want         int64
	}{
		{"200MiB", "0.75", 150 << 20},     // the share leaves more than 32MiB
		{"256MiB", "0.9", 224 << 20},      // 230.4MiB would leave 25.6
		{"1GiB", "0.9", 1 << 30 * 9 / 10}, // 10% is far more than the reserve
		{"96MiB", "0.9", 64 << 20},        // 86.4MiB would leave 9.6
		{"56MiB", "0.9", 28 << 20},        // less the reserve is below half: half
		{"32MiB", "1", 16 << 20},          // the smallest limit
		{"64MiB", "0.5", 32 << 20},        // a share of one half stands
		{"300MiB", "1", (300 - 32) << 20}, // ratio 1 still leaves the reserve
	} {
		s, err := config.LoadSettings(env(map[string]string{"GATEWAY_MEMORY_LIMIT": c.limit, "GATEWAY_MEMORY_LIMIT_RATIO": c.ratio}))
		if err != nil || s.SoftMemoryLimit() != c.want {
			t.Errorf("%s at %s: soft limit %d, %v; want %d", c.limit, c.ratio, s.SoftMemoryLimit(), err, c.want)
		}
	}
	for _, tc := range []struct{ key, value, want string }{
		{"GATEWAY_MEMORY_LIMIT", "256M", `"256M" is not a size`},
		{"GATEWAY_MEMORY_LIMIT", "-1", `"-1" is not a size`},
		{"GATEWAY_MEMORY_LIMIT", "1.5GiB", `"1.5GiB" is not a size`},
		{"GATEWAY_MEMORY_LIMIT", "99999999999TiB", `is not a size`},
		{"GATEWAY_MEMORY_LIMIT", "16MiB", "GATEWAY_MEMORY_LIMIT: must be unset or from 32MiB to 1TiB, got 16777216 bytes"},
		{"GATEWAY_MEMORY_LIMIT", "2TiB", "GATEWAY_MEMORY_LIMIT: must be unset or from 32MiB to 1TiB"},
		{"GATEWAY_MEMORY_LIMIT_RATIO", "0.4", "GATEWAY_MEMORY_LIMIT_RATIO: must be from 0.5 to 1, got 0.4"},
		{"GATEWAY_MEMORY_LIMIT_RATIO", "1.1", "GATEWAY_MEMORY_LIMIT_RATIO: must be from 0.5 to 1"},
		{"GATEWAY_MEMORY_LIMIT_RATIO", "NaN", "GATEWAY_MEMORY_LIMIT_RATIO: must be from 0.5 to 1"},
		{"GATEWAY_MEMORY_LIMIT_RATIO", "most", `"most" is not a number`},
	} {
		_, err := config.LoadSettings(env(map[string]string{tc.key: tc.value}))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%s: %v; want an error containing %q", tc.key, tc.value, err, tc.want)
		}
	}
}

// GATEWAY_OUTBOX_KEY seals with a named key; GATEWAY_OUTBOX_OLD_KEYS only
// open. Errors name the variable and never quote a secret.
func TestOutboxKeySettings(t *testing.T) {
	t.Parallel()
	k1 := "2026-01:" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	k2 := "2026-07:" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{2}, 32))
	s, err := config.LoadSettings(env(map[string]string{"GATEWAY_OUTBOX_KEY": k2, "GATEWAY_OUTBOX_OLD_KEYS": k1}))
	if err != nil {
		t.Fatal(err)
	}
	ring, err := s.OutboxKeyring()
	if err != nil || ring == nil || ring.CurrentID() != "2026-07" {
		t.Fatalf("keyring %v, %v", ring, err)
	}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("settings", "settings", s)
	if strings.Contains(logged.String(), strings.SplitN(k2, ":", 2)[1]) || !strings.Contains(logged.String(), `"outbox_key_id":"2026-07"`) {
		t.Errorf("settings log line: %s", logged.String())
	}
	none, err := config.LoadSettings(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if ring, err := none.OutboxKeyring(); ring != nil || err != nil {
		t.Fatalf("no key: %v, %v", ring, err)
	}
	secret := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 31))
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"GATEWAY_OUTBOX_KEY": "k:" + secret}, "GATEWAY_OUTBOX_KEY: key \"k\": the secret must be 32 bytes"},
		{map[string]string{"GATEWAY_OUTBOX_KEY": secret}, "GATEWAY_OUTBOX_KEY: must be ID:BASE64"},
		{map[string]string{"GATEWAY_OUTBOX_OLD_KEYS": k1}, "GATEWAY_OUTBOX_OLD_KEYS: set without GATEWAY_OUTBOX_KEY"},
		{map[string]string{"GATEWAY_OUTBOX_KEY": k1, "GATEWAY_OUTBOX_OLD_KEYS": k2 + ",x:" + secret}, "GATEWAY_OUTBOX_OLD_KEYS: item 2:"},
		{map[string]string{"GATEWAY_OUTBOX_KEY": k1, "GATEWAY_OUTBOX_OLD_KEYS": k1}, "given twice"},
	} {
		_, err := config.LoadSettings(env(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), secret) {
			t.Errorf("%v: %v, want an error containing %q and no secret", tc.env, err, tc.want)
		}
	}
	routes := []*gate.Route{{Name: "relay", Shape: gate.ShapeHandoff, Private: []string{"token", "/card"}}}
	if err := none.CheckOutboxKey(routes); err == nil || !strings.Contains(err.Error(), `handoff route "relay" lists the private JSON pointer /card`) {
		t.Errorf("a handoff route with a private pointer and no key: %v", err)
	}
	if err := s.CheckOutboxKey(routes); err != nil {
		t.Errorf("with a key: %v", err)
	}
	if err := none.CheckOutboxKey([]*gate.Route{{Name: "r", Shape: gate.ShapeHandoff, Private: []string{"token"}}}); err != nil {
		t.Errorf("a private attribute only: %v", err)
	}
}

// Named admin credentials come from GATEWAY_ADMIN_TOKENS and a file, and
// GATEWAY_ADMIN_TOKEN is the credential admin; serve needs at least one.
// Errors never quote a token.
func TestAdminCredentialSettings(t *testing.T) {
	t.Parallel()
	file := t.TempDir() + "/tokens"
	if err := os.WriteFile(file, []byte("# on call\ncarol=carol-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := config.LoadSettings(env(map[string]string{
		"GATEWAY_ROUTES_FILE": "routes.yaml", "GATEWAY_ADMIN_TOKEN": "admin-token-0123456789",
		"GATEWAY_ADMIN_TOKENS": "alice=alice-token-0123456789,bob=bob-token-0123456789", "GATEWAY_ADMIN_TOKENS_FILE": file,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ValidateServe(); err != nil {
		t.Fatal(err)
	}
	creds, err := s.AdminCredentials()
	if err != nil {
		t.Fatal(err)
	}
	for token, name := range map[string]string{"admin-token-0123456789": "admin", "alice-token-0123456789": "alice", "carol-token-0123456789": "carol"} {
		if got, ok := creds.Match(token); !ok || got != name {
			t.Errorf("token of %s matched %q, %v", name, got, ok)
		}
	}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("settings", "settings", s)
	if strings.Contains(logged.String(), "token-0123456789") {
		t.Errorf("settings log line carries a token: %s", logged.String())
	}

	only, err := config.LoadSettings(env(map[string]string{"GATEWAY_ROUTES_FILE": "r.yaml", "GATEWAY_ADMIN_TOKENS": "alice=alice-token-0123456789"}))
	if err != nil {
		t.Fatal(err)
	}
	if err := only.ValidateServe(); err != nil {
		t.Fatalf("named credentials without GATEWAY_ADMIN_TOKEN: %v", err)
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "GATEWAY_ADMIN_TOKEN: required for serve, unless GATEWAY_ADMIN_TOKENS"},
		{map[string]string{"GATEWAY_ADMIN_TOKENS": "alice=tiny-secret"}, "GATEWAY_ADMIN_TOKENS: entry 1 (alice): the token must be at least 16"},
		{map[string]string{"GATEWAY_ADMIN_TOKEN": "admin-token-0123456789", "GATEWAY_ADMIN_TOKENS": "admin=other-token-0123456789"}, `credential "admin" is given twice`},
		{map[string]string{"GATEWAY_ADMIN_TOKENS_FILE": file + ".missing"}, "GATEWAY_ADMIN_TOKENS_FILE: open"},
		{map[string]string{"GATEWAY_ADMIN_TOKENS": "alice=alice-token-0123456789", "GATEWAY_METRICS_TOKEN": "alice-token-0123456789"}, "GATEWAY_METRICS_TOKEN: must differ from every admin token"},
	} {
		tc.env["GATEWAY_ROUTES_FILE"] = "r.yaml"
		s, err := config.LoadSettings(env(tc.env))
		if err != nil {
			t.Fatal(err)
		}
		err = s.ValidateServe()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "tiny-secret") {
			t.Errorf("%v: %v, want %q", tc.env, err, tc.want)
		}
	}
}
