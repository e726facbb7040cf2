//go:build !linux

package soak

import "os/exec"

// setParentDeathSignal has no portable equivalent outside Linux; the soak's
// own cleanup stops its children there.
func setParentDeathSignal(*exec.Cmd) {}
