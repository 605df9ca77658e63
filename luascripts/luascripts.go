// Package luascripts holds the Lua scripts that are the only writers of a
// budget's state in Redis, one file per script, embedded at build time.
//
// Keeping every script in a .lua file (rather than a Go string) lets them be
// read, linted and diffed as Lua. Shared helpers live in lib.lua, which
// Source prepends to scripts that ask for it, so one definition serves all.
//
// The same files serve two ways of running them: each script on its own
// (EVAL/EVALSHA, Source), or all budget scripts as one Redis 7 function
// library (FUNCTION LOAD/FCALL, Library). A script run with EVALSHA builds
// every helper of lib.lua again on each call, which costs more than
// anything else an uncontended release does; a library builds them once.
// The library also holds batch functions (batch.lua), which run several
// calls of Batched scripts in one FCALL.
package luascripts

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/runbudget/runbudget/budget"
)

//go:embed *.lua
var files embed.FS

// libMarker is the line (first, or right after the shebang) of a script
// that wants lib.lua prepended.
const libMarker = "-- uses: lib.lua"

// beginCall is what a script using lib.lua runs first: it sets up the
// state of one call from KEYS and ARGV.
const beginCall = "begin(KEYS, ARGV)\n"

// split returns the shebang line of a script (without its newline; empty
// when it has none), whether it uses lib.lua, and its body.
func split(name string) (shebang string, usesLib bool, body string) {
	b, err := files.ReadFile(name + ".lua")
	if err != nil {
		panic(fmt.Sprintf("luascripts: no script %q", name))
	}
	body = string(b)
	if strings.HasPrefix(body, "#!") {
		shebang, body, _ = strings.Cut(body, "\n")
	}
	return shebang, strings.HasPrefix(body, libMarker), body
}

// lib returns lib.lua after the line that defines NCLASS, the number of
// operation classes, from budget's table of classes: the scripts know a
// class only by its index, so they never list classes of their own.
func lib() string {
	b, err := files.ReadFile("lib.lua")
	if err != nil {
		panic("luascripts: lib.lua is missing")
	}
	return fmt.Sprintf("local NCLASS = %d\n", budget.NumClasses) + string(b)
}

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
	shebang, usesLib, body := split(name)
	if usesLib {
		// The body runs as a function of its own, as in Library: Lua 5.1
		// allows a function 200 locals, and lib.lua's share of the main
		// chunk's would otherwise leave the longest scripts none to spare.
		body = lib() + "\n" + beginCall + "return (function()\n" + body + "\nend)()\n"
	}
	if shebang != "" {
		shebang += "\n"
	}
	return shebang + body
}

// Batched lists the scripts whose calls a batch may carry (see batch.lua):
// the calls a process makes often and concurrently to one group.
var Batched = []string{"acquire", "cancel", "retire"}

// The batch functions, by their keys in Library's map: Batch (no flags,
// refused whole when Redis is out of memory) carries any operation of
// Batched, BatchOOM (allow-oom) only those of allow-oom scripts.
const (
	Batch    = "batch"
	BatchOOM = "batch_oom"
)

// AllowOOM reports whether the named script is flagged allow-oom: it runs
// when Redis is out of memory, since it only frees (a retirement, a
// cancellation, a heartbeat).
func AllowOOM(name string) bool {
	shebang, _, _ := split(name)
	return strings.Contains(flagsOf(shebang), "'allow-oom'")
}

// Library returns the budget scripts (those using lib.lua) as one Redis
// function library: its name, its source for FUNCTION LOAD, and the
// function name of each script, and of the two batch functions (Batch and
// BatchOOM). Names carry a hash of the source, so hosts running different
// versions of the scripts can share a Redis, each calling its own; one
// library is loaded once and stays.
//
// Each script becomes a function taking (KEYS, ARGV) as it would under
// EVAL, with the flags of its shebang line. Its body is also kept in a
// table, so that a batch function can run it again for each operation it
// carries, each after its own begin.
func Library() (name, src string, functions map[string]string) {
	var body strings.Builder
	body.WriteString(lib())
	// Loaded once and kept: what lib.lua may cache across calls.
	body.WriteString("\nIN_LIBRARY = true\nlocal BODY = {}\n")
	type entry struct{ name, flags, body string }
	var entries []entry
	for _, n := range Names() {
		shebang, usesLib, b := split(n)
		if !usesLib {
			continue
		}
		entries = append(entries, entry{n, flagsOf(shebang), b})
	}
	// Function names carry a tag computed from the text they are in: write
	// a placeholder, hash, then put the tag in.
	const placeholder = "@TAG@"
	for _, e := range entries {
		fmt.Fprintf(&body, "\nBODY['%s'] = function(KEYS, ARGV)\n%s\nend\n", e.name, e.body)
		fmt.Fprintf(&body, "redis.register_function{function_name = 'rb_%s_%s', flags = {%s},\n  callback = function(KEYS, ARGV)\n%sreturn BODY['%s'](KEYS, ARGV)\nend}\n",
			placeholder, e.name, e.flags, beginCall, e.name)
	}
	b, err := files.ReadFile("batch.lua")
	if err != nil {
		panic("luascripts: batch.lua is missing")
	}
	body.WriteString("\n")
	body.Write(b)
	var anyOp, oomOp []string
	for _, n := range Batched {
		anyOp = append(anyOp, n+" = true")
		if AllowOOM(n) {
			oomOp = append(oomOp, n+" = true")
		}
	}
	fmt.Fprintf(&body, "\nlocal BATCH_ANY = {%s}\nlocal BATCH_OOM = {%s}\n", strings.Join(anyOp, ", "), strings.Join(oomOp, ", "))
	fmt.Fprintf(&body, "redis.register_function{function_name = 'rb_%s_%s', flags = {},\n  callback = function(KEYS, ARGV) return run_batch(KEYS, ARGV, BATCH_ANY) end}\n", placeholder, Batch)
	fmt.Fprintf(&body, "redis.register_function{function_name = 'rb_%s_%s', flags = {'allow-oom'},\n  callback = function(KEYS, ARGV) return run_batch(KEYS, ARGV, BATCH_OOM) end}\n", placeholder, BatchOOM)
	sum := sha1.Sum([]byte(body.String()))
	tag := hex.EncodeToString(sum[:6])
	name = "runbudget_" + tag
	functions = make(map[string]string, len(entries)+2)
	for _, e := range entries {
		functions[e.name] = "rb_" + tag + "_" + e.name
	}
	functions[Batch] = "rb_" + tag + "_" + Batch
	functions[BatchOOM] = "rb_" + tag + "_" + BatchOOM
	return name, "#!lua name=" + name + "\n" + strings.ReplaceAll(body.String(), placeholder, tag), functions
}

// flagsOf turns a shebang's flags ("#!lua flags=allow-oom,no-cluster")
// into the body of a Lua table of strings.
func flagsOf(shebang string) string {
	_, flags, ok := strings.Cut(shebang, "flags=")
	if !ok {
		return ""
	}
	var out []string
	for _, f := range strings.Split(strings.Fields(flags)[0], ",") {
		out = append(out, "'"+f+"'")
	}
	return strings.Join(out, ", ")
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

// Names lists the embedded scripts, sorted: not lib.lua nor batch.lua, which
// are parts of scripts rather than scripts.
func Names() []string {
	entries, _ := fs.Glob(files, "*.lua")
	var out []string
	for _, e := range entries {
		n := strings.TrimSuffix(e, ".lua")
		if n != "lib" && n != "batch" {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}
