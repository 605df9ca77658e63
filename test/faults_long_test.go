//go:build linux && faults

package test

// With -tags faults each scenario runs its long version: more processes,
// more lanes, longer runs. See FAULTS.md.
const long = true
