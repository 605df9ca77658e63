package redisstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/admission"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/loom"
)

// rcPrefix is a key prefix of its own for one test, so that tests sharing a
// server never share a bucket.
func rcPrefix() string {
	return "rctest:" + strconv.FormatUint(rand.Uint64(), 36) + ":"
}

// rcMiniredis starts an embedded server whose TIME is t0 until the test
// moves it, and a client for it.
func rcMiniredis(t *testing.T, t0 time.Time) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(t0)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return m, c
}

func rcNew(t *testing.T, c redis.UniversalClient, prefix string, p admission.RatePolicy) admission.RateCheck {
	t.Helper()
	check, err := NewRateCheck(c, prefix, p)
	if err != nil {
		t.Fatalf("NewRateCheck(%+v): %v", p, err)
	}
	return check
}

func rcCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRateCheckNewValidation(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer c.Close()
	ok := admission.RatePolicy{PerSecond: 10, Burst: 5}
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
		prefix string
		policy admission.RatePolicy
		ok     bool
	}{
		{"ok", c, "rl:", ok, true},
		{"nil client", nil, "rl:", ok, false},
		{"empty prefix", c, "", ok, false},
		{"prefix with {", c, "rl:{", ok, false},
		{"prefix with }", c, "rl}:", ok, false},
		{"prefix with newline", c, "rl\n:", ok, false},
		{"prefix with space", c, "rate limit:", ok, false},
		{"prefix with NUL", c, "rl\x00", ok, false},
		{"prefix not UTF-8", c, "rl\xff:", ok, false},
		{"prefix of 256 bytes", c, strings.Repeat("p", 256), ok, true},
		{"prefix of 257 bytes", c, strings.Repeat("p", 257), ok, false},
		{"unicode prefix", c, "débit:", ok, true},
		{"zero policy", c, "rl:", admission.RatePolicy{}, false},
		{"zero rate", c, "rl:", admission.RatePolicy{PerSecond: 0, Burst: 1}, false},
		{"negative rate", c, "rl:", admission.RatePolicy{PerSecond: -1, Burst: 1}, false},
		{"NaN rate", c, "rl:", admission.RatePolicy{PerSecond: math.NaN(), Burst: 1}, false},
		{"infinite rate", c, "rl:", admission.RatePolicy{PerSecond: math.Inf(1), Burst: 1}, false},
		{"MaxFloat64 rate", c, "rl:", admission.RatePolicy{PerSecond: math.MaxFloat64, Burst: 1}, false},
		{"rate at the maximum", c, "rl:", admission.RatePolicy{PerSecond: 1e9, Burst: 1}, true},
		{"rate above the maximum", c, "rl:", admission.RatePolicy{PerSecond: math.Nextafter(1e9, 2e9), Burst: 1}, false},
		{"zero burst", c, "rl:", admission.RatePolicy{PerSecond: 1, Burst: 0}, false},
		{"negative burst", c, "rl:", admission.RatePolicy{PerSecond: 1, Burst: -1}, false},
		{"burst at the maximum", c, "rl:", admission.RatePolicy{PerSecond: 1e9, Burst: 1e9}, true},
		{"burst above the maximum", c, "rl:", admission.RatePolicy{PerSecond: 1e9, Burst: 1e9 + 1}, false},
		{"refill of exactly a year", c, "rl:", admission.RatePolicy{PerSecond: 1, Burst: 31536000}, true},
		{"refill beyond a year", c, "rl:", admission.RatePolicy{PerSecond: 1, Burst: 31536001}, false},
		{"tiny rate", c, "rl:", admission.RatePolicy{PerSecond: 1e-9, Burst: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check, err := NewRateCheck(tc.client, tc.prefix, tc.policy)
			if tc.ok != (err == nil) || tc.ok != (check != nil) {
				t.Fatalf("NewRateCheck = %v, %v; want ok %v", check != nil, err, tc.ok)
			}
			if err != nil && !strings.HasPrefix(err.Error(), "redisstore: NewRateCheck: ") {
				t.Fatalf("error %q does not say where it comes from", err)
			}
		})
	}
}

// rcStep is one action on a shared bucket at an offset from the start.
type rcStep struct {
	at     time.Duration
	check  string        // which configured check to call; "" for "a"
	key    string        // group key; "" for "k"
	n      int           // calls, each expected to return allowed
	allow  bool          //
	retry  time.Duration // for a denial, the exact RetryAfter
	ttl    time.Duration // the bucket key's TTL after the step; 0: not checked
	tokens string        // the stored token count after the step; "": not checked
}

