// Package luascripts holds the Lua scripts that are the only writers of a
// budget's state in Redis, one file per script, embedded at build time.
//
// Keeping every script in a .lua file (rather than a Go string) lets them be
// read, linted and diffed as Lua. Shared helpers live in lib.lua, which
// Source prepends to scripts that ask for it, so one definition serves all.
package luascripts

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"
)

//go:embed *.lua
var files embed.FS

// libMarker is the first line of a script that wants lib.lua prepended.
const libMarker = "-- uses: lib.lua"

// Source returns the text of the named script (without the .lua suffix), with
// lib.lua prepended when the script's first line asks for it. It panics for a
// name that is not embedded: script names are compile-time constants of this
// module, so a miss is a programming error found by any test that loads it.
func Source(name string) string {
	b, err := files.ReadFile(name + ".lua")
	if err != nil {
		panic(fmt.Sprintf("luascripts: no script %q", name))
	}
	src := string(b)
	if strings.HasPrefix(src, libMarker) {
		lib, err := files.ReadFile("lib.lua")
		if err != nil {
			panic("luascripts: " + name + " asks for lib.lua, which is missing")
		}
		src = string(lib) + "\n" + src
	}
	return src
}

// Names lists the embedded scripts, lib.lua excluded, sorted.
func Names() []string {
	entries, _ := fs.Glob(files, "*.lua")
	var out []string
	for _, e := range entries {
		n := strings.TrimSuffix(e, ".lua")
		if n != "lib" {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}
