package redisstore

import (
	"encoding/json"
	"testing"

	"github.com/runbudget/runbudget/budget"
)

// TestStoredLimitsIsLayout1JSONWithTheLayoutFirst: the JSON this build
// stores is exactly what lib.lua's convert_layout makes of the JSON layout
// 1 (or 2, the same with its layout first) stored for the same limits, so a host of this build finds its own
// limits in a converted budget. Limits of memory alone are "{}" to layout
// 1 (memory is never stored).
func TestStoredLimitsIsLayout1JSONWithTheLayoutFirst(t *testing.T) {
	for _, l := range []budget.Limits{
		{},
		{RequestsPerSecond: 12.5, Burst: 3},
		{InFlight: map[budget.OpClass]int{budget.OpGet: 4, budget.OpPut: 2}, OpenBodies: 7},
	} {
		old, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		want := `{"layout":3}`
		if string(old) != "{}" {
			want = `{"layout":3,` + string(old[1:])
		}
		got, err := storedLimits(l)
		if err != nil || string(got) != want {
			t.Errorf("storedLimits(%+v) = %s, %v; want %s", l, got, err, want)
		}
	}
}
