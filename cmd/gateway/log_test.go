package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/ackgate/ackgate/internal/testenv"
)

// logLines checks that every line of out is one JSON object with a time,
// a level and a message, and returns them.
func logLines(t *testing.T, what, out string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for i, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if line == "" && out == "" {
			break
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("%s line %d is not JSON (%v): %q", what, i+1, err, line)
			continue
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := rec[k]; !ok {
				t.Errorf("%s line %d has no %q: %s", what, i+1, k, line)
			}
		}
		recs = append(recs, rec)
	}
	return recs
}

// A gateway process whose trace collector refuses every export, under
// GATEWAY_LOG_FORMAT=json: every line it writes, on stdout and stderr, is
// a JSON record, the OpenTelemetry SDK's export failures among them; and
// no Redis connection it opened sent a command the server refused (go-redis's
// maintenance notification handshake, which Redis 7 answers with ERR).
func TestServeWritesOneJSONStream(t *testing.T) {
	t.Parallel()
	bin := buildGateway(t)
	var exports atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		exports.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		http.Error(w, "this collector takes nothing", http.StatusBadRequest)
	}))
	t.Cleanup(collector.Close)
	down := newDownstream(t)
	redisAddr := testenv.Redis(t)
	env := newGatewayEnv(t, testenv.DatabaseURL(t), redisAddr, writeRoutes(t, down.srv.URL))
	env["GATEWAY_LOG_FORMAT"] = "json"
	env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.URL
	env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
	env["OTEL_BSP_SCHEDULE_DELAY"] = "50"
	mig := exec.Command(bin, "migrate")
	mig.Env = env.list()
	if out, err := mig.CombinedOutput(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}

	cmd := exec.Command(bin, "serve")
	cmd.Env = env.list()
	var stdout, stderr testenv.SyncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	waitReady(t, env["GATEWAY_LISTEN_ADDR"])
	for _, id := range []string{"log-1", "log-2", "log-3"} {
		if code := pushTo(t, env["GATEWAY_LISTEN_ADDR"], id); code != http.StatusNoContent {
			t.Fatalf("push %s: %d", id, code)
		}
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return exports.Load() > 0 && strings.Contains(stderr.String(), `"source":"opentelemetry"`)
	}, func() string {
		return fmt.Sprintf("no export failure logged after %d exports:\n%s", exports.Load(), stderr.String())
	})
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve after SIGINT: %v\n%s", err, stderr.String())
	}
	exited = true

	if out := stdout.String(); out != "" {
		t.Errorf("serve wrote to stdout besides its log: %q", out)
	}
	var exportFailure, serving bool
	for _, rec := range logLines(t, "stderr", stderr.String()) {
		switch {
		case rec["source"] == "opentelemetry" && rec["level"] == "ERROR":
			exportFailure = true
		case rec["msg"] == "gateway serving":
			serving = rec["ingest"] != nil && rec["admin"] != nil
		}
	}
	if !exportFailure || !serving {
		t.Errorf("want an ERROR record from source opentelemetry and a \"gateway serving\" record with both addresses:\n%s", stderr.String())
	}

	// This client must not add refusals of its own.
	rc := redis.NewClient(&redis.Options{Addr: redisAddr, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	defer rc.Close()
	stats, err := rc.Info(context.Background(), "errorstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stats, "errorstat_ERR") {
		t.Errorf("Redis refused commands of the gateway's connections:\n%s", stats)
	}
}

// A serve that cannot start says why in the same format as its log.
func TestServeFailureIsAJSONRecord(t *testing.T) {
	t.Parallel()
	bin := buildGateway(t)
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "GATEWAY_LOG_FORMAT=json", "GATEWAY_MAX_BODY_BYTES=-1",
		"GATEWAY_ROUTES_FILE="+writeRoutes(t, "http://127.0.0.1:1"), "GATEWAY_ADMIN_TOKEN=test-token-0123456789")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("serve with a bad setting: %v, want exit status 1", err)
	}
	recs := logLines(t, "stderr", stderr.String())
	if len(recs) != 1 || recs[0]["msg"] != "gateway stopped" || !strings.Contains(recs[0]["err"].(string), "MAX_BODY_BYTES") {
		t.Errorf("want one record \"gateway stopped\" naming the setting:\n%s", stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout: %q", stdout.String())
	}
}
