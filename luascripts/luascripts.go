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

// libMarker is the line (first, or right after the shebang) of a script
// that wants lib.lua prepended.
const libMarker = "-- uses: lib.lua"

// Source returns the text of the named script (without the .lua suffix), with
// lib.lua prepended when the script asks for it. A script's shebang line
// ("#!lua flags=..."), which must stay the very first line, is kept first.
// It panics for a name that is not embedded: script names are compile-time
// constants of this module, so a miss is a programming error found by any
// test that loads it.
//
// The shebang matters on Redis 7: a script that declares one is refused as
// a whole when Redis is out of memory (unless flagged allow-oom), instead of
// failing at its first growing write after earlier writes went through.
func Source(name string) string {
	b, err := files.ReadFile(name + ".lua")
	if err != nil {
		panic(fmt.Sprintf("luascripts: no script %q", name))
	}
	shebang, body := "", string(b)
	if strings.HasPrefix(body, "#!") {
		line, rest, _ := strings.Cut(body, "\n")
		shebang, body = line+"\n", rest
	}
	if strings.HasPrefix(body, libMarker) {
		lib, err := files.ReadFile("lib.lua")
		if err != nil {
			panic("luascripts: " + name + " asks for lib.lua, which is missing")
		}
		body = string(lib) + "\n" + body
	}
	return shebang + body
}

// WithoutShebang returns src without its shebang line, for servers that do
// not understand one (Redis before 7, miniredis). The script is otherwise
// the same; only the out-of-memory behaviour described at Source differs.
func WithoutShebang(src string) string {
	if !strings.HasPrefix(src, "#!") {
		return src
	}
	// An empty comment in its place keeps line numbers in errors the same.
	_, rest, _ := strings.Cut(src, "\n")
	return "--\n" + rest
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
