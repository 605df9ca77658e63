//go:build unix

package main

import "syscall"

// ownCPU is the CPU time this process has used so far, user and system,
// in nanoseconds, and how many times its threads gave up the CPU to wait
// (voluntary context switches: a thread parked in futex or epoll_wait,
// which the next event then has to wake). Zeros where they cannot be read.
func ownCPU() (cpu, waits int64) {
	var r syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r); err != nil {
		return 0, 0
	}
	return r.Utime.Nano() + r.Stime.Nano(), r.Nvcsw
}
