package soak

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal makes a child die with the soak, so an interrupted run
// leaves no gateway or server behind.
func setParentDeathSignal(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