// TestRateCheckSteps drives buckets on the embedded server with a hand-set
// TIME, so delays and TTLs are exact.
func TestRateCheckSteps(t *testing.T) {
	for _, tc := range []struct {
		name   string
		checks map[string]admission.RatePolicy
		steps  []rcStep
	}{
		{"starts full, denies with the exact delay, refills at the rate",
			map[string]admission.RatePolicy{"a": {PerSecond: 4, Burst: 2}},
			[]rcStep{
				{at: 0, n: 2, allow: true, ttl: 500 * time.Millisecond},
				{at: 0, n: 1, allow: false, retry: 250 * time.Millisecond},
				{at: 100 * time.Millisecond, n: 1, allow: false, retry: 150 * time.Millisecond},
				{at: 250 * time.Millisecond, n: 1, allow: true, ttl: 500 * time.Millisecond},
				{at: 250 * time.Millisecond, n: 1, allow: false, retry: 250 * time.Millisecond},
				// Idle far longer than a refill: only Burst comes back.
				{at: time.Hour, n: 2, allow: true},
				{at: time.Hour, n: 1, allow: false},
			}},
		{"a slow rate: delay in seconds, key lives until full",
			map[string]admission.RatePolicy{"a": {PerSecond: 0.5, Burst: 3}},
			[]rcStep{
				{at: 0, n: 1, allow: true, ttl: 2 * time.Second, tokens: "2.00000000000000000"},
				{at: 0, n: 2, allow: true, ttl: 6 * time.Second, tokens: "0.00000000000000000"},
				{at: time.Second, n: 1, allow: false, retry: time.Second},
				{at: 2 * time.Second, n: 1, allow: true, ttl: 6 * time.Second},
			}},
		{"delays round up to the microsecond",
			map[string]admission.RatePolicy{"a": {PerSecond: 3, Burst: 1}},
			[]rcStep{
				{at: 0, n: 1, allow: true, ttl: 334 * time.Millisecond},
				{at: 0, n: 1, allow: false, retry: 333334 * time.Microsecond},
				{at: 333334 * time.Microsecond, n: 1, allow: true},
			}},
		{"group keys have separate buckets",
			map[string]admission.RatePolicy{"a": {PerSecond: 1, Burst: 1}},
			[]rcStep{
				{at: 0, key: "alice", n: 1, allow: true},
				{at: 0, key: "alice", n: 1, allow: false, retry: time.Second},
				{at: 0, key: "bob", n: 1, allow: true},
				{at: 0, key: "bob", n: 1, allow: false, retry: time.Second},
			}},
		{"replicas share one bucket; a smaller burst cuts it",
			map[string]admission.RatePolicy{"a": {PerSecond: 1, Burst: 10}, "b": {PerSecond: 1, Burst: 3}},
			[]rcStep{
				{at: 0, check: "a", n: 1, allow: true, ttl: time.Second},
				{at: 0, check: "b", n: 3, allow: true, ttl: 3 * time.Second},
				{at: 0, check: "b", n: 1, allow: false, retry: time.Second},
				{at: 0, check: "a", n: 1, allow: false, retry: time.Second},
				{at: time.Second, check: "a", n: 1, allow: true, ttl: 10 * time.Second},
			}},
		{"replicas share one bucket; each refills at its own rate",
			map[string]admission.RatePolicy{"a": {PerSecond: 1, Burst: 2}, "b": {PerSecond: 10, Burst: 2}},
			[]rcStep{
				{at: 0, check: "a", n: 2, allow: true},
				{at: 0, check: "a", n: 1, allow: false, retry: time.Second},
				{at: 0, check: "b", n: 1, allow: false, retry: 100 * time.Millisecond},
				{at: 100 * time.Millisecond, check: "b", n: 1, allow: true, ttl: 200 * time.Millisecond},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Unix(1_700_000_000, 0)
			m, c := rcMiniredis(t, t0)
			prefix := rcPrefix()
			checks := map[string]admission.RateCheck{}
			for name, p := range tc.checks {
				checks[name] = rcNew(t, c, prefix, p)
			}
			for i, s := range tc.steps {
				m.SetTime(t0.Add(s.at))
				name, key := rcOr(s.check, "a"), rcOr(s.key, "k")
				for j := range s.n {
					d, err := checks[name](rcCtx(t), key)
					if err != nil {
						t.Fatalf("step %d (%+v) call %d: %v", i, s, j, err)
					}
					if d.Allowed != s.allow {
						t.Fatalf("step %d (%+v) call %d: allowed %v", i, s, j, d.Allowed)
					}
					if d.Allowed && d.RetryAfter != 0 || !d.Allowed && d.RetryAfter <= 0 {
						t.Fatalf("step %d: decision %+v breaks RateDecision's rules", i, d)
					}
					if !d.Allowed && s.retry != 0 && d.RetryAfter != s.retry {
						t.Fatalf("step %d: RetryAfter %v, want %v", i, d.RetryAfter, s.retry)
					}
					if d.Version != 0 {
						t.Fatalf("step %d: version %d from a backend without versions", i, d.Version)
					}
				}
				bucket := rateCheckKey(prefix, key)
				if s.ttl != 0 {
					if got := m.TTL(bucket); got != s.ttl {
						t.Fatalf("step %d: TTL %v, want %v (the time to refill)", i, got, s.ttl)
					}
				}
				if s.tokens != "" {
					v, _ := m.Get(bucket)
					if got, _, _ := strings.Cut(v, " "); got != s.tokens {
						t.Fatalf("step %d: stored tokens %q, want %q", i, got, s.tokens)
					}
				}
			}
		})
	}
}

func rcOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// TestRateCheckIdleKeyExpires checks that a bucket's key vanishes once it
// would be full again, and that a vanished key reads as a full bucket.
func TestRateCheckIdleKeyExpires(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	m, c := rcMiniredis(t, t0)
	prefix := rcPrefix()
	check := rcNew(t, c, prefix, admission.RatePolicy{PerSecond: 2, Burst: 4})
	for range 4 {
		if d, err := check(rcCtx(t), "k"); err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	bucket := rateCheckKey(prefix, "k")
	if got := m.TTL(bucket); got != 2*time.Second {
		t.Fatalf("TTL %v, want 2s", got)
	}
	m.FastForward(2*time.Second - time.Millisecond)
	if !m.Exists(bucket) {
		t.Fatal("key gone before the bucket refilled")
	}
	m.FastForward(time.Millisecond)
	if m.Exists(bucket) {
		t.Fatal("key still there once the bucket is full")
	}
	m.SetTime(t0.Add(2 * time.Second))
	for range 4 {
		if d, err := check(rcCtx(t), "k"); err != nil || !d.Allowed {
			t.Fatalf("after expiry: %+v, %v", d, err)
		}
	}
	if d, _ := check(rcCtx(t), "k"); d.Allowed {
		t.Fatal("more than Burst after expiry")
	}
}

// TestRateCheckKeys checks the bucket keys: the prefix, then the hash of the
// group key as the hash tag, whatever bytes the group key holds.
func TestRateCheckKeys(t *testing.T) {
	m, c := rcMiniredis(t, time.Unix(1_700_000_000, 0))
	prefix := rcPrefix()
	check := rcNew(t, c, prefix, admission.RatePolicy{PerSecond: 1, Burst: 1})
	groups := []string{"", "alice", "{", "}", "{alice}", "a}b{c", "line\nbreak", "\x00\xff\xfe", prefix + "{x}", strings.Repeat("long", 5000)}
	for _, g := range groups {
		if _, err := check(rcCtx(t), g); err != nil {
			t.Fatalf("group %q: %v", g, err)
		}
	}
	shape := regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `\{[0-9a-f]{64}\}$`)
	keys := m.Keys()
	if len(keys) != len(groups) {
		t.Fatalf("%d keys for %d groups: %q", len(keys), len(groups), keys)
	}
	slots := map[int]bool{}
	for _, k := range keys {
		if !shape.MatchString(k) {
			t.Errorf("key %q is not prefix{sha256 hex}", k)
		}
		slots[redistest.Slot(k)] = true
	}
	if len(slots) != len(keys) {
		t.Errorf("%d keys share %d cluster slots; want them spread", len(keys), len(slots))
	}
	for _, g := range groups {
		k := rateCheckKey(prefix, g)
		if !m.Exists(k) {
			t.Errorf("no bucket at %q for group %q", k, g)
		}
	}
}

