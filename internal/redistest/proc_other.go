//go:build !linux

package redistest

import "syscall"

// sysProcAttr is empty where Pdeathsig does not exist: a crashed test binary
// may leave redis-server running there until the OS reaps it.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

// waitStopped has no portable way to observe a stopped process; SIGSTOP is
// usually effective by the time the next command reaches the server.
func waitStopped(int, <-chan struct{}) {}
