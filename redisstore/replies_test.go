package redisstore_test

import (
	"regexp"
	"testing"

	"github.com/runbudget/runbudget/luascripts"
	"github.com/runbudget/runbudget/redisstore"
)

// TestReplyCodesMatchLib guards the wire between the scripts and their
// decoders: every reply code lib.lua defines has a Go constant of the same
// value, and every Go constant a code in lib.lua.
func TestReplyCodesMatchLib(t *testing.T) {
	lua := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^local (R_[A-Z_]+) = '([^']*)'`).FindAllStringSubmatch(luascripts.Source("lib"), -1) {
		lua[m[1]] = m[2]
	}
	if len(lua) == 0 {
		t.Fatal("no R_ constants found in lib.lua")
	}
	for name, v := range lua {
		if got, ok := redisstore.ReplyCodes[name]; !ok {
			t.Errorf("lib.lua's %s has no Go constant", name)
		} else if got != v {
			t.Errorf("%s is %q in lib.lua, %q in Go", name, v, got)
		}
	}
	for name := range redisstore.ReplyCodes {
		if _, ok := lua[name]; !ok {
			t.Errorf("Go decodes %s, which lib.lua does not define", name)
		}
	}
}