// rcBadArgs are ARGV pairs the script must refuse without touching the key.
var rcBadArgs = []struct {
	name        string
	rate, burst string
}{
	{"empty rate", "", "1"},
	{"nan", "nan", "1"},
	{"NaN", "NaN", "1"},
	{"inf", "inf", "1"},
	{"-inf", "-inf", "1"},
	{"infinity", "infinity", "1"},
	{"hex rate", "0x10", "1"},
	{"leading space", " 5", "1"},
	{"trailing space", "5 ", "1"},
	{"trailing newline", "5\n", "1"},
	{"plus sign", "+5", "1"},
	{"negative rate", "-5", "1"},
	{"zero rate", "0", "1"},
	{"zero rate with fraction", "0.000", "1"},
	{"exponent", "1e3", "1"},
	{"huge exponent", "1e400", "1"},
	{"rate above 1e9", "1000000001", "1"},
	{"overlong rate", strings.Repeat("1", 41), "1"},
	{"empty burst", "1", ""},
	{"zero burst", "1", "0"},
	{"negative burst", "1", "-1"},
	{"fractional burst", "1", "1.5"},
	{"burst with exponent", "1", "1e3"},
	{"hex burst", "1", "0x10"},
	{"burst with space", "1", " 1"},
	{"nan burst", "1", "nan"},
	{"burst above 1e9", "1000000000", "1000000001"},
	{"refill beyond a year", "1", "31536001"},
	{"refill far beyond a year", "0.000001", "1000"},
}

// rcScriptRejects runs the script directly with each bad ARGV pair and
// checks the error reply and that no key was written.
func rcScriptRejects(t *testing.T, c redis.UniversalClient, exists func(string) bool) {
	t.Helper()
	for _, tc := range rcBadArgs {
		t.Run(tc.name, func(t *testing.T) {
			key := rcPrefix() + "{bad}"
			_, err := rateCheckScript.Run(rcCtx(t), c, []string{key}, tc.rate, tc.burst).Result()
			if err == nil || !strings.Contains(err.Error(), "ratecheck: ") {
				t.Fatalf("rate %q burst %q: error %v, want the script's refusal", tc.rate, tc.burst, err)
			}
			if exists(key) {
				t.Fatal("a refused call wrote the bucket")
			}
		})
	}
	for _, tc := range []struct {
		name string
		keys []string
		args []any
	}{
		{"no key", nil, []any{"1", "1"}},
		{"two keys", []string{"a{x}", "b{x}"}, []any{"1", "1"}},
		{"one argument", []string{"a"}, []any{"1"}},
		{"three arguments", []string{"a"}, []any{"1", "1", "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := rateCheckScript.Run(rcCtx(t), c, tc.keys, tc.args...).Result(); err == nil || !strings.Contains(err.Error(), "ratecheck: ") {
				t.Fatalf("error %v, want the script's refusal", err)
			}
		})
	}
}

