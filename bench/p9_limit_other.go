//go:build !unix

package main

// p9FileLimit is 0 where the bench knows no per-process limit on open
// files: P9 then does not shrink its run for one.
func p9FileLimit() int { return 0 }
