//go:build !linux

package main

import "os/exec"

// killWithParent is a no-op outside Linux: the harness kills the server on
// a normal exit and on SIGINT/SIGTERM.
func killWithParent(*exec.Cmd) {}
