package budget_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/lease"
)

func TestDomainString(t *testing.T) {
	for _, tc := range []struct {
		d    budget.Domain
		want string
	}{
		{budget.Domain{Version: 1, ID: "acct-1"}, `v1:"acct-1"`},
		{budget.Domain{Version: 0, ID: " "}, `v0:" "`},
		{budget.Domain{Version: -3, ID: "x"}, `v-3:"x"`},
		{budget.Domain{Version: 1, ID: "a\nlevel=error msg=forged"}, `v1:"a\nlevel=error msg=forged"`},
		{budget.Domain{Version: 1, ID: "a\r\n\x1b[31mred"}, `v1:"a\r\n\x1b[31mred"`},
		{budget.Domain{Version: 1, ID: "line\u2028sep\u2029para"}, `v1:"line\u2028sep\u2029para"`},
		{budget.Domain{Version: 1, ID: `say "hi"`}, `v1:"say \"hi\""`},
		{budget.Domain{Version: 1, ID: "\xff"}, `v1:"\xff"`},
		{budget.Domain{Version: 2, ID: "{tag}:b"}, `v2:"{tag}:b"`},
	} {
		got := tc.d.String()
		if got != tc.want {
			t.Errorf("%#v.String() = %s, want %s", tc.d, got, tc.want)
		}
		// Whatever the ID holds, the rendering is one printable line...
		if strings.ContainsAny(got, "\n\r\u2028\u2029") || !utf8.ValidString(got) {
			t.Errorf("%#v.String() = %q: not a single clean line", tc.d, got)
		}
		// ...from which the exact domain can be read back, so two domains
		// never render alike.
		v, q, ok := strings.Cut(strings.TrimPrefix(got, "v"), ":")
		version, err1 := strconv.Atoi(v)
		id, err2 := strconv.Unquote(q)
		if !ok || err1 != nil || err2 != nil || (budget.Domain{Version: version, ID: id}) != tc.d {
			t.Errorf("%s does not read back as %#v", got, tc.d)
		}
	}
}

func TestDomainValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		d     budget.Domain
		valid bool
	}{
		{"plain", budget.Domain{Version: 1, ID: "acct-1234"}, true},
		{"empty", budget.Domain{Version: 1}, false},
		{"empty, version 0", budget.Domain{}, false},
		{"one space", budget.Domain{Version: 1, ID: " "}, true},
		{"whitespace only", budget.Domain{Version: 1, ID: " \t\n\r "}, true},
		{"leading and trailing space", budget.Domain{Version: 1, ID: "  a  "}, true},
		{"NUL", budget.Domain{Version: 1, ID: "\x00"}, true},
		{"control characters", budget.Domain{Version: 1, ID: "a\x01\x1b[0m\x7f"}, true},
		{"line separators", budget.Domain{Version: 1, ID: "\u2028\u2029"}, true},
		{"braces and colons", budget.Domain{Version: 1, ID: "{rb}:x:{y}"}, true},
		{"lone brace", budget.Domain{Version: 1, ID: "}"}, true},
		{"byte order mark", budget.Domain{Version: 1, ID: "\ufeffa"}, true},
		{"replacement character itself", budget.Domain{Version: 1, ID: "\ufffd"}, true},
		{"astral plane", budget.Domain{Version: 1, ID: "\U0001f600"}, true},
		{"HTML-escaped characters", budget.Domain{Version: 1, ID: "<a&b>"}, true},
		{"negative version", budget.Domain{Version: -1, ID: "a"}, true},
		{"huge version", budget.Domain{Version: math.MaxInt, ID: "a"}, true},
		{"invalid byte", budget.Domain{Version: 1, ID: "\xff"}, false},
		{"invalid byte inside", budget.Domain{Version: 1, ID: "a\xc3\x28b"}, false},
		{"truncated sequence", budget.Domain{Version: 1, ID: "\xe2\x82"}, false},
		{"encoded surrogate half", budget.Domain{Version: 1, ID: "\xed\xa0\x80"}, false},
		{"overlong encoding", budget.Domain{Version: 1, ID: "\xc0\xaf"}, false},
		{"invalid then newline", budget.Domain{Version: 1, ID: "\xff\nforged"}, false},
	} {
		err := tc.d.Validate()
		switch {
		case tc.valid && err != nil:
			t.Errorf("%s: %#v.Validate() = %v, want nil", tc.name, tc.d, err)
		case !tc.valid && !errors.Is(err, budget.ErrInvalidDomain):
			t.Errorf("%s: %#v.Validate() = %v, want ErrInvalidDomain", tc.name, tc.d, err)
		case !tc.valid && strings.ContainsAny(err.Error(), "\n\r"):
			// The error reaches logs too: the bad ID is quoted there.
			t.Errorf("%s: error %q carries a raw line break", tc.name, err)
		}
	}
}

