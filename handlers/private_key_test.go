package handlers_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/internal/wiring"
	"github.com/ackgate/ackgate/telemetry"
)

const keyHashSecret = "key-hash-secret-0123456789abcdef0123"

// privateKeyRoutes key on a private attribute and on a private JSON pointer.
var privateKeyRoutes = routeYAML("byemail", "unsafe", "gateway",
	"    operation_key: {kind: attribute, name: email}\n    private: [email]\n") +
	routeYAML("bypayment", "unsafe", "gateway",
		"    operation_key: {kind: json_pointer, name: /payment/id}\n    private: [/payment/id]\n")

// wantHMAC is the keyed hash the ledger must keep for a private key.
func wantHMAC(key string) string {
	m := hmac.New(sha256.New, []byte(keyHashSecret))
	m.Write([]byte(key))
	return "hmac-sha256:" + hex.EncodeToString(m.Sum(nil))
}

// adminBody is the raw JSON the admin API answers for path.
func (e *env) adminBody(path string) string {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.admin.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return string(b)
}

// An operation key drawn from a field the route lists as private (a payment
// id, an email address) is kept only as its HMAC-SHA256 under
// GATEWAY_KEY_HASH_SECRET: in the operation's key and scope, in conflict
// reasons, in the admin API and in the logs. The clear value is never stored
// or shown; an operator who has it can still find the operation by it.
func TestPrivateKeyIsStoredAsKeyedHash(t *testing.T) {
	t.Parallel()
	const email, payment = "alice@example.com", "pay-4242-private"
	e := newEnvWith(t, false, privateKeyRoutes, map[string]string{"GATEWAY_KEY_HASH_SECRET": keyHashSecret})
	byEmail := msg{ID: "m-email", Data: `{"order":1}`, Attrs: map[string]string{"email": email}}
	byPayment := msg{ID: "m-payment", Data: `{"payment":{"id":"` + payment + `"},"amount":1}`}
	wantStatus(t, e.push("byemail", byEmail), http.StatusNoContent)
	wantStatus(t, e.push("bypayment", byPayment), http.StatusNoContent)
	// The same keys with other payloads: conflicts, whose reasons name the key.
	wantStatus(t, e.push("byemail", msg{ID: "m-email-2", Data: `{"order":2}`, Attrs: byEmail.Attrs}), http.StatusNoContent)
	wantStatus(t, e.push("bypayment", msg{ID: "m-payment-2", Data: `{"payment":{"id":"` + payment + `"},"amount":2}`}), http.StatusNoContent)

	for _, c := range []struct{ route, clear string }{{"byemail", email}, {"bypayment", payment}} {
		// The operation and its conflict record share the key.
		var list adminapi.OperationList
		if code := e.adminGet("/v1/operations?route="+c.route+"&key="+url.QueryEscape(c.clear), &list); code != http.StatusOK || len(list.Operations) != 2 {
			t.Fatalf("%s: by clear key: %d %+v", c.route, code, list)
		}
		for _, op := range list.Operations {
			if op.Key != wantHMAC(c.clear) || strings.Contains(op.ScopeKey, c.clear) {
				t.Errorf("%s: key %q, scope %q; want the keyed hash %q", c.route, op.Key, op.ScopeKey, wantHMAC(c.clear))
			}
		}
		if code := e.adminGet("/v1/operations?key="+url.QueryEscape(wantHMAC(c.clear)), &list); code != http.StatusOK || len(list.Operations) != 2 {
			t.Errorf("%s: by hashed key: %d %+v", c.route, code, list)
		}
		var rt struct {
			Key map[string]any `json:"operation_key"`
		}
		if e.adminGet("/v1/routes/"+c.route, &rt); rt.Key["hashed"] != true {
			t.Errorf("%s: contract %+v does not say the key is hashed", c.route, rt.Key)
		}
	}
	var stored int
	if err := e.pool.QueryRow(t.Context(), `
		SELECT count(*) FROM operations o
		WHERE o.key LIKE '%' || $1 || '%' OR o.scope_key LIKE '%' || $1 || '%' OR o.reason LIKE '%' || $1 || '%'
		   OR o.key LIKE '%' || $2 || '%' OR o.scope_key LIKE '%' || $2 || '%' OR o.reason LIKE '%' || $2 || '%'
		   OR EXISTS (SELECT 1 FROM transitions t WHERE t.operation_id = o.id AND (t.reason LIKE '%' || $1 || '%' OR t.reason LIKE '%' || $2 || '%'))
		   OR EXISTS (SELECT 1 FROM deliveries d WHERE d.operation_id = o.id AND (d.reason LIKE '%' || $1 || '%' OR d.reason LIKE '%' || $2 || '%'))`,
		email, payment).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("%d operations keep a private key in clear (%v)", stored, err)
	}
	var conflicts int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM operations WHERE conflict_of IS NOT NULL`).Scan(&conflicts); err != nil || conflicts != 2 {
		t.Fatalf("conflict records: %d (%v), want 2", conflicts, err)
	}

	shown := e.adminBody("/v1/operations") + e.adminBody("/v1/routes")
	var ids adminapi.OperationList
	e.adminGet("/v1/operations", &ids)
	for _, op := range ids.Operations {
		shown += e.adminBody("/v1/operations/" + op.ID)
	}
	logs := e.logs.String()
	for _, secret := range []string{email, payment, keyHashSecret} {
		if strings.Contains(shown, secret) {
			t.Errorf("the admin API shows %q", secret)
		}
		if strings.Contains(logs, secret) {
			t.Errorf("the logs carry %q", secret)
		}
	}
}

// A route that keys on a private field cannot start without the secret its
// keys are hashed with: check-config and serve refuse it (CheckRoutes), and
// so does the constructor both use.
func TestPrivateKeyNeedsTheSecret(t *testing.T) {
	t.Parallel()
	routes, err := config.ParseRoutes([]byte("routes:\n" + strings.ReplaceAll(privateKeyRoutes, "{{DOWN}}", "http://127.0.0.1:9")))
	if err != nil {
		t.Fatal(err)
	}
	settings := func(secret string) config.Settings {
		s, err := config.LoadSettings(func(k string) string {
			if k == "GATEWAY_KEY_HASH_SECRET" {
				return secret
			}
			return ""
		})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for secret, want := range map[string]string{"": `GATEWAY_KEY_HASH_SECRET: required: route "byemail" keys on private field "email"`, "short": "at least 32"} {
		if err := settings(secret).CheckRoutes(routes); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckRoutes with secret %q: %v, want %q", secret, err, want)
		}
		tel, err := telemetry.WithPrometheus(sdktrace.NewTracerProvider(), resource.Empty())
		if err != nil {
			t.Fatal(err)
		}
		if gw, err := wiring.New(t.Context(), wiring.Options{Settings: settings(secret), Routes: routes, Telemetry: tel}); err == nil {
			gw.Close()
			t.Errorf("wiring.New with secret %q: no error", secret)
		} else if !strings.Contains(err.Error(), "GATEWAY_KEY_HASH_SECRET") {
			t.Errorf("wiring.New with secret %q: %v", secret, err)
		}
	}
	if err := settings(keyHashSecret).CheckRoutes(routes); err != nil {
		t.Fatalf("CheckRoutes with the secret: %v", err)
	}
}
