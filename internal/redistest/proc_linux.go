package redistest

import (
	"os/exec"
	"syscall"
)

// killWithParent makes the kernel kill the server when the process that
// started it dies without running its cleanup (a panic on another
// goroutine, a test binary killed at its timeout, SIGKILL).
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