// rcScriptAgrees checks that NewRateCheck and the script accept the same
// policies, over bounds and seeded random values: a policy the Go side
// accepts must never be refused by Redis, and the other way round.
func rcScriptAgrees(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	policies := []admission.RatePolicy{
		{PerSecond: 1, Burst: 31536000}, {PerSecond: 1, Burst: 31536001},
		{PerSecond: 1e9, Burst: 1e9}, {PerSecond: 1.0 / 3, Burst: 1},
		{PerSecond: 1.0 / 31536000, Burst: 1}, {PerSecond: math.Nextafter(1.0/31536000, 0), Burst: 1},
		{PerSecond: 3.170979198376459e-08, Burst: 1}, {PerSecond: 0.1, Burst: 3153600},
		{PerSecond: 123456.789, Burst: 7}, {PerSecond: 5e-324, Burst: 1},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100 {
		policies = append(policies, admission.RatePolicy{
			PerSecond: math.Pow(10, rng.Float64()*18-9),
			Burst:     1 + rng.IntN(1e9),
		})
	}
	for _, p := range policies {
		goOK := validateRateCheckPolicy(p) == nil
		_, err := rateCheckScript.Run(rcCtx(t), c, []string{rcPrefix() + "{agree}"},
			strconv.FormatFloat(p.PerSecond, 'f', -1, 64), strconv.Itoa(p.Burst)).Result()
		if luaOK := err == nil; goOK != luaOK {
			t.Errorf("policy %+v: NewRateCheck accepts: %v, script accepts: %v (%v)", p, goOK, luaOK, err)
		}
	}
}

func TestRateCheckScriptValidation(t *testing.T) {
	m, c := rcMiniredis(t, time.Unix(1_700_000_000, 0))
	t.Run("refuses", func(t *testing.T) { rcScriptRejects(t, c, m.Exists) })
	t.Run("agrees with NewRateCheck", func(t *testing.T) { rcScriptAgrees(t, c) })
}

// rcCorrupt are stored bucket values the script must treat as an empty
// bucket and overwrite.
var rcCorrupt = []string{"", "garbage", "5", "nan 5", "inf 5", "-inf 5", "0x10 5", " 1 5", "1 -5", "-1 5", "1e3 5", "1 5 6", "2000000000 5", "1 nan"}

func TestRateCheckCorruptState(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 250_000_000)
	for _, v := range rcCorrupt {
		t.Run(strconv.Quote(v), func(t *testing.T) {
			m, c := rcMiniredis(t, t0)
			prefix := rcPrefix()
			check := rcNew(t, c, prefix, admission.RatePolicy{PerSecond: 2, Burst: 2})
			bucket := rateCheckKey(prefix, "k")
			if err := m.Set(bucket, v); err != nil {
				t.Fatal(err)
			}
			d, err := check(rcCtx(t), "k")
			if err != nil || d.Allowed || d.RetryAfter != 500*time.Millisecond {
				t.Fatalf("decision %+v, %v; want a denial of 500ms (empty bucket)", d, err)
			}
			if got, _ := m.Get(bucket); got != "0.00000000000000000 1700000000250000" {
				t.Fatalf("stored %q, want an empty bucket stamped now", got)
			}
			if got := m.TTL(bucket); got != time.Second {
				t.Fatalf("TTL %v, want 1s", got)
			}
			m.SetTime(t0.Add(500 * time.Millisecond))
			if d, err := check(rcCtx(t), "k"); err != nil || !d.Allowed {
				t.Fatalf("after healing: %+v, %v; want allowed", d, err)
			}
		})
	}
}

// TestRateCheckStampFromTheFuture stores a bucket stamped ahead of the
// server's TIME (as after a failover to a node whose clock lags): it earns
// nothing for the negative interval, and refill resumes from the server's now.
func TestRateCheckStampFromTheFuture(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	m, c := rcMiniredis(t, t0)
	prefix := rcPrefix()
	check := rcNew(t, c, prefix, admission.RatePolicy{PerSecond: 1, Burst: 5})
	bucket := rateCheckKey(prefix, "k")
	future := t0.Add(time.Hour).UnixMicro()
	if err := m.Set(bucket, fmt.Sprintf("0.5 %d", future)); err != nil {
		t.Fatal(err)
	}
	d, err := check(rcCtx(t), "k")
	if err != nil || d.Allowed || d.RetryAfter != 500*time.Millisecond {
		t.Fatalf("decision %+v, %v; want a denial of 500ms", d, err)
	}
	if got, _ := m.Get(bucket); got != fmt.Sprintf("0.50000000000000000 %d", t0.UnixMicro()) {
		t.Fatalf("stored %q, want the same tokens stamped now", got)
	}
	m.SetTime(t0.Add(500 * time.Millisecond))
	if d, err := check(rcCtx(t), "k"); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v; want allowed once refill resumed from now", d, err)
	}
}

func TestRateCheckSharedAcrossClients(t *testing.T) {
	m, c1 := rcMiniredis(t, time.Unix(1_700_000_000, 0))
	c2 := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer c2.Close()
	prefix := rcPrefix()
	p := admission.RatePolicy{PerSecond: 1, Burst: 3}
	a, b := rcNew(t, c1, prefix, p), rcNew(t, c2, prefix, p)
	for i, check := range []admission.RateCheck{a, b, a} {
		if d, err := check(rcCtx(t), "k"); err != nil || !d.Allowed {
			t.Fatalf("call %d: %+v, %v", i, d, err)
		}
	}
	for i, check := range []admission.RateCheck{a, b} {
		if d, err := check(rcCtx(t), "k"); err != nil || d.Allowed {
			t.Fatalf("call %d past the shared burst: %+v, %v", i, d, err)
		}
	}
	// Another prefix is another budget.
	other := rcNew(t, c2, rcPrefix(), p)
	if d, err := other(rcCtx(t), "k"); err != nil || !d.Allowed {
		t.Fatalf("other prefix: %+v, %v", d, err)
	}
}

// fakeRedisErr is an error reply as go-redis reports one.
type fakeRedisErr string

func (e fakeRedisErr) Error() string { return string(e) }
func (fakeRedisErr) RedisError()     {}

type fakeNetErr struct{ timeout bool }

func (e fakeNetErr) Error() string   { return "dial tcp 10.1.2.3:6379: secret-host" }
func (e fakeNetErr) Timeout() bool   { return e.timeout }
func (e fakeNetErr) Temporary() bool { return false }

func TestRateCheckFailureText(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fakeRedisErr("WRONGTYPE Operation against a key holding the wrong kind of value"), "redisstore: rate check failed: Redis replied WRONGTYPE"},
		{fakeRedisErr("ERR Error running script: user alice@example.com"), "redisstore: rate check failed: Redis replied ERR"},
		{fakeRedisErr("alice@example.com is not allowed"), "redisstore: rate check failed: Redis replied an error"},
		{fakeRedisErr("CLUSTERDOWN"), "redisstore: rate check failed: Redis replied CLUSTERDOWN"},
		{fakeRedisErr(""), "redisstore: rate check failed: Redis replied an error"},
		{&net.OpError{Op: "dial", Err: fakeNetErr{}}, "redisstore: rate check failed: network error"},
		{fakeNetErr{timeout: true}, "redisstore: rate check failed: network timeout"},
		{errors.New("redis: client is closed; password hunter2"), "redisstore: rate check failed: client error"},
		{fmt.Errorf("wrapped: %w", context.DeadlineExceeded), "redisstore: rate check failed: context deadline exceeded"},
	} {
		got := rateCheckFailure(tc.err)
		if got.Error() != tc.want {
			t.Errorf("rateCheckFailure(%q) = %q, want %q", tc.err, got, tc.want)
		}
		if errors.Unwrap(got) != nil && !errors.Is(got, context.DeadlineExceeded) {
			t.Errorf("rateCheckFailure(%q) keeps its cause in the chain", tc.err)
		}
	}
}

