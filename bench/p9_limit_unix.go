//go:build unix

package main

import "syscall"

// p9FileLimit is how many files a worker process may hold open: the hard
// RLIMIT_NOFILE, since the Go runtime raises a process's soft limit to the
// hard one at start (Go 1.19 and later), in every worker too.
func p9FileLimit() int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Max > 1<<30 {
		return 0
	}
	return int(r.Max)
}