// TestDomainVersionIsPartOfEquality checks that the version separates
// budgets but never makes a domain invalid, and that IDs differing only in
// whitespace are different domains: nothing is trimmed.
func TestDomainVersionIsPartOfEquality(t *testing.T) {
	req := budget.Request{Class: budget.OpGet, Domains: []budget.Domain{
		{Version: 2, ID: "a"}, {Version: 1, ID: "a"}, {Version: 1, ID: " a"}, {Version: 1, ID: "a "},
	}}
	n, err := req.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Domains) != 4 {
		t.Errorf("Normalize kept %v, want all four domains: they are distinct", n.Domains)
	}
}

func TestLimitsNormalizeInvalid(t *testing.T) {
	for _, tc := range []struct {
		name  string
		l     budget.Limits
		field string // the message names it
	}{
		{"all zero", budget.Limits{}, "zero"},
		{"only zero in-flight entries", budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 0, budget.OpList: 0}}, "zero"},
		{"empty in-flight map", budget.Limits{InFlight: map[budget.OpClass]int{}}, "zero"},
		{"NaN rate", budget.Limits{RequestsPerSecond: math.NaN()}, "RequestsPerSecond"},
		{"+Inf rate", budget.Limits{RequestsPerSecond: math.Inf(1)}, "RequestsPerSecond"},
		{"-Inf rate", budget.Limits{RequestsPerSecond: math.Inf(-1)}, "RequestsPerSecond"},
		{"negative rate", budget.Limits{RequestsPerSecond: -0.5}, "RequestsPerSecond"},
		{"smallest negative rate", budget.Limits{RequestsPerSecond: -math.SmallestNonzeroFloat64}, "RequestsPerSecond"},
		{"rate above a billion", budget.Limits{RequestsPerSecond: math.Nextafter(1e9, 2e9)}, "RequestsPerSecond"},
		{"absurd rate", budget.Limits{RequestsPerSecond: math.MaxFloat64}, "RequestsPerSecond"},
		{"negative burst", budget.Limits{RequestsPerSecond: 1, Burst: -1}, "Burst"},
		{"burst without rate", budget.Limits{Burst: 5, MemoryBytes: 1}, "Burst"},
		{"negative open bodies", budget.Limits{OpenBodies: -1, MemoryBytes: 1}, "OpenBodies"},
		{"negative memory", budget.Limits{MemoryBytes: -1, OpenBodies: 1}, "MemoryBytes"},
		{"most negative memory", budget.Limits{MemoryBytes: math.MinInt64}, "MemoryBytes"},
		{"unknown class", budget.Limits{InFlight: map[budget.OpClass]int{"rename": 1}}, "InFlight"},
		{"empty class", budget.Limits{InFlight: map[budget.OpClass]int{"": 1}}, "InFlight"},
		{"case-folded class", budget.Limits{InFlight: map[budget.OpClass]int{"GET": 1}}, "InFlight"},
		{"unknown class with zero", budget.Limits{InFlight: map[budget.OpClass]int{"rename": 0}, MemoryBytes: 1}, "InFlight"},
		{"negative in-flight", budget.Limits{InFlight: map[budget.OpClass]int{budget.OpHead: -2}}, "InFlight"},
	} {
		got, err := tc.l.Normalize()
		if !errors.Is(err, budget.ErrInvalidLimits) {
			t.Errorf("%s: Normalize(%+v) error = %v, want ErrInvalidLimits", tc.name, tc.l, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: error %q does not name %s", tc.name, err, tc.field)
		}
		if !got.Equal(budget.Limits{}) || got.InFlight != nil {
			t.Errorf("%s: Normalize returned %+v with its error, want the zero Limits", tc.name, got)
		}
	}
}

