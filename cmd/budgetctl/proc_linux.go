package main

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill the worker when the demo process
// dies. Linux ties the signal to the thread that started the child, not the
// process, so workers also watch their stdin for EOF (--exit-on-stdin-eof).
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
