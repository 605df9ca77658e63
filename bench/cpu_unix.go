//go:build unix

package main

import "syscall"

// ownCPU is the CPU time this process has used so far, user and system,
// in nanoseconds (0 where it cannot be read).
func ownCPU() int64 {
	var r syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r); err != nil {
		return 0
	}
	return r.Utime.Nano() + r.Stime.Nano()
}
