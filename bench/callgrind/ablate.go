package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/luascripts"
)

// Ablation: what one helper of lib.lua costs a workload, all its calls
// together, without knowing how often it is called. The library is loaded
// again, under its own name and function names (FUNCTION LOAD REPLACE, so
// the store goes on calling it), in two variants: the helper behind a
// wrapper that calls it once, and behind one that calls it twice. The
// difference between the two is one more run of every call the workload
// makes to it, which is what the helper costs; the wrapper's own cost is
// in both and drops out. Doubling a call is harmless for the helpers worth
// asking about (they compute, or read and write the same thing again); a
// recursive helper cannot be asked about (its inner calls would miss the
// wrapper).
// Counts vary by about 1% between loads (waiter ids are random, and with
// them hashing and interning), so a difference below that says nothing.

// ablated returns src with helper f (a top-level "local function f(" of
// lib.lua) behind a wrapper that calls it calls times.
func ablated(src, f string, calls int) (string, error) {
	lines := strings.Split(src, "\n")
	def := "local function " + f + "("
	i := -1
	for k, l := range lines {
		if strings.HasPrefix(l, def) {
			i = k
			break
		}
	}
	if i < 0 {
		return "", fmt.Errorf("lib.lua has no top-level function %s", f)
	}
	j := i // the line of its end: its own, or the first "end" at column 0
	if !strings.HasSuffix(strings.TrimSpace(lines[i]), " end") {
		for j = i + 1; j < len(lines) && lines[j] != "end"; j++ {
		}
		if j == len(lines) {
			return "", fmt.Errorf("function %s has no end at column 0", f)
		}
	}
	inner := f + "__ablated"
	lines[i] = strings.Replace(lines[i], def, "local function "+inner+"(", 1)
	body := "return " + inner + "(...)"
	if calls == 2 {
		body = inner + "(...) " + body
	}
	wrapper := "local function " + f + "(...) " + body + " end"
	lines = append(lines[:j+1], append([]string{wrapper}, lines[j+1:]...)...)
	return strings.Join(lines, "\n"), nil
}

// ablate counts, for each helper, the instructions per operation of every
// workload that its doubling adds, and loads the library as it was again.
func ablate(ctx context.Context, c *redis.Client, helpers []string, workloads []workload,
	counted func(string, int, func() error) (float64, error)) error {
	_, src, _ := luascripts.Library()
	// Loaded back for whatever is counted after (today nothing calls the
	// library then); the server is this run's own and goes with it.
	defer c.FunctionLoadReplace(context.WithoutCancel(ctx), src)
	fmt.Println("ablation (instructions per operation a second call of every call of the helper adds):")
	for _, f := range helpers {
		var got [3][]float64 // by calls: counts per workload
		for _, calls := range []int{1, 2} {
			patched, err := ablated(src, f, calls)
			if err != nil {
				return err
			}
			if err := c.FunctionLoadReplace(ctx, patched).Err(); err != nil {
				return fmt.Errorf("%s: loading the library: %w", f, err)
			}
			for _, w := range workloads {
				// Warm-up: the library's caches start empty after a load.
				v, err := counted(fmt.Sprintf("%s-%s-%d", w.name, f, calls), 200, w.op)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", f, w.name, err)
				}
				got[calls] = append(got[calls], v)
			}
		}
		fmt.Printf("  %-14s", f)
		for k, w := range workloads {
			once, added := got[1][k], got[2][k]-got[1][k]
			fmt.Printf("  %s %+8.0f (%+.1f%%)", w.name, added, 100*added/once)
		}
		fmt.Println()
	}
	return nil
}

// workload is one operation counted by ablate.
type workload struct {
	name string
	op   func() error
}
