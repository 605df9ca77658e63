package main

import (
	"testing"

	"github.com/runbudget/runbudget/luascripts"
)

// TestAcquireCutsFollowTheScript: every statement -probes cuts the acquire
// script before is still in it, so a change to acquire.lua that drops or
// rewrites one fails here rather than in the middle of a callgrind run.
func TestAcquireCutsFollowTheScript(t *testing.T) {
	_, src, _ := luascripts.Library()
	cuts, err := acquireCuts(src)
	if err != nil {
		t.Fatal(err)
	}
	if len(cuts) < 2 {
		t.Fatalf("%d cuts; want the statements and the whole script", len(cuts))
	}
}