func TestRateCheckDecode(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply []any
		want  admission.RateDecision
		ok    bool
	}{
		{"allowed", []any{int64(1), int64(0)}, admission.RateDecision{Allowed: true}, true},
		{"denied", []any{int64(0), int64(1500)}, admission.RateDecision{RetryAfter: 1500 * time.Microsecond}, true},
		{"longest denial", []any{int64(0), maxRateCheckRetryMicros}, admission.RateDecision{RetryAfter: time.Duration(maxRateCheckRetryMicros) * time.Microsecond}, true},
		{"empty", []any{}, admission.RateDecision{}, false},
		{"short", []any{int64(1)}, admission.RateDecision{}, false},
		{"long", []any{int64(1), int64(0), "0"}, admission.RateDecision{}, false},
		{"allowed with a delay", []any{int64(1), int64(5)}, admission.RateDecision{}, false},
		{"denied without a delay", []any{int64(0), int64(0)}, admission.RateDecision{}, false},
		{"negative delay", []any{int64(0), int64(-5)}, admission.RateDecision{}, false},
		{"delay beyond any policy", []any{int64(0), maxRateCheckRetryMicros + 1}, admission.RateDecision{}, false},
		{"delay that would overflow", []any{int64(0), int64(math.MaxInt64)}, admission.RateDecision{}, false},
		{"odd verdict", []any{int64(2), int64(0)}, admission.RateDecision{}, false},
		{"negative verdict", []any{int64(-1), int64(0)}, admission.RateDecision{}, false},
		{"verdict as string", []any{"1", int64(0)}, admission.RateDecision{}, false},
		{"delay as string", []any{int64(0), "5"}, admission.RateDecision{}, false},
		{"delay as float", []any{int64(0), 5.5}, admission.RateDecision{}, false},
		{"nil elements", []any{nil, nil}, admission.RateDecision{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := decodeRateCheck(tc.reply)
			if tc.ok != (err == nil) || d != tc.want {
				t.Fatalf("decodeRateCheck(%v) = %+v, %v; want %+v, ok %v", tc.reply, d, err, tc.want, tc.ok)
			}
		})
	}
}

func FuzzRateCheckDecode(f *testing.F) {
	f.Add(int64(1), int64(0))
	f.Add(int64(0), int64(1))
	f.Add(int64(0), int64(-1))
	f.Add(int64(0), int64(math.MaxInt64))
	f.Fuzz(func(t *testing.T, allowed, wait int64) {
		d, err := decodeRateCheck([]any{allowed, wait})
		if err != nil {
			if d != (admission.RateDecision{}) {
				t.Fatalf("error with a non-zero decision %+v", d)
			}
			return
		}
		if d.Allowed && d.RetryAfter != 0 || !d.Allowed && d.RetryAfter <= 0 {
			t.Fatalf("decision %+v breaks RateDecision's rules", d)
		}
	})
}

const (
	rcSecretKey = "alice@example.com"
	rcPassword  = "hunter2-secret"
)

// rcWantSafe fails unless err is a plain failure whose text holds neither
// the group key nor the password, and RateAdmission turns it into
// rate_limit_unavailable.
func rcWantSafe(t *testing.T, check admission.RateCheck, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		for _, s := range []string{rcSecretKey, rcPassword} {
			if strings.Contains(e.Error(), s) {
				t.Fatalf("error %q leaks %q", e.Error(), s)
			}
		}
	}
	a, aerr := admission.NewRateAdmission(check, time.Second)
	if aerr != nil {
		t.Fatal(aerr)
	}
	d, aerr := a.Check(rcCtx(t), rcSecretKey)
	var se *loom.ServiceError
	if !errors.As(aerr, &se) || se.Name != "rate_limit_unavailable" || d.Allowed {
		t.Fatalf("through RateAdmission: %+v, %v; want rate_limit_unavailable", d, aerr)
	}
}