func TestLimitsNormalize(t *testing.T) {
	get := func(n int) map[budget.OpClass]int { return map[budget.OpClass]int{budget.OpGet: n} }
	for _, tc := range []struct {
		name string
		in   budget.Limits
		want budget.Limits
	}{
		{"burst from a whole rate", budget.Limits{RequestsPerSecond: 10}, budget.Limits{RequestsPerSecond: 10, Burst: 10}},
		{"burst rounds up", budget.Limits{RequestsPerSecond: 10.2}, budget.Limits{RequestsPerSecond: 10.2, Burst: 11}},
		{"burst at least 1", budget.Limits{RequestsPerSecond: 0.5}, budget.Limits{RequestsPerSecond: 0.5, Burst: 1}},
		{"tiniest rate", budget.Limits{RequestsPerSecond: math.SmallestNonzeroFloat64}, budget.Limits{RequestsPerSecond: math.SmallestNonzeroFloat64, Burst: 1}},
		{"highest rate", budget.Limits{RequestsPerSecond: 1e9}, budget.Limits{RequestsPerSecond: 1e9, Burst: 1e9}},
		{"burst given is kept", budget.Limits{RequestsPerSecond: 100, Burst: 7}, budget.Limits{RequestsPerSecond: 100, Burst: 7}},
		{"burst above rate is kept", budget.Limits{RequestsPerSecond: 1, Burst: 50}, budget.Limits{RequestsPerSecond: 1, Burst: 50}},
		{"memory only", budget.Limits{MemoryBytes: 1}, budget.Limits{MemoryBytes: 1}},
		{"bodies only", budget.Limits{OpenBodies: 3}, budget.Limits{OpenBodies: 3}},
		{"zero entries dropped", budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 4, budget.OpList: 0}},
			budget.Limits{InFlight: get(4)}},
		{"all entries zero, other dimension set", budget.Limits{InFlight: get(0), MemoryBytes: 9},
			budget.Limits{MemoryBytes: 9}},
		{"every class", budget.Limits{InFlight: map[budget.OpClass]int{budget.OpList: 1, budget.OpHead: 2, budget.OpGet: 3, budget.OpCopySourceRead: 4}},
			budget.Limits{InFlight: map[budget.OpClass]int{budget.OpList: 1, budget.OpHead: 2, budget.OpGet: 3, budget.OpCopySourceRead: 4}}},
	} {
		got, err := tc.in.Normalize()
		if err != nil {
			t.Errorf("%s: Normalize(%+v): %v", tc.name, tc.in, err)
			continue
		}
		if !got.Equal(tc.want) || got.Burst != tc.want.Burst {
			t.Errorf("%s: Normalize(%+v) = %+v, want %+v", tc.name, tc.in, got, tc.want)
		}
		if len(got.InFlight) == 0 && got.InFlight != nil {
			t.Errorf("%s: empty InFlight map %v, want nil so equal limits look equal", tc.name, got.InFlight)
		}
		// Normalizing is idempotent.
		again, err := got.Normalize()
		if err != nil || !again.Equal(got) {
			t.Errorf("%s: Normalize(Normalize(l)) = %+v, %v; want %+v", tc.name, again, err, got)
		}
	}
}

func TestLimitsNormalizeDoesNotAlias(t *testing.T) {
	in := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 2, budget.OpHead: 0}}
	out, err := in.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	if in.Burst != 0 || len(in.InFlight) != 2 || in.InFlight[budget.OpGet] != 2 {
		t.Fatalf("Normalize changed its input: %+v", in)
	}
	out.InFlight[budget.OpList] = 9
	out.InFlight[budget.OpGet] = 1
	if len(in.InFlight) != 2 || in.InFlight[budget.OpGet] != 2 {
		t.Errorf("writing the result's map changed the input's: %v", in.InFlight)
	}
	in.InFlight[budget.OpCopySourceRead] = 5
	if _, ok := out.InFlight[budget.OpCopySourceRead]; ok {
		t.Errorf("writing the input's map changed the result's: %v", out.InFlight)
	}
}

