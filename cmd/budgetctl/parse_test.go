package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/runbudget/runbudget/budget"
)

func TestParseDomain(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    budget.Domain
		wantErr string // substring; "" means success
	}{
		{in: "1:acct-42", want: budget.Domain{Version: 1, ID: "acct-42"}},
		{in: "1:s3:eu-west-1:acct-42", want: budget.Domain{Version: 1, ID: "s3:eu-west-1:acct-42"}},
		{in: "0:x", want: budget.Domain{Version: 0, ID: "x"}},
		{in: "-3:x", want: budget.Domain{Version: -3, ID: "x"}},
		{in: "12: spaces ", want: budget.Domain{Version: 12, ID: " spaces "}},
		{in: "1::", want: budget.Domain{Version: 1, ID: ":"}},
		{in: "1:line\nbreak", want: budget.Domain{Version: 1, ID: "line\nbreak"}},
		// The form budgetctl prints, pasted back.
		{in: `v1:"acct-42"`, want: budget.Domain{Version: 1, ID: "acct-42"}},
		{in: `v2:"a\nb\"c"`, want: budget.Domain{Version: 2, ID: "a\nb\"c"}},
		{in: `1:"x:y"`, want: budget.Domain{Version: 1, ID: "x:y"}},
		{in: `1:"\"quoted\""`, want: budget.Domain{Version: 1, ID: `"quoted"`}},
		{in: "1:x\"", want: budget.Domain{Version: 1, ID: `x"`}},

		{in: "acct-42", wantErr: "has no colon"},
		{in: "", wantErr: "has no colon"},
		{in: ":acct", wantErr: "not an integer"},
		{in: "v:acct", wantErr: "not an integer"},
		{in: "x:acct", wantErr: "not an integer"},
		{in: "+1:acct", wantErr: "not an integer"},
		{in: " 1:acct", wantErr: "not an integer"},
		{in: "1.5:acct", wantErr: "not an integer"},
		{in: "99999999999999999999:acct", wantErr: "not an integer"},
		{in: "1:", wantErr: "empty ID"},
		{in: `1:""`, wantErr: "empty ID"},
		{in: `1:"open`, wantErr: "not one quoted string"},
		{in: `1:"a"b`, wantErr: "not one quoted string"},
		{in: "1:\xff", wantErr: "serialization"},
		{in: `1:"\xff"`, wantErr: "serialization"},
	} {
		got, err := parseDomain(tc.in)
		if tc.wantErr == "" {
			if err != nil || got != tc.want {
				t.Errorf("parseDomain(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, budget.ErrInvalidDomain) {
			t.Errorf("parseDomain(%q) = %v, %v; want an ErrInvalidDomain error containing %q", tc.in, got, err, tc.wantErr)
		}
	}
}

// FuzzParseDomain checks, for any input: a parse never panics, what it
// returns is valid, and it is the domain the input names: printing it and
// parsing again gives it back, and so does the plain V:ID form when the ID
// does not start with a quote.
func FuzzParseDomain(f *testing.F) {
	for _, s := range []string{"1:acct-42", "1:s3:eu:acct", `v1:"acct-42"`, `v2:"a\nb"`, "1:", ":", "", "x:y",
		"-1:x", "1:\xff", `1:"\u00e9"`, "9223372036854775807:x", "1:\"", "1:{hash}tag", "v-7:\"\\x00\""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseDomain(s)
		if err != nil {
			if !errors.Is(err, budget.ErrInvalidDomain) {
				t.Fatalf("parseDomain(%q): error %v does not wrap ErrInvalidDomain", s, err)
			}
			if !utf8.ValidString(err.Error()) {
				t.Fatalf("parseDomain(%q): error text is not valid UTF-8: %q", s, err)
			}
			return
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("parseDomain(%q) = %v, which does not validate: %v", s, d, err)
		}
		if back, err := parseDomain(d.String()); err != nil || back != d {
			t.Fatalf("parseDomain(%q) = %v, but its printed form %s parses to %v, %v", s, d, d.String(), back, err)
		}
		if !strings.HasPrefix(d.ID, `"`) {
			plain := fmt.Sprintf("%d:%s", d.Version, d.ID)
			if back, err := parseDomain(plain); err != nil || back != d {
				t.Fatalf("parseDomain(%q) = %v, but %q parses to %v, %v", s, d, plain, back, err)
			}
		}
	})
}

