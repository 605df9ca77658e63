package redisstore

import (
	"strings"
	"testing"

	"github.com/runbudget/runbudget/budget"
)

func TestEncodeDomainInjective(t *testing.T) {
	big := strings.Repeat("x{}:\n ", 64<<10/6)
	ds := []budget.Domain{
		{Version: 1, ID: "a"}, {Version: 2, ID: "a"}, {Version: -1, ID: "a"}, {Version: 12, ID: "a"},
		{Version: 1, ID: "2.61"}, {Version: 1, ID: "{a}"}, {Version: 1, ID: "a}"}, {Version: 1, ID: "{"},
		{Version: 1, ID: "a:b"}, {Version: 1, ID: "a b"}, {Version: 1, ID: "a\nb"}, {Version: 1, ID: " "},
		{Version: 1, ID: big}, {Version: 1, ID: big + "y"}, {Version: 0, ID: "\x00"},
	}
	seen := map[string]budget.Domain{}
	for _, d := range ds {
		e := encodeDomain(d)
		if prev, ok := seen[e]; ok {
			t.Fatalf("%s and %s both encode to %q", prev, d, e)
		}
		seen[e] = d
		if strings.ContainsAny(e, "{}: \n") {
			t.Errorf("encoding of %s contains a separator or brace", d)
		}
		back, err := decodeDomain(e)
		if err != nil || back != d {
			t.Errorf("decode(encode(%s)) = %v, %v", d, back, err)
		}
	}
}

func TestKeyPrefixKeepsOneHashTag(t *testing.T) {
	names := []string{"run", "run}", "{run}", "r{u}n", "a:b", "a b", "a\nb", "}{", strings.Repeat("{", 1000)}
	seen := map[string]string{}
	for _, n := range names {
		p := keyPrefix(n)
		if prev, ok := seen[p]; ok {
			t.Fatalf("names %q and %q share prefix %q", prev, n, p)
		}
		seen[p] = n
		open, close := strings.IndexByte(p, '{'), strings.IndexByte(p, '}')
		if open != 3 || close < open || strings.Count(p, "{") != 1 || strings.Count(p, "}") != 1 {
			t.Errorf("prefix %q of %q does not hold exactly one hash tag", p, n)
		}
		if got, _, sharded, ok := parseGroupKey(p + "cfg"); !ok || got != n || sharded {
			t.Errorf("parseGroupKey(%q) = %q, sharded %v, %v; want %q unsharded", p+"cfg", got, sharded, ok, n)
		}
	}
}

func FuzzEncodeDomain(f *testing.F) {
	for _, s := range []string{"a", "{", "}", "a:b", "x\ny", "", "\xff"} {
		f.Add(1, s)
	}
	f.Fuzz(func(t *testing.T, v int, id string) {
		d := budget.Domain{Version: v, ID: id}
		e := encodeDomain(d)
		if strings.ContainsAny(e, "{} \n:") {
			t.Fatalf("encoding %q of %s escapes its key part", e, d)
		}
		back, err := decodeDomain(e)
		if err != nil || back != d {
			t.Fatalf("round trip of %s gave %v, %v", d, back, err)
		}
		// A different version never encodes the same.
		if encodeDomain(budget.Domain{Version: v + 1, ID: id}) == e {
			t.Fatalf("versions %d and %d collide", v, v+1)
		}
	})
}

// FuzzGroupPrefix: a shard group's prefix holds exactly one hash tag, gives
// back its name and key, and differs from the prefix of any other pair and
// of the same name unsharded.
func FuzzGroupPrefix(f *testing.F) {
	for _, s := range [][2]string{{"run", ""}, {"run", "a"}, {"r.u", "n"}, {"r", "u.n"}, {"{", "}"}, {"a:b", "c\nd"}, {"\xff", "x"}} {
		f.Add(s[0], s[1], s[0]+"x", s[1])
	}
	f.Fuzz(func(t *testing.T, name, key, name2, key2 string) {
		p := groupPrefix(name, true, key)
		if strings.Count(p, "{") != 1 || strings.Count(p, "}") != 1 || !strings.HasPrefix(p, "rb:{") {
			t.Fatalf("prefix %q of (%q, %q) does not hold exactly one hash tag", p, name, key)
		}
		n, k, sharded, ok := parseGroupKey(p + "cfg")
		if !ok || !sharded || n != name || k != key {
			t.Fatalf("parseGroupKey(%q) = %q, %q, %v, %v; want %q, %q, sharded", p+"cfg", n, k, sharded, ok, name, key)
		}
		if p == groupPrefix(name, false, "") {
			t.Fatalf("group (%q, %q) shares its prefix with the unsharded budget", name, key)
		}
		if (name != name2 || key != key2) && p == groupPrefix(name2, true, key2) {
			t.Fatalf("(%q, %q) and (%q, %q) share prefix %q", name, key, name2, key2, p)
		}
	})
}
