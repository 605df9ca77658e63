//go:build !linux

package childproc

import "os/exec"

// DieWithParent does nothing here: only Linux has a parent-death signal. A
// helper started by Start still exits when its stdin closes, which happens
// when this process dies; a child that does not read its stdin (a
// redis-server) may outlive a parent that crashed.
func DieWithParent(*exec.Cmd) {}
