package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ackgate/ackgate/config"
)

// GATEWAY_SNS_CONFIRMATION_MAX_AGE bounds how old a subscription confirmation
// may be and still be confirmed: an hour by default (as long as SNS retries),
// never zero, and never beyond the confirmation token's three days.
func TestSNSConfirmationMaxAge(t *testing.T) {
	t.Parallel()
	s, err := config.LoadSettings(env(nil))
	if err != nil || s.SNSConfirmationMaxAge != time.Hour {
		t.Fatalf("default: %s, %v; want 1h", s.SNSConfirmationMaxAge, err)
	}
	s, err = config.LoadSettings(env(map[string]string{"GATEWAY_SNS_CONFIRMATION_MAX_AGE": "15m"}))
	if err != nil || s.SNSConfirmationMaxAge != 15*time.Minute {
		t.Fatalf("15m: %s, %v", s.SNSConfirmationMaxAge, err)
	}
	for _, bad := range []string{"0s", "-1m", "73h", "an hour"} {
		_, err := config.LoadSettings(env(map[string]string{"GATEWAY_SNS_CONFIRMATION_MAX_AGE": bad}))
		if err == nil || !strings.Contains(err.Error(), "GATEWAY_SNS_CONFIRMATION_MAX_AGE") {
			t.Errorf("%q: LoadSettings = %v, want an error naming the variable", bad, err)
		}
	}
	var usage strings.Builder
	if err := config.Usage(&usage); err != nil || !strings.Contains(usage.String(), "GATEWAY_SNS_CONFIRMATION_MAX_AGE") {
		t.Errorf("gateway help env does not list the setting (%v)", err)
	}
}
