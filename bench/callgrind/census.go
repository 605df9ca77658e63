package main

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/luascripts"
)

// Census: how many times a workload's scripts call each C function of the
// Lua runtime (redis.call, struct.pack, tonumber, string.find, ...). A C
// call costs the VM far more than one of its own instructions (lib.lua's
// split_encs says by how much), so the count of C calls per operation is
// where the scripts' own Lua time can be looked for, name by name, which
// neither the instruction total nor ablation (which knows only helpers of
// lib.lua) can say.
//
// The library is loaded again under its own name and function names, with
// a prelude that shadows each C function it calls with a local of the same
// name which counts, then calls the original. Every use in the library
// comes after the prelude, lexically, so every call is counted; iterators
// (ipairs, gmatch) are counted once per loop, not per step. A function
// rb_census, registered beside the others, returns the counts and clears
// them. Nothing is timed: the counts are the same on any machine.

// censusBase lists the global C functions shadowed, where the library
// names them; of the library tables (censusTables), every function the
// library names is.
var (
	censusBase = []string{"tonumber", "tostring", "type", "pcall", "unpack", "setmetatable", "getmetatable", "ipairs",
		"pairs", "select", "error", "rawget", "rawset", "next", "assert"}
	censusTables = []string{"string", "math", "table", "struct", "cjson", "cmsgpack", "bit", "redis"}
)

// censusSource returns src (the library's, shebang first) with the
// counting prelude after its shebang and rb_census at its end.
func censusSource(src string) (string, error) {
	shebang, rest, ok := strings.Cut(src, "\n")
	if !ok || !strings.HasPrefix(shebang, "#!lua") {
		return "", fmt.Errorf("the library does not start with a #!lua line")
	}
	var b strings.Builder
	b.WriteString(shebang + "\n")
	b.WriteString("local CENSUS = {}\n")
	// Each wrapper names the global it stands for only in its body, which
	// runs when it is called: a library's load may not touch some globals
	// (cjson, struct, unpack, ipairs) that its functions use at run time.
	// Inside a local's own initializer the name is still the global's.
	count := func(name string) string {
		return fmt.Sprintf("CENSUS['%s'] = (CENSUS['%s'] or 0) + 1", name, name)
	}
	// The tables first, then the base functions, under their own names.
	// No metatable: a load may not call setmetatable either, so a table
	// holds just the functions the library names.
	for _, lib := range censusTables {
		fs := map[string]bool{}
		for _, m := range regexp.MustCompile(`\b`+lib+`\.([A-Za-z_][A-Za-z0-9_]*)`).FindAllStringSubmatch(rest, -1) {
			fs[m[1]] = true
		}
		if len(fs) == 0 {
			continue
		}
		fmt.Fprintf(&b, "local %s = {", lib)
		for _, f := range slices.Sorted(maps.Keys(fs)) {
			fmt.Fprintf(&b, "%s = function(...) %s return %s.%s(...) end, ", f, count(lib+"."+f), lib, f)
		}
		b.WriteString("}\n")
	}
	for _, f := range censusBase {
		if regexp.MustCompile(`\b` + f + `\b`).MatchString(rest) {
			fmt.Fprintf(&b, "local %s = function(...) %s return %s(...) end\n", f, count(f), f)
		}
	}
	b.WriteString(rest)
	// Returned as name, count pairs, from the table it detaches first, so
	// that building the reply counts nothing that is returned.
	b.WriteString("\nredis.register_function('rb_census', function(KEYS, ARGV)\n" +
		"  local got = CENSUS\n" +
		"  CENSUS = {}\n" +
		"  local out = {}\n" +
		"  for k, v in next, got do out[#out + 1] = k; out[#out + 1] = v end\n" +
		"  return out\n" +
		"end)\n")
	return b.String(), nil
}

// censusCount is one C function's calls per operation.
type censusCount struct {
	name string
	per  float64
}

// census runs each workload n times on the counting library and prints its
// C calls per operation, most first, then loads the library as it was.
func census(ctx context.Context, c *redis.Client, n int, workloads []workload) error {
	fmt.Printf("C calls of the scripts per operation (%d operations each):\n", n)
	return censusCounts(ctx, c, n, workloads, func(w string, cs []censusCount) {
		total := 0.0
		for _, k := range cs {
			total += k.per
		}
		fmt.Printf("  %s: %.1f in all:", w, total)
		for _, k := range cs {
			fmt.Printf(" %s %.2f", k.name, k.per)
		}
		fmt.Println()
	})
}

// censusCounts runs each workload n times on the counting library, after a
// warm-up, and hands report its counts, most first; it loads the library
// as it was at the end.
func censusCounts(ctx context.Context, c *redis.Client, n int, workloads []workload, report func(string, []censusCount)) error {
	_, src, _ := luascripts.Library()
	counting, err := censusSource(src)
	if err != nil {
		return err
	}
	defer c.FunctionLoadReplace(context.WithoutCancel(ctx), src)
	if err := c.FunctionLoadReplace(ctx, counting).Err(); err != nil {
		return fmt.Errorf("loading the counting library: %w", err)
	}
	for _, w := range workloads {
		// Warm-up: the library's caches start empty after a load.
		for range 200 {
			if err := w.op(); err != nil {
				return fmt.Errorf("%s: %w", w.name, err)
			}
		}
		if err := c.FCall(ctx, "rb_census", nil).Err(); err != nil {
			return err
		}
		for range n {
			if err := w.op(); err != nil {
				return fmt.Errorf("%s: %w", w.name, err)
			}
		}
		v, err := c.FCall(ctx, "rb_census", nil).Slice()
		if err != nil {
			return err
		}
		var cs []censusCount
		for i := 0; i+1 < len(v); i += 2 {
			name, _ := v[i].(string)
			k, _ := v[i+1].(int64)
			cs = append(cs, censusCount{name, float64(k) / float64(n)})
		}
		slices.SortFunc(cs, func(a, b censusCount) int {
			if a.per != b.per {
				if a.per > b.per {
					return -1
				}
				return 1
			}
			return strings.Compare(a.name, b.name)
		})
		report(w.name, cs)
	}
	return nil
}