func TestApplyLimitSet(t *testing.T) {
	base := budget.Limits{RequestsPerSecond: 50, Burst: 50, InFlight: map[budget.OpClass]int{budget.OpGet: 4, budget.OpList: 2},
		OpenBodies: 8, MemoryBytes: 1 << 20}
	for _, tc := range []struct {
		sets    []string
		want    budget.Limits
		wantErr string
	}{
		// Memory, which Redis keeps none of, is dropped.
		{sets: nil, want: budget.Limits{RequestsPerSecond: 50, Burst: 50, OpenBodies: 8,
			InFlight: map[budget.OpClass]int{budget.OpGet: 4, budget.OpList: 2}}},
		{sets: []string{"rps=100,burst=10,get=8,list=4,head=0,copy_source_read=2,bodies=16"},
			want: budget.Limits{RequestsPerSecond: 100, Burst: 10, OpenBodies: 16,
				InFlight: map[budget.OpClass]int{budget.OpGet: 8, budget.OpList: 4, budget.OpCopySourceRead: 2}}},
		// rps alone resets burst to its default; other keys are kept.
		{sets: []string{"rps=20"}, want: budget.Limits{RequestsPerSecond: 20, Burst: 0, OpenBodies: 8,
			InFlight: map[budget.OpClass]int{budget.OpGet: 4, budget.OpList: 2}}},
		// Several flags, spaces, upper case keys, "-" for unbounded.
		{sets: []string{"get=-", " LIST = 0 "}, want: budget.Limits{RequestsPerSecond: 50, Burst: 50, OpenBodies: 8}},
		{sets: []string{"burst=5"}, want: budget.Limits{RequestsPerSecond: 50, Burst: 5, OpenBodies: 8,
			InFlight: map[budget.OpClass]int{budget.OpGet: 4, budget.OpList: 2}}},
		{sets: []string{"gets=1"}, wantErr: `unknown key "gets"`},
		{sets: []string{"rps"}, wantErr: `"rps" is not key=value`},
		{sets: []string{"rps=fast"}, wantErr: `rps="fast"`},
		{sets: []string{"rps=-1"}, wantErr: "rps="},
		{sets: []string{"rps=NaN"}, wantErr: "rps="},
		{sets: []string{"get=1.5"}, wantErr: `get="1.5"`},
		{sets: []string{"bodies=-2"}, wantErr: "bodies="},
		// Memory is each host's: storing it would refuse every host that joins.
		{sets: []string{"memory=64MiB"}, wantErr: "memory is each host's own"},
		{sets: []string{"get=2,memory=0"}, wantErr: "memory is each host's own"},
	} {
		got, err := applyLimitSet(base, tc.sets)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || exitCode(err) != exitUsage {
				t.Errorf("applyLimitSet(%q) = %+v, %v; want a usage error containing %q", tc.sets, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !limitsEqual(got, tc.want) {
			t.Errorf("applyLimitSet(%q) = %+v, %v; want %+v", tc.sets, got, err, tc.want)
		}
	}
	if base.InFlight[budget.OpGet] != 4 {
		t.Errorf("applyLimitSet changed its input: %+v", base)
	}
}

func limitsEqual(a, b budget.Limits) bool {
	if len(a.InFlight) != len(b.InFlight) {
		return false
	}
	for c, n := range a.InFlight {
		if b.InFlight[c] != n {
			return false
		}
	}
	a.InFlight, b.InFlight = nil, nil
	return fmt.Sprint(a) == fmt.Sprint(b)
}

func TestRedisURLsNeverShowThePassword(t *testing.T) {
	const pw = "Sup3r-s3cret"
	for _, tc := range []struct {
		url     string
		wantErr string // "" means it parses
	}{
		{url: "redis://:" + pw + "@127.0.0.1:6379/0"},
		{url: "redis://user:" + pw + "@127.0.0.1:6379/2"},
		{url: "rediss://:" + pw + "@example.com:6380/0"},
		{url: "redis://:" + pw + "@host:notaport/0", wantErr: "does not parse as a URL"},
		{url: "redis://:" + pw + "@host:6379/x", wantErr: "database number"},
		{url: "redis://:" + pw + "@ho st:6379/0", wantErr: "does not parse"},
		{url: "redis://:" + pw + "/with/slash@host:6379/0", wantErr: "does not parse"},
		{url: "http://:" + pw + "@host:6379/0", wantErr: `scheme "http"`},
		{url: ":" + pw + "@host:6379", wantErr: "no scheme"},
		{url: "redis://host:6379/0?password=" + pw + "&bogus=1", wantErr: "unexpected option"},
	} {
		opt, err := parseRedisURL(tc.url)
		secrets := urlSecrets(tc.url)
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("parseRedisURL(%s) failed: %v", redactSecrets(tc.url, secrets), err)
			}
			if err == nil && opt.Password != "" && !containsAll(secrets, opt.Password) {
				t.Errorf("urlSecrets(%q) = %q, misses the password %q", tc.url, secrets, opt.Password)
			}
		} else if err == nil || !strings.Contains(err.Error(), tc.wantErr) || exitCode(err) != exitUsage {
			t.Errorf("parseRedisURL(...) = %v, want a usage error containing %q", err, tc.wantErr)
		}
		if err != nil {
			if msg := redactSecrets(err.Error(), secrets); strings.Contains(msg, "s3cret") || strings.Contains(msg, "Sup3r") {
				t.Errorf("error for %q shows the password: %s", tc.url, msg)
			}
		}
		if !strings.Contains(strings.Join(secrets, " "), pw) {
			t.Errorf("urlSecrets(%q) = %q, misses %q", tc.url, secrets, pw)
		}
	}
}

func containsAll(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
