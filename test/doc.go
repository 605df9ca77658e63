// Package test holds runbudget's integration, multi-process and fault tests
// against real redis-server processes. They run on Linux only: the fault
// scenarios freeze and resume processes with signals, cut networks with
// network namespaces (ip netns) and tie helper processes to the test's life
// with the parent-death signal, none of which other systems offer in the
// same form. Elsewhere this package builds and has no tests; the unit and
// conformance tests of the other packages run everywhere.
package test
