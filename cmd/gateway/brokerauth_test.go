package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/internal/authtest"
	"github.com/ackgate/ackgate/internal/testenv"
)

const (
	cmdTopic    = "arn:aws:sns:us-east-1:123456789012:orders"
	cmdAudience = "https://gateway.test/v1/push/pubsub/orders"
	cmdAccount  = "push@project.iam.gserviceaccount.com"
)

func writeAuthRoutes(t *testing.T, downURL string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "routes.yaml")
	yaml := fmt.Sprintf(`routes:
  - name: orders
    broker: pubsub
    auth: oidc
    oidc:
      audience: %s
      service_account: %s
    verification_token_env: ORDERS_PUSH_TOKEN
    shape: unsafe
    effect:
      url: %s/effects
      evidence: status_only
  - name: sns-orders
    broker: sns
    auth: sns_signature
    sources: [%s]
    shape: unsafe
    effect:
      url: %s/effects
      evidence: status_only
`, cmdAudience, cmdAccount, downURL, cmdTopic, downURL)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// serve wires broker authentication from the settings and the environment:
// the OIDC key set URL, the emulator prefix, the route's token.
func TestServeAuthenticatesBrokers(t *testing.T) {
	t.Parallel()
	down := newDownstream(t)
	iss := authtest.NewIssuer(t)
	sns := authtest.NewSNS(t)
	env := newGatewayEnv(t, testenv.DatabaseURL(t), testenv.Redis(t), writeAuthRoutes(t, down.srv.URL))
	env["GATEWAY_OIDC_JWKS_URL"] = iss.JWKSURL()
	env["GATEWAY_SNS_TRUSTED_URL_PREFIXES"] = sns.Prefix()
	env["ORDERS_PUSH_TOKEN"] = "legacy-token-0123"
	env["GATEWAY_SNS_CONFIRMATION_MAX_AGE"] = "10m"
	ctx := context.Background()
	if err := run(ctx, []string{"migrate"}, env.get, io.Discard, io.Discard); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	var logs testenv.SyncBuffer
	go func() { done <- run(sctx, []string{"serve"}, env.get, io.Discard, &logs) }()
	addr := env["GATEWAY_LISTEN_ADDR"]
	waitReady(t, addr)

	push := func(query, bearer string) int {
		body, _ := json.Marshal(map[string]any{
			"message":      map[string]any{"data": base64.StdEncoding.EncodeToString([]byte("hello")), "messageId": "m-1"},
			"subscription": "projects/p/subscriptions/s",
		})
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/push/pubsub/orders"+query, bytes.NewReader(body))
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	tok := iss.Token(t, iss.Claims(cmdAudience, cmdAccount))
	if code := push("?token=legacy-token-0123", ""); code != http.StatusUnauthorized {
		t.Fatalf("push without a bearer token: %d", code)
	}
	if code := push("", tok); code != http.StatusUnauthorized {
		t.Fatalf("push without the verification token: %d", code)
	}
	if code := push("?token=legacy-token-0123", tok); code != http.StatusNoContent {
		t.Fatalf("authenticated push: %d", code)
	}

	postSNS := func(m *brokerauth.SNSMessage) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/push/sns/sns-orders", bytes.NewReader(authtest.Body(m)))
		req.Header.Set("X-Amz-Sns-Message-Type", m.Type)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	c := sns.Sign(sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, cmdTopic, "c-1"), "1")
	if code := postSNS(c); code != http.StatusNoContent || len(sns.Confirms()) != 1 {
		t.Fatalf("confirmation: %d, confirmed %v", code, sns.Confirms())
	}
	// Twenty minutes old: fresh by the default bound of an hour, too old by
	// the configured ten minutes.
	stale := sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, cmdTopic, "c-2")
	stale.Timestamp = time.Now().Add(-20 * time.Minute).UTC().Format("2006-01-02T15:04:05.000Z")
	if code := postSNS(sns.Sign(stale, "2")); code != http.StatusForbidden || len(sns.Confirms()) != 1 {
		t.Fatalf("stale confirmation: %d, confirmed %v", code, sns.Confirms())
	}
	n := sns.Sign(sns.Notification(cmdTopic, "n-1", "hello"), "2")
	if code := postSNS(n); code != http.StatusNoContent {
		t.Fatalf("notification: %d", code)
	}
	if got := down.calls.Load(); got != 2 {
		t.Fatalf("downstream called %d times, want 2", got)
	}
	cancel()
	if err := testenv.Receive(t, done, "serve did not return after its context was cancelled"); err != nil {
		t.Fatalf("serve returned %v", err)
	}
	for _, secret := range []string{"legacy-token-0123"} {
		if strings.Contains(logs.String(), secret) {
			t.Fatalf("a secret reached the logs")
		}
	}
	if !strings.Contains(logs.String(), "meant for emulators") {
		t.Fatalf("no warning about the trusted emulator prefix:\n%s", logs.String())
	}
}

// A route naming a variable that is not set stops serve before it listens.
func TestServeRefusesMissingSecrets(t *testing.T) {
	t.Parallel()
	env := newGatewayEnv(t, testenv.DatabaseURL(t), testenv.Redis(t), writeAuthRoutes(t, "http://127.0.0.1:1"))
	err := run(context.Background(), []string{"serve"}, env.get, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `route "orders": verification_token_env: environment variable ORDERS_PUSH_TOKEN is not set`) {
		t.Fatalf("serve = %v", err)
	}
}
