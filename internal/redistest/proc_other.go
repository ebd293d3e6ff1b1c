//go:build !linux

package redistest

import "os/exec"

// killWithParent does nothing outside Linux: Stop, test cleanup and the
// bench harness's signal handling kill the server.
func killWithParent(*exec.Cmd) {}