func TestRateCheckErrors(t *testing.T) {
	p := admission.RatePolicy{PerSecond: 1, Burst: 1}
	t.Run("server gone", func(t *testing.T) {
		m := miniredis.RunT(t)
		m.RequireAuth(rcPassword)
		opt, err := redis.ParseURL("redis://:" + rcPassword + "@" + m.Addr() + "/0")
		if err != nil {
			t.Fatal(err)
		}
		opt.MaxRetries = -1
		c := redis.NewClient(opt)
		defer c.Close()
		check := rcNew(t, c, rcPrefix(), p)
		if _, err := check(rcCtx(t), rcSecretKey); err != nil {
			t.Fatalf("with the server up: %v", err)
		}
		m.Close()
		_, err = check(rcCtx(t), rcSecretKey)
		if !strings.Contains(fmt.Sprint(err), "network") && !strings.Contains(fmt.Sprint(err), "client error") {
			t.Fatalf("error %v, want a network failure", err)
		}
		rcWantSafe(t, check, err)
	})
	t.Run("wrong password", func(t *testing.T) {
		m := miniredis.RunT(t)
		m.RequireAuth("the-right-one")
		c := redis.NewClient(&redis.Options{Addr: m.Addr(), Password: rcPassword})
		defer c.Close()
		check := rcNew(t, c, rcPrefix(), p)
		_, err := check(rcCtx(t), rcSecretKey)
		rcWantSafe(t, check, err)
	})
	t.Run("wrong type at the key", func(t *testing.T) {
		m, c := rcMiniredis(t, time.Unix(1_700_000_000, 0))
		prefix := rcPrefix()
		check := rcNew(t, c, prefix, p)
		m.HSet(rateCheckKey(prefix, rcSecretKey), "f", "v")
		_, err := check(rcCtx(t), rcSecretKey)
		// The embedded server reports a failed call in a script as ERR;
		// TestRateCheckRedisServer checks redis-server's WRONGTYPE.
		if err == nil || !strings.HasPrefix(err.Error(), "redisstore: rate check failed: Redis replied ") {
			t.Fatalf("error %v, want a Redis error reply", err)
		}
		rcWantSafe(t, check, err)
	})
	t.Run("error reply quoting the key", func(t *testing.T) {
		m, c := rcMiniredis(t, time.Unix(1_700_000_000, 0))
		check := rcNew(t, c, rcPrefix(), p)
		m.SetError("ERR refused for " + rcSecretKey + " with " + rcPassword)
		_, err := check(rcCtx(t), rcSecretKey)
		if err == nil || err.Error() != "redisstore: rate check failed: Redis replied ERR" {
			t.Fatalf("error %v", err)
		}
		rcWantSafe(t, check, err)
	})
	t.Run("caller already done", func(t *testing.T) {
		var calls atomic.Int64
		_, c := rcMiniredis(t, time.Unix(1_700_000_000, 0))
		c.AddHook(rcCountHook{&calls})
		check := rcNew(t, c, rcPrefix(), p)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if d, err := check(ctx, "k"); err != context.Canceled || d.Allowed {
			t.Fatalf("%+v, %v; want context.Canceled", d, err)
		}
		if calls.Load() != 0 {
			t.Fatalf("%d commands sent for a done context", calls.Load())
		}
	})
	t.Run("server never answers", func(t *testing.T) {
		// A listener that accepts and then says nothing, like a stalled host.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		held := make(chan net.Conn, 16)
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					close(held)
					return
				}
				held <- conn
			}
		}()
		defer func() {
			ln.Close()
			for conn := range held {
				conn.Close()
			}
		}()
		c := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1, Protocol: 2})
		defer c.Close()
		check := rcNew(t, c, rcPrefix(), p)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if d, err := check(ctx, rcSecretKey); err != context.DeadlineExceeded || d.Allowed {
			t.Fatalf("%+v, %v; want context.DeadlineExceeded", d, err)
		}
	})
}

// rcCountHook counts commands sent, pipelines included.
type rcCountHook struct{ n *atomic.Int64 }

