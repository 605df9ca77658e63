package budget_test

import (
	"errors"
	"math"
	"testing"

	"github.com/runbudget/runbudget/budget"
)

// FuzzLimitsNormalize: every Limits is either refused with ErrInvalidLimits
// or normalized into one whose every number is finite, non-negative and in
// range, which bounds something, and which normalizes to itself.
func FuzzLimitsNormalize(f *testing.F) {
	f.Add(100.0, 10, 8, 4, 2, 1, 16, int64(1<<20), "get")
	f.Add(math.NaN(), 0, 0, 0, 0, 0, 0, int64(0), "list")
	f.Add(math.Inf(1), 1, 1, 1, 1, 1, 1, int64(1), "head")
	f.Add(-1.0, -1, -1, -1, -1, -1, -1, int64(-1), "rename")
	f.Add(0.0, 5, 0, 0, 0, 0, 0, int64(0), "")
	f.Add(1e-300, 0, 0, 0, 0, 0, 0, int64(0), "copy_source_read")
	f.Add(2e9, 0, 0, 0, 0, 0, 0, int64(math.MaxInt64), "get")
	f.Fuzz(func(t *testing.T, rate float64, burst, list, head, get, csr, bodies int, mem int64, extra string) {
		in := budget.Limits{RequestsPerSecond: rate, Burst: burst, OpenBodies: bodies, MemoryBytes: mem,
			InFlight: map[budget.OpClass]int{budget.OpList: list, budget.OpHead: head, budget.OpGet: get, budget.OpCopySourceRead: csr}}
		if extra != "" {
			in.InFlight[budget.OpClass(extra)] = 1
		}
		out, err := in.Normalize()
		if err != nil {
			if !errors.Is(err, budget.ErrInvalidLimits) {
				t.Fatalf("error %v does not wrap ErrInvalidLimits", err)
			}
			return
		}
		r := out.RequestsPerSecond
		if math.IsNaN(r) || math.IsInf(r, 0) || r < 0 || r > 1e9 {
			t.Fatalf("accepted rate %v", r)
		}
		if out.Burst < 0 || (r > 0 && out.Burst < 1) || (r == 0 && out.Burst != 0) {
			t.Fatalf("burst %d with rate %v", out.Burst, r)
		}
		if out.OpenBodies < 0 || out.MemoryBytes < 0 {
			t.Fatalf("negative ceiling accepted: %+v", out)
		}
		for c, n := range out.InFlight {
			if c.Index() < 0 || n <= 0 {
				t.Fatalf("in-flight entry %q=%d survived", c, n)
			}
		}
		if r == 0 && len(out.InFlight) == 0 && out.OpenBodies == 0 && out.MemoryBytes == 0 {
			t.Fatalf("accepted limits that bound nothing: %+v", out)
		}
		again, err := out.Normalize()
		if err != nil || !again.Equal(out) {
			t.Fatalf("normalizing twice: %+v then %+v, %v", out, again, err)
		}
	})
}