func TestLimitsEqual(t *testing.T) {
	a := budget.Limits{RequestsPerSecond: 5, Burst: 5, InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
	for _, tc := range []struct {
		b    budget.Limits
		want bool
	}{
		{budget.Limits{RequestsPerSecond: 5, Burst: 5, InFlight: map[budget.OpClass]int{budget.OpGet: 1}}, true},
		{budget.Limits{RequestsPerSecond: 5, Burst: 6, InFlight: map[budget.OpClass]int{budget.OpGet: 1}}, false},
		{budget.Limits{RequestsPerSecond: 5, Burst: 5, InFlight: map[budget.OpClass]int{budget.OpHead: 1}}, false},
		{budget.Limits{RequestsPerSecond: 5, Burst: 5, InFlight: map[budget.OpClass]int{budget.OpGet: 1, budget.OpHead: 1}}, false},
		{budget.Limits{RequestsPerSecond: 5, Burst: 5}, false},
		{budget.Limits{RequestsPerSecond: 5, Burst: 5, InFlight: map[budget.OpClass]int{budget.OpGet: 1}, MemoryBytes: 1}, false},
		{budget.Limits{RequestsPerSecond: 5, Burst: 5, InFlight: map[budget.OpClass]int{budget.OpGet: 1}, OpenBodies: 1}, false},
	} {
		if got := a.Equal(tc.b); got != tc.want || tc.b.Equal(a) != tc.want {
			t.Errorf("%+v.Equal(%+v) = %v, want %v both ways", a, tc.b, got, tc.want)
		}
	}
}

func TestRequestNormalize(t *testing.T) {
	d := func(v int, id string) budget.Domain { return budget.Domain{Version: v, ID: id} }
	for _, tc := range []struct {
		name string
		in   []budget.Domain
		want []budget.Domain
	}{
		{"one", []budget.Domain{d(1, "a")}, []budget.Domain{d(1, "a")}},
		{"sorted by version first", []budget.Domain{d(2, "a"), d(1, "b")}, []budget.Domain{d(1, "b"), d(2, "a")}},
		{"then by ID bytes", []budget.Domain{d(1, "b"), d(1, "B"), d(1, "a\x00"), d(1, "a"), d(1, "é"), d(1, "z")},
			[]budget.Domain{d(1, "B"), d(1, "a"), d(1, "a\x00"), d(1, "b"), d(1, "z"), d(1, "é")}},
		{"negative versions sort first", []budget.Domain{d(0, "a"), d(-1, "a")}, []budget.Domain{d(-1, "a"), d(0, "a")}},
		{"duplicates count once", []budget.Domain{d(1, "a"), d(1, "b"), d(1, "a"), d(1, "a")}, []budget.Domain{d(1, "a"), d(1, "b")}},
		{"all the same", []budget.Domain{d(3, "x"), d(3, "x"), d(3, "x")}, []budget.Domain{d(3, "x")}},
		{"same ID, other version is another domain", []budget.Domain{d(1, "a"), d(2, "a"), d(1, "a")}, []budget.Domain{d(1, "a"), d(2, "a")}},
	} {
		in := slices.Clone(tc.in)
		req := budget.Request{Domains: in, Class: budget.OpHead, MemoryBytes: 7, OpensBody: true, Consumer: "lane-1"}
		got, err := req.Normalize()
		if err != nil {
			t.Errorf("%s: Normalize: %v", tc.name, err)
			continue
		}
		if !slices.Equal(got.Domains, tc.want) {
			t.Errorf("%s: Domains = %v, want %v", tc.name, got.Domains, tc.want)
		}
		if got.Class != req.Class || got.MemoryBytes != req.MemoryBytes || got.OpensBody != req.OpensBody || got.Consumer != req.Consumer {
			t.Errorf("%s: Normalize lost a field: %+v from %+v", tc.name, got, req)
		}
		if !slices.Equal(in, tc.in) {
			t.Errorf("%s: the caller's slice changed to %v", tc.name, in)
		}
		again, err := got.Normalize()
		if err != nil || !slices.Equal(again.Domains, got.Domains) {
			t.Errorf("%s: Normalize is not idempotent: %v, %v", tc.name, again.Domains, err)
		}
	}
}

// TestRequestNormalizeDoesNotKeepCallerSlice checks, for both the one-domain
// fast path and the sorting path, that writing through the result (or
// appending to it) never reaches the caller's backing array.
func TestRequestNormalizeDoesNotKeepCallerSlice(t *testing.T) {
	for _, n := range []int{1, 2, 5} {
		backing := make([]budget.Domain, n, n+4)
		for i := range backing {
			backing[i] = budget.Domain{Version: 1, ID: strconv.Itoa(n - i)}
		}
		want := slices.Clone(backing[:cap(backing)])
		got, err := budget.Request{Domains: backing, Class: budget.OpGet}.Normalize()
		if err != nil {
			t.Fatal(err)
		}
		for i := range got.Domains {
			got.Domains[i] = budget.Domain{Version: 9, ID: "overwritten"}
		}
		_ = append(got.Domains, budget.Domain{Version: 9, ID: "appended"})
		if !slices.Equal(backing[:cap(backing)], want) {
			t.Errorf("%d domains: the caller's array became %v", n, backing[:cap(backing)])
		}
	}
}

// TestAcquireDoesNotKeepCallerSlice: Acquire may read the caller's Domains
// without copying them, but nothing may depend on that slice once Acquire
// has returned, for a lease granted at once or one that waited.
func TestAcquireDoesNotKeepCallerSlice(t *testing.T) {
	b, err := budget.New(budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a := budget.Domain{Version: 1, ID: "a"}
	ds := []budget.Domain{a}
	first, err := b.Acquire(context.Background(), budget.Request{Domains: ds, Class: budget.OpGet})
	if err != nil {
		t.Fatal(err)
	}
	ds[0] = budget.Domain{Version: 1, ID: "elsewhere"}
	ws := []budget.Domain{a}
	done := make(chan *budget.Lease)
	go func() {
		l, err := b.Acquire(context.Background(), budget.Request{Domains: ws, Class: budget.OpGet})
		if err != nil {
			t.Error(err)
		}
		done <- l
	}()
	for {
		u, _ := b.Usage(context.Background())
		if u.Waiters == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	first.Release()
	second := <-done
	ws[0] = budget.Domain{Version: 1, ID: "elsewhere"}
	second.Release()
	u, err := b.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Domains) != 0 || u.Waiters != 0 {
		t.Fatalf("usage after both leases were released: %+v", u)
	}
}

func TestRequestNormalizeErrors(t *testing.T) {
	a := budget.Domain{Version: 1, ID: "a"}
	for _, tc := range []struct {
		name string
		req  budget.Request
		want error
	}{
		{"nil domains", budget.Request{Class: budget.OpGet}, budget.ErrInvalidRequest},
		{"empty domains", budget.Request{Domains: []budget.Domain{}, Class: budget.OpGet}, budget.ErrInvalidRequest},
		{"no class", budget.Request{Domains: []budget.Domain{a}}, budget.ErrInvalidRequest},
		{"unknown class", budget.Request{Domains: []budget.Domain{a}, Class: "rename"}, budget.ErrInvalidRequest},
		{"upper-case class", budget.Request{Domains: []budget.Domain{a}, Class: "GET"}, budget.ErrInvalidRequest},
		{"negative memory", budget.Request{Domains: []budget.Domain{a}, Class: budget.OpGet, MemoryBytes: -1}, budget.ErrInvalidRequest},
		{"empty domain ID", budget.Request{Domains: []budget.Domain{{Version: 1}}, Class: budget.OpGet}, budget.ErrInvalidDomain},
		{"invalid UTF-8", budget.Request{Domains: []budget.Domain{{ID: "\xff"}}, Class: budget.OpGet}, budget.ErrInvalidDomain},
		{"one bad among good", budget.Request{Domains: []budget.Domain{a, {ID: ""}, a}, Class: budget.OpList}, budget.ErrInvalidDomain},
	} {
		got, err := tc.req.Normalize()
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: Normalize() error = %v, want %v", tc.name, err, tc.want)
			continue
		}
		for _, other := range []error{budget.ErrInvalidRequest, budget.ErrInvalidDomain} {
			if other != tc.want && errors.Is(err, other) {
				t.Errorf("%s: error %v also wraps %v", tc.name, err, other)
			}
		}
		if got.Domains != nil || got.Class != "" {
			t.Errorf("%s: Normalize returned %+v with its error, want the zero Request", tc.name, got)
		}
	}
}

func TestRequestParts(t *testing.T) {
	for _, tc := range []struct {
		req  budget.Request
		want lease.Parts
	}{
		{budget.Request{}, lease.Request},
		{budget.Request{OpensBody: true}, lease.Request | lease.Body},
		{budget.Request{MemoryBytes: 1}, lease.Request | lease.Memory},
		{budget.Request{OpensBody: true, MemoryBytes: 8 << 20}, lease.All},
		// A negative reservation is refused by Normalize; it holds no memory.
		{budget.Request{MemoryBytes: -1}, lease.Request},
	} {
		if got := tc.req.Parts(); got != tc.want {
			t.Errorf("%+v.Parts() = %v, want %v", tc.req, got, tc.want)
		}
	}
}

func TestOpClassIndex(t *testing.T) {
	for i, c := range budget.Classes() {
		if c.Index() != i {
			t.Errorf("%q.Index() = %d, want %d", c, c.Index(), i)
		}
	}
	for _, c := range []budget.OpClass{"", "rename", "Get", "get ", "PUT"} {
		if c.Index() != -1 {
			t.Errorf("%q.Index() = %d, want -1", c, c.Index())
		}
	}
}

// FuzzDomainValidate checks Validate against its definition, a JSON round trip
// that gives back the same bytes, and against the cheap form it comes to: a
// non-empty, valid UTF-8 ID. A faster Validate can rely on this equivalence.
func FuzzDomainValidate(f *testing.F) {
	for _, id := range []string{"", " ", "a", "\x00", "\n", "\u2028", "{x}:y", "\ufffd", "\xff", "\xed\xa0\x80", "\xc0\xaf", "<&>"} {
		f.Add(1, id)
	}
	f.Fuzz(func(t *testing.T, version int, id string) {
		d := budget.Domain{Version: version, ID: id}
		err := d.Validate()
		b, merr := json.Marshal(d)
		var back budget.Domain
		roundTrips := merr == nil && json.Unmarshal(b, &back) == nil && back == d
		if (err == nil) != (id != "" && roundTrips) {
			t.Errorf("%#v: Validate() = %v, but a JSON round trip gives %#v", d, err, back)
		}
		if (err == nil) != (id != "" && utf8.ValidString(id)) {
			t.Errorf("%#v: Validate() = %v, want valid exactly when the ID is non-empty UTF-8", d, err)
		}
		if err != nil && !errors.Is(err, budget.ErrInvalidDomain) {
			t.Errorf("%#v: error %v does not wrap ErrInvalidDomain", d, err)
		}
	})
}

// TestClassesIsACopy guards the class table: what Classes returns belongs to
// the caller, so changing it cannot rename or reorder a class here.
func TestClassesIsACopy(t *testing.T) {
	cs := budget.Classes()
	cs[0] = "rename"
	if got := budget.Classes()[0]; got != budget.OpList {
		t.Fatalf("Classes()[0] = %q after the caller changed its copy, want %q", got, budget.OpList)
	}
	if budget.OpPut.Index() < 0 || budget.OpDelete.Index() < 0 {
		t.Fatal("the write classes are missing from the table")
	}
	if len(cs) != budget.NumClasses {
		t.Fatalf("len(Classes()) = %d, NumClasses = %d", len(cs), budget.NumClasses)
	}
}
