package main

import (
	"os"
	"testing"
)

// TestMain lets the test binary stand in for loadgen when a run starts its
// forwarder or bare process (os.Executable is then this binary).
func TestMain(m *testing.M) {
	if serveForwarderIfAsked() || serveBareIfAsked() {
		return
	}
	os.Exit(m.Run())
}
