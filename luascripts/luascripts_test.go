package luascripts

import (
	"regexp"
	"strings"
	"testing"
)

func TestSourceStartsEveryCall(t *testing.T) {
	for _, n := range Names() {
		src := Source(n)
		_, usesLib, _ := split(n)
		if usesLib != strings.Contains(src, beginCall) {
			t.Errorf("%s: uses lib.lua %v, but calls begin: %v", n, usesLib, !usesLib)
		}
		if strings.HasPrefix(src, "#!") && !strings.HasPrefix(WithoutShebang(src), "--\n") {
			t.Errorf("%s: WithoutShebang kept the shebang", n)
		}
	}
}

func TestLibrary(t *testing.T) {
	name, src, fns := Library()
	if !strings.HasPrefix(src, "#!lua name="+name+"\n") {
		t.Fatalf("library source starts %q, want its name line", src[:40])
	}
	for _, n := range Names() {
		_, usesLib, _ := split(n)
		fn, ok := fns[n]
		if ok != usesLib {
			t.Errorf("%s: in the library %v, uses lib.lua %v", n, ok, usesLib)
			continue
		}
		if !ok {
			continue
		}
		if !strings.HasPrefix(fn, "rb_"+strings.TrimPrefix(name, "runbudget_")+"_") {
			t.Errorf("%s: function %q does not carry the library's tag", n, fn)
		}
		if strings.Count(src, "function_name = '"+fn+"'") != 1 {
			t.Errorf("%s: function %q not registered exactly once", n, fn)
		}
	}
	if strings.Contains(src, "@TAG@") {
		t.Error("a placeholder was left in the library")
	}
	// Same code, same name: every host of a version loads one library.
	if n2, src2, _ := Library(); n2 != name || src2 != src {
		t.Error("Library is not deterministic")
	}
}

func TestFlagsOf(t *testing.T) {
	for shebang, want := range map[string]string{
		"#!lua":                           "",
		"#!lua flags=allow-oom":           "'allow-oom'",
		"#!lua flags=allow-oom,no-writes": "'allow-oom', 'no-writes'",
	} {
		if got := flagsOf(shebang); got != want {
			t.Errorf("flagsOf(%q) = %q, want %q", shebang, got, want)
		}
	}
}

// TestRepliesUseNamedCodes keeps reply codes named: a budget script's reply
// starts with one of lib.lua's R_ constants, never a literal, or is one of
// its REPLY_ tables (a code alone, made once), so a code's meaning is
// written in one place on each side of the wire.
func TestRepliesUseNamedCodes(t *testing.T) {
	reply := regexp.MustCompile(`return (done\()?(?:\{([^,}]*)|(REPLY_)[A-Z_]+\))`)
	for _, n := range Names() {
		_, usesLib, body := split(n)
		if !usesLib {
			continue
		}
		found := reply.FindAllStringSubmatch(body, -1)
		if len(found) == 0 {
			t.Errorf("%s: no reply found", n)
		}
		for _, m := range found {
			if m[3] != "" {
				continue
			}
			if first := strings.TrimSpace(m[2]); !strings.HasPrefix(first, "R_") && first != "missing" && first != "out" {
				t.Errorf("%s: reply %q does not start with an R_ code", n, m[0])
			}
		}
	}
}

// TestLibraryBatch: the batch functions are registered once each, the
// allow-oom one only with allow-oom scripts, and every batched script is a
// library script whose body the batch can run.
func TestLibraryBatch(t *testing.T) {
	_, src, fns := Library()
	for _, b := range []string{Batch, BatchOOM} {
		if fns[b] == "" || strings.Count(src, "function_name = '"+fns[b]+"'") != 1 {
			t.Errorf("batch function %q not registered exactly once", b)
		}
	}
	if !strings.Contains(src, "function_name = '"+fns[BatchOOM]+"', flags = {'allow-oom'}") {
		t.Error("the allow-oom batch function is not flagged allow-oom")
	}
	if !strings.Contains(src, "function_name = '"+fns[Batch]+"', flags = {}") {
		t.Error("the batch function carries flags: it must be refused out of memory")
	}
	for _, n := range Batched {
		if fns[n] == "" || !strings.Contains(src, "BODY['"+n+"'] = function") {
			t.Errorf("batched script %s is not in the library", n)
		}
	}
	if !AllowOOM("retire") || !AllowOOM("cancel") || AllowOOM("acquire") {
		t.Error("AllowOOM does not read the scripts' flags")
	}
	for _, n := range Names() {
		if n == "batch" || n == "lib" {
			t.Errorf("Names lists %s, which is not a script", n)
		}
	}
}
