package brokerauth_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/ackgate/ackgate/brokerauth"
)

func TestSecretNeverPrints(t *testing.T) {
	t.Parallel()
	s := brokerauth.NewSecret("hunter2-very-secret")
	c := brokerauth.Credentials{VerificationToken: s, BasicUser: s, BasicPassword: s}
	j, _ := json.Marshal(c)
	var buf strings.Builder
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "c", c, "s", s)
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%v %+v %#v", c, c, s), string(j), buf.String()} {
		if strings.Contains(out, "hunter2") {
			t.Errorf("secret printed: %s", out)
		}
	}
}

func TestVerificationToken(t *testing.T) {
	t.Parallel()
	want := brokerauth.NewSecret("tok-123")
	if err := brokerauth.CheckVerificationToken(want, "tok-123"); err != nil {
		t.Fatal(err)
	}
	for _, got := range []string{"", "tok-12", "tok-1234", "TOK-123"} {
		if err := brokerauth.CheckVerificationToken(want, got); brokerauth.KindOf(err) != brokerauth.Unauthenticated {
			t.Errorf("token %q: %v", got, err)
		}
	}
	if err := brokerauth.CheckVerificationToken(brokerauth.NewSecret(""), ""); err == nil {
		t.Error("an unset secret matched the empty token")
	}
}

func TestBasic(t *testing.T) {
	t.Parallel()
	user, pass := brokerauth.NewSecret("sns"), brokerauth.NewSecret("p:ss")
	basic := func(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(s)) }
	if err := brokerauth.CheckBasic(user, pass, basic("sns:p:ss")); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"", "Bearer x", basic("sns:wrong"), basic("other:p:ss"), basic("snsp:ss"), "Basic !!!"} {
		if err := brokerauth.CheckBasic(user, pass, h); brokerauth.KindOf(err) != brokerauth.Unauthenticated {
			t.Errorf("%q: %v", h, err)
		}
	}
}