func (h rcCountHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h rcCountHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h rcCountHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// rcOneRoundTrip checks that a check is one command once the server has the
// script: EVALSHA, with EVAL only the first time.
func rcOneRoundTrip(t *testing.T, c *redis.Client) {
	t.Helper()
	if err := c.ScriptFlush(rcCtx(t)).Err(); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	c.AddHook(rcCountHook{&calls})
	check := rcNew(t, c, rcPrefix(), admission.RatePolicy{PerSecond: 1e6, Burst: 1000})
	if _, err := check(rcCtx(t), "k"); err != nil {
		t.Fatal(err)
	}
	if got := calls.Load(); got != 2 {
		t.Fatalf("first check after SCRIPT FLUSH: %d commands, want 2 (EVALSHA, then EVAL)", got)
	}
	calls.Store(0)
	const n = 100
	for i := range n {
		if _, err := check(rcCtx(t), strconv.Itoa(i%7)); err != nil {
			t.Fatal(err)
		}
	}
	if got := calls.Load(); got != n {
		t.Fatalf("%d checks sent %d commands, want one each", n, got)
	}
}

func TestRateCheckOneRoundTripMiniredis(t *testing.T) {
	_, c := rcMiniredis(t, time.Unix(1_700_000_000, 0))
	rcOneRoundTrip(t, c)
}

// TestRateCheckRedisServer runs the checks that depend on the real Lua and
// TIME of a redis-server. Rates are slow enough that the few milliseconds a
// subtest takes cannot refill a whole token.
func TestRateCheckRedisServer(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	c := s.Client(t)
	exists := func(k string) bool { return c.Exists(rcCtx(t), k).Val() == 1 }

	t.Run("burst, then deny with RetryAfter and TTL from the policy", func(t *testing.T) {
		prefix := rcPrefix()
		check := rcNew(t, c, prefix, admission.RatePolicy{PerSecond: 0.001, Burst: 5})
		for i := range 5 {
			if d, err := check(rcCtx(t), rcSecretKey); err != nil || !d.Allowed || d.RetryAfter != 0 {
				t.Fatalf("call %d: %+v, %v", i, d, err)
			}
		}
		d, err := check(rcCtx(t), rcSecretKey)
		if err != nil || d.Allowed || d.RetryAfter < 990*time.Second || d.RetryAfter > 1000*time.Second {
			t.Fatalf("past the burst: %+v, %v; want a denial of about 1000s", d, err)
		}
		bucket := rateCheckKey(prefix, rcSecretKey)
		ttl, err := c.PTTL(rcCtx(t), bucket).Result()
		if err != nil || ttl < 4990*time.Second || ttl > 5000*time.Second {
			t.Fatalf("PTTL %v, %v; want about 5000s (refill from empty)", ttl, err)
		}
		keys, err := c.Keys(rcCtx(t), prefix+"*").Result()
		if err != nil || len(keys) != 1 || keys[0] != bucket {
			t.Fatalf("keys %q, %v; want only %q", keys, err, bucket)
		}
	})
	t.Run("idle key expiry follows the refill time", func(t *testing.T) {
		prefix := rcPrefix()
		check := rcNew(t, c, prefix, admission.RatePolicy{PerSecond: 20, Burst: 2})
		if _, err := check(rcCtx(t), "k"); err != nil {
			t.Fatal(err)
		}
		ttl, err := c.PTTL(rcCtx(t), rateCheckKey(prefix, "k")).Result()
		if err != nil || ttl <= 0 || ttl > 50*time.Millisecond {
			t.Fatalf("PTTL %v, %v; want at most 50ms (one token at 20/s)", ttl, err)
		}
	})
	t.Run("shared across clients", func(t *testing.T) {
		prefix := rcPrefix()
		p := admission.RatePolicy{PerSecond: 0.001, Burst: 2}
		a, b := rcNew(t, c, prefix, p), rcNew(t, s.Client(t), prefix, p)
		for i, check := range []admission.RateCheck{a, b} {
			if d, err := check(rcCtx(t), "k"); err != nil || !d.Allowed {
				t.Fatalf("call %d: %+v, %v", i, d, err)
			}
		}
		for i, check := range []admission.RateCheck{a, b} {
			if d, err := check(rcCtx(t), "k"); err != nil || d.Allowed {
				t.Fatalf("call %d past the shared burst: %+v, %v", i, d, err)
			}
		}
	})
	t.Run("script refuses bad arguments", func(t *testing.T) { rcScriptRejects(t, c, exists) })
	t.Run("script agrees with NewRateCheck", func(t *testing.T) { rcScriptAgrees(t, c) })
	t.Run("corrupt state", func(t *testing.T) {
		for _, v := range rcCorrupt {
			prefix := rcPrefix()
			check := rcNew(t, c, prefix, admission.RatePolicy{PerSecond: 0.001, Burst: 2})
			bucket := rateCheckKey(prefix, "k")
			if err := c.Set(rcCtx(t), bucket, v, 0).Err(); err != nil {
				t.Fatal(err)
			}
			d, err := check(rcCtx(t), "k")
			if err != nil || d.Allowed || d.RetryAfter < 990*time.Second {
				t.Fatalf("stored %q: %+v, %v; want a denial of about 1000s", v, d, err)
			}
			got, _ := c.Get(rcCtx(t), bucket).Result()
			tokens, stamp, _ := strings.Cut(got, " ")
			if _, err := strconv.ParseInt(stamp, 10, 64); tokens != "0.00000000000000000" || err != nil {
				t.Fatalf("stored %q healed to %q, want an empty bucket stamped now", v, got)
			}
			if ttl := c.PTTL(rcCtx(t), bucket).Val(); ttl < 1990*time.Second {
				t.Fatalf("stored %q: healed key TTL %v, want about 2000s", v, ttl)
			}
		}
	})
	t.Run("stamp from the future", func(t *testing.T) {
		prefix := rcPrefix()
		check := rcNew(t, c, prefix, admission.RatePolicy{PerSecond: 0.001, Burst: 2})
		bucket := rateCheckKey(prefix, "k")
		now, err := c.Time(rcCtx(t)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Set(rcCtx(t), bucket, fmt.Sprintf("0.5 %d", now.Add(time.Hour).UnixMicro()), 0).Err(); err != nil {
			t.Fatal(err)
		}
		if d, err := check(rcCtx(t), "k"); err != nil || d.Allowed || d.RetryAfter < 490*time.Second || d.RetryAfter > 500*time.Second {
			t.Fatalf("%+v, %v; want a denial of about 500s", d, err)
		}
		got, _ := c.Get(rcCtx(t), bucket).Result()
		tokens, stamp, _ := strings.Cut(got, " ")
		us, _ := strconv.ParseInt(stamp, 10, 64)
		if tokens != "0.50000000000000000" || us < now.UnixMicro() || us > now.Add(time.Minute).UnixMicro() {
			t.Fatalf("stored %q, want 0.5 tokens stamped with the server's now (%d)", got, now.UnixMicro())
		}
	})
	t.Run("wrong type at the key", func(t *testing.T) {
		prefix := rcPrefix()
		check := rcNew(t, c, prefix, admission.RatePolicy{PerSecond: 1, Burst: 1})
		if err := c.HSet(rcCtx(t), rateCheckKey(prefix, rcSecretKey), "f", rcPassword).Err(); err != nil {
			t.Fatal(err)
		}
		_, err := check(rcCtx(t), rcSecretKey)
		if err == nil || err.Error() != "redisstore: rate check failed: Redis replied WRONGTYPE" {
			t.Fatalf("error %v, want a WRONGTYPE failure", err)
		}
		rcWantSafe(t, check, err)
	})
	t.Run("one round trip", func(t *testing.T) { rcOneRoundTrip(t, s.Client(t)) })
	t.Run("through RateAdmission", func(t *testing.T) {
		check := rcNew(t, c, rcPrefix(), admission.RatePolicy{PerSecond: 0.001, Burst: 1})
		a, err := admission.NewRateAdmission(check, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := a.Check(rcCtx(t), "k"); err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
		if d, err := a.Check(rcCtx(t), "k"); err != nil || d.Allowed || d.RetryAfterSeconds() != 1000 {
			t.Fatalf("%+v, %v; want a denial with Retry-After 1000", d, err)
		}
	})
	t.Run("server paused", func(t *testing.T) {
		other := redistest.Start(t)
		oc := other.Client(t)
		check := rcNew(t, oc, rcPrefix(), admission.RatePolicy{PerSecond: 1, Burst: 1})
		if _, err := check(rcCtx(t), rcSecretKey); err != nil {
			t.Fatal(err)
		}
		other.Pause()
		defer other.Resume()
		a, _ := admission.NewRateAdmission(check, 100*time.Millisecond)
		d, err := a.Check(rcCtx(t), rcSecretKey)
		var se *loom.ServiceError
		if !errors.As(err, &se) || se.Name != "rate_limit_unavailable" || !se.Timeout || d.Allowed {
			t.Fatalf("%+v, %v; want a rate_limit_unavailable timeout", d, err)
		}
	})
}

// TestRateCheckCluster runs buckets on a three-master Redis Cluster: group
// keys spread over slots and masters, and each behaves as on one server.
func TestRateCheckCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, 0)
	cc := cl.Client(t)
	prefix := rcPrefix()
	check := rcNew(t, cc, prefix, admission.RatePolicy{PerSecond: 0.001, Burst: 2})
	slots := map[int]bool{}
	masters := map[string]bool{}
	const groups = 24
	for i := range groups {
		g := fmt.Sprintf("tenant-%d{}", i)
		for j, want := range []bool{true, true, false} {
			d, err := check(rcCtx(t), g)
			if err != nil || d.Allowed != want {
				t.Fatalf("group %q call %d: %+v, %v; want allowed %v", g, j, d, err, want)
			}
		}
		bucket := rateCheckKey(prefix, g)
		slots[redistest.Slot(bucket)] = true
		node := cl.NodeForKey(t, bucket)
		masters[node.Addr()] = true
		// The bucket sits on the master that serves its slot, and nowhere else
		// under a raw name.
		if n, err := node.Client(t).Exists(rcCtx(t), bucket).Result(); err != nil || n != 1 {
			t.Fatalf("group %q: bucket not on the master serving its slot (%d, %v)", g, n, err)
		}
	}
	if len(slots) != groups {
		t.Errorf("%d groups landed in %d slots", groups, len(slots))
	}
	if len(masters) != 3 {
		t.Errorf("%d groups landed on %d of 3 masters", groups, len(masters))
	}
	rcScriptAgrees(t, cc)
}

// Environment of TestRateCheckWorkerProcess, set by
// TestRateCheckSharedAcrossProcesses.
const (
	rcWorkerAddrEnv   = "RUNBUDGET_RATECHECK_WORKER_ADDR"
	rcWorkerPrefixEnv = "RUNBUDGET_RATECHECK_WORKER_PREFIX"
	rcWorkerFor       = 3 * time.Second
)

var rcWorkerPolicy = admission.RatePolicy{PerSecond: 100, Burst: 20}

// TestRateCheckWorkerProcess is not a test on its own: it is the worker that
// TestRateCheckSharedAcrossProcesses starts in separate processes, and does
// nothing unless that test's environment is set.
func TestRateCheckWorkerProcess(t *testing.T) {
	addr := os.Getenv(rcWorkerAddrEnv)
	if addr == "" {
		return
	}
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c.Close()
	check, err := NewRateCheck(c, os.Getenv(rcWorkerPrefixEnv), rcWorkerPolicy)
	if err != nil {
		t.Fatal(err)
	}
	var admitted, denied int
	for end := time.Now().Add(rcWorkerFor); time.Now().Before(end); {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		d, err := check(ctx, "shared")
		cancel()
		if err != nil {
			t.Fatalf("check: %v", err)
		}
		if d.Allowed {
			admitted++
		} else {
			denied++
		}
	}
	fmt.Printf("ratecheck-worker admitted=%d denied=%d\n", admitted, denied)
}

// TestRateCheckSharedAcrossProcesses starts four processes, each with its own
// client, hammering one group key for three seconds: together they must be
// admitted no more than Burst + PerSecond x elapsed, where elapsed runs from
// before the first process starts to after the last one exits, so the bound
// errs on the generous side.
func TestRateCheckSharedAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for several seconds")
	}
	t.Parallel()
	s := redistest.Start(t)
	prefix := rcPrefix()
	const workers = 4
	line := regexp.MustCompile(`^ratecheck-worker admitted=(\d+) denied=(\d+)$`)

	type result struct {
		admitted, denied int
		err              error
	}
	results := make(chan result, workers)
	start := time.Now()
	for range workers {
		// t.Context ends when the test does, which kills a worker left over
		// by a failed test.
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestRateCheckWorkerProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), rcWorkerAddrEnv+"="+s.Addr(), rcWorkerPrefixEnv+"="+prefix)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			r := result{admitted: -1}
			sc := bufio.NewScanner(out)
			var text []string
			for sc.Scan() {
				text = append(text, sc.Text())
				if m := line.FindStringSubmatch(sc.Text()); m != nil {
					r.admitted, _ = strconv.Atoi(m[1])
					r.denied, _ = strconv.Atoi(m[2])
				}
			}
			if err := cmd.Wait(); err != nil {
				r.err = fmt.Errorf("worker: %v; output:\n%s", err, strings.Join(text, "\n"))
			} else if r.admitted < 0 {
				r.err = fmt.Errorf("worker printed no count; output:\n%s", strings.Join(text, "\n"))
			}
			results <- r
		}()
	}
	var admitted, denied int
	for range workers {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		admitted += r.admitted
		denied += r.denied
	}
	elapsed := time.Since(start)

	bound := float64(rcWorkerPolicy.Burst) + rcWorkerPolicy.PerSecond*elapsed.Seconds()
	t.Logf("%d workers for %v: admitted %d, denied %d; bound %.1f", workers, elapsed.Round(time.Millisecond), admitted, denied, bound)
	if float64(admitted) > bound {
		t.Errorf("admitted %d across processes, more than Burst + rate x elapsed = %.1f", admitted, bound)
	}
	// The bound only means something if the workers asked for more than it.
	if float64(admitted+denied) <= 2*bound {
		t.Errorf("only %d checks in total: the load never pressed on the limit of %.1f", admitted+denied, bound)
	}
	// And the bucket did refill while they ran: more than the first burst got through.
	if admitted <= rcWorkerPolicy.Burst {
		t.Errorf("admitted %d, no more than the burst %d: refill never happened", admitted, rcWorkerPolicy.Burst)
	}
}
