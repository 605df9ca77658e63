//go:build !linux

package main

import "os/exec"

// dieWithParent has no kernel support here; workers rely on their stdin
// closing when the demo dies (--exit-on-stdin-eof).
func dieWithParent(*exec.Cmd) {}
