package main

import (
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
)

// parseRedisURL parses a Redis URL without ever putting the URL, or any
// piece of it that could hold the password, into an error: url.Parse quotes
// the whole input in its errors, so those are replaced by a fixed message.
func parseRedisURL(raw string) (*redis.Options, error) {
	const want = "want redis://[user:password@]host[:port][/db] or rediss://..."
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, usageError("bad Redis URL: no scheme (%s)", want)
	}
	if _, err := url.Parse(raw); err != nil {
		return nil, usageError("bad Redis URL: it does not parse as a URL (%s; not shown, since it may hold a password)", want)
	}
	switch scheme {
	case "redis", "rediss", "unix":
	default:
		return nil, usageError("bad Redis URL: scheme %q is not redis, rediss or unix", scheme)
	}
	opt, err := redis.ParseURL(raw)
	if err != nil {
		// After a successful url.Parse, go-redis's own messages name only
		// the scheme, the database path or option names; the caller still
		// redacts the password in case an option repeats it.
		return nil, usageError("bad Redis URL: %v", err)
	}
	return opt, nil
}

// urlSecrets returns the credentials a Redis URL may carry: its password as
// written and as decoded, and any password query option. It works on text
// that does not parse, too, taking the user info to be what stands between
// "://" and the last "@".
func urlSecrets(raw string) []string {
	var out []string
	add := func(s string) {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	rest := raw
	if _, after, ok := strings.Cut(rest, "://"); ok {
		rest = after
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		info := rest[:i]
		if _, pw, ok := strings.Cut(info, ":"); ok {
			add(pw)
			if dec, err := url.PathUnescape(pw); err == nil {
				add(dec)
			}
		}
	}
	if u, err := url.Parse(raw); err == nil {
		if pw, ok := u.User.Password(); ok {
			add(pw)
		}
		for k, vs := range u.Query() {
			if strings.Contains(strings.ToLower(k), "pass") {
				for _, v := range vs {
					add(v)
				}
			}
		}
	}
	return out
}

// parseDomain reads a quota domain given as V:ID: V is the version, an
// integer before the first colon; ID is everything after it, colons
// included, taken byte for byte. An ID that starts with a double quote must
// be one Go-quoted string, which is how budgetctl prints domains
// (v1:"acct-42"), so any printed domain can be pasted back; a leading "v"
// on the version is accepted for the same reason. The result passes
// budget.Domain.Validate.
func parseDomain(s string) (budget.Domain, error) {
	ver, id, ok := strings.Cut(s, ":")
	if !ok {
		return budget.Domain{}, fmt.Errorf("%w: %s has no colon; want V:ID, e.g. 1:acct-42", budget.ErrInvalidDomain, strconv.Quote(s))
	}
	digits := strings.TrimPrefix(ver, "v")
	v, err := strconv.Atoi(digits)
	if err != nil || digits == "" || digits[0] == '+' {
		return budget.Domain{}, fmt.Errorf("%w: version %s in %s is not an integer; want V:ID, e.g. 1:acct-42",
			budget.ErrInvalidDomain, strconv.Quote(ver), strconv.Quote(s))
	}
	if strings.HasPrefix(id, `"`) {
		u, err := strconv.Unquote(id)
		if err != nil {
			return budget.Domain{}, fmt.Errorf("%w: ID %s starts with a quote but is not one quoted string", budget.ErrInvalidDomain, strconv.Quote(id))
		}
		id = u
	}
	d := budget.Domain{Version: v, ID: id}
	if err := d.Validate(); err != nil {
		return budget.Domain{}, err
	}
	return d, nil
}

// limitKeys are the keys of a --set list, in the order help shows them:
// every class of budget's table names its in-flight ceiling.
var limitKeys = func() []string {
	keys := []string{"rps", "burst"}
	for _, c := range budget.Classes() {
		keys = append(keys, string(c))
	}
	return append(keys, "bodies")
}()

// applyLimitSet applies "key=value" assignments (each argument may hold
// several, separated by commas) to l and returns the result. A key names
// one dimension; 0 (or "-") makes it unbounded. Setting rps without burst
// resets burst to its default (one second of the new rate), since a burst
// sized for the old rate is rarely what an operator means. Errors name the
// key; unknown keys are errors, and so is memory. The result has no memory
// limit, even when l (stored by an older build) had one: Redis keeps none.
func applyLimitSet(l budget.Limits, sets []string) (budget.Limits, error) {
	out := l
	out.MemoryBytes = 0
	out.InFlight = make(map[budget.OpClass]int, len(l.InFlight))
	for c, n := range l.InFlight {
		out.InFlight[c] = n
	}
	var rpsSet, burstSet bool
	for _, arg := range sets {
		for item := range strings.SplitSeq(arg, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			key, val, ok := strings.Cut(item, "=")
			if !ok {
				return budget.Limits{}, usageError("--set: %s is not key=value (keys: %s)", strconv.Quote(item), strings.Join(limitKeys, ", "))
			}
			key, val = strings.ToLower(strings.TrimSpace(key)), strings.TrimSpace(val)
			if val == "-" {
				val = "0"
			}
			bad := func(what string) error {
				return usageError("--set: %s=%s: %s", key, strconv.Quote(val), what)
			}
			switch key {
			case "rps":
				f, err := strconv.ParseFloat(val, 64)
				if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
					return budget.Limits{}, bad("want a rate of zero or more requests per second")
				}
				out.RequestsPerSecond, rpsSet = f, true
			case "memory":
				// Storing it would make every host that joins conflict with
				// the stored limits: hosts send theirs without memory.
				return budget.Limits{}, usageError("--set: memory is each host's own (Limits.MemoryBytes of its Budget), not a limit kept in Redis")
			case "burst", "bodies":
				n, err := strconv.Atoi(val)
				if err != nil || n < 0 {
					return budget.Limits{}, bad("want a whole number, zero or more")
				}
				if key == "burst" {
					out.Burst, burstSet = n, true
				} else {
					out.OpenBodies = n
				}
			default:
				c := budget.OpClass(key)
				if c.Index() < 0 {
					return budget.Limits{}, usageError("--set: unknown key %s (keys: %s)", strconv.Quote(key), strings.Join(limitKeys, ", "))
				}
				n, err := strconv.Atoi(val)
				if err != nil || n < 0 {
					return budget.Limits{}, bad("want a whole number, zero or more")
				}
				if n == 0 {
					delete(out.InFlight, c)
				} else {
					out.InFlight[c] = n
				}
			}
		}
	}
	if rpsSet && !burstSet {
		out.Burst = 0
	}
	if len(out.InFlight) == 0 {
		out.InFlight = nil
	}
	return out, nil
}
