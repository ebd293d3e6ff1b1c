package main

import (
	"os/exec"
	"syscall"
)

// killWithParent makes the kernel kill the child if the harness dies
// without running its cleanup (a panic on another goroutine, SIGKILL).
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
