package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/luascripts"
)

// spareLocals is how many more locals every script must have room for.
// Redis's Lua (5.1) refuses a function with more than 200 active locals,
// and miniredis's Lua has no such limit, so only a real Redis finds a
// script that grew past it (one did: the EVALSHA form of reassert, when
// lib.lua gained its table pools).
const spareLocals = 20

// TestEveryScriptCompilesOnRedis loads every script as EVALSHA sends it,
// and the function library, on a real Redis, each with spareLocals more
// locals declared where its main chunk starts: a script that fits only
// just fails here, before a change to lib.lua makes it fail in use.
func TestEveryScriptCompilesOnRedis(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	var spare strings.Builder
	spare.WriteString("local ")
	for i := range spareLocals {
		if i > 0 {
			spare.WriteString(", ")
		}
		fmt.Fprintf(&spare, "spare%d", i)
	}
	spare.WriteString("\n")
	padded := func(src string) string {
		// After the shebang line, which must stay first.
		if strings.HasPrefix(src, "#!") {
			first, rest, _ := strings.Cut(src, "\n")
			return first + "\n" + spare.String() + rest
		}
		return spare.String() + src
	}
	for _, n := range luascripts.Names() {
		if err := c.ScriptLoad(ctx, padded(luascripts.Source(n))).Err(); err != nil {
			t.Errorf("script %s with %d locals to spare: %v", n, spareLocals, err)
		}
		if err := c.ScriptLoad(ctx, luascripts.Source(n)).Err(); err != nil {
			t.Errorf("script %s: %v", n, err)
		}
	}
	_, lib, _ := luascripts.Library()
	if err := c.FunctionLoadReplace(ctx, padded(lib)).Err(); err != nil {
		t.Errorf("function library with %d locals to spare: %v", spareLocals, err)
	}
}
