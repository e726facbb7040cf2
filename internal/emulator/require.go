package emulator

import (
	"errors"
	"os"
	"testing"
)

// Require finds the emulator for a test. Where it is missing the test
// fails, saying how to install it, unless ACKGATE_ALLOW_NO_PUBSUB_EMULATOR
// is set: then it logs the same message loudly and reports false, and the
// caller returns without testing anything. That switch is for machines
// where the package cannot be had at all; a run that sets it has not
// tested the gateway against the emulator, and says so.
func Require(t testing.TB) (launcher string, ok bool) {
	t.Helper()
	launcher, err := Find()
	if err == nil {
		return launcher, true
	}
	if !errors.Is(err, ErrNotInstalled) || os.Getenv(AllowMissingEnv) == "" {
		t.Fatalf("%v\n(on a machine where the package cannot be installed, set %s=1 to let this test pass without running)", err, AllowMissingEnv)
	}
	t.Logf("!!!!!!!!!! NOT TESTED against the Pub/Sub emulator: %v (%s is set) !!!!!!!!!!", err, AllowMissingEnv)
	return "", false
}
