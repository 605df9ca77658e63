//go:build linux && !faults

package test

// Without the faults tag each scenario runs its short version, part of the
// normal suite.
const long = false
