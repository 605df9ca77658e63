package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/admission"
	"github.com/runbudget/runbudget/luascripts"
)

// rateCheckScript is the token bucket behind NewRateCheck. Built once, so its
// SHA1 is computed once; Run sends EVALSHA and falls back to EVAL only when
// the server does not have the script yet.
var rateCheckScript = redis.NewScript(luascripts.Source("ratecheck"))

// Bounds NewRateCheck enforces beyond admission.RatePolicy's own rules. The
// script checks the same ones, so a client built with other bounds cannot
// write a bucket this one misreads.
const (
	// maxRateCheckPerSecond is far above what one Redis key can serve.
	maxRateCheckPerSecond = 1e9
	// maxRateCheckBurst keeps the fraction of a token a bucket holds exact enough
	// in the float64 the script counts with.
	maxRateCheckBurst = 1_000_000_000
	// maxRateCheckRefill bounds the time an empty bucket takes to fill, and with
	// it how long an idle group's key lives.
	maxRateCheckRefill = 365 * 24 * time.Hour
	maxRateCheckPrefix = 256
)

// NewRateCheck returns an admission.RateCheck that keeps one token bucket per
// group key in Redis, so that every replica calling it with the same prefix
// and key draws on one allowance. Each check is one script call (one round
// trip once the script is cached on the server), and the bucket refills on
// Redis TIME, never on a client's clock.
//
// The bucket for key is stored under prefix + "{" + hex(SHA-256(key)) + "}".
// Hashing the key keeps arbitrary bytes (braces, newlines) out of the Redis
// key, and makes the hash the key's cluster hash tag, so different groups
// spread over a Cluster's slots. A bucket starts full and its key expires
// when it would be full again, so idle groups leave nothing behind.
//
// Every replica sharing a prefix should use the same policy. If they differ,
// each check applies its caller's policy to the shared bucket: what it holds
// is cut to the caller's burst and refills at the caller's rate.
//
// prefix must be 1 to 256 bytes of printable UTF-8 with no space, "{" or "}"
// (a brace would take over the hash tag); end it with a separator such as ":"
// for readable keys. policy must satisfy admission.RatePolicy, and also stay
// within what one Redis bucket handles well: PerSecond at most 1e9, Burst at
// most 1e9, and Burst/PerSecond (the time to refill from empty, which is also
// how long an idle key lives) at most 365 days. Anything else is refused with
// an error, before any call to Redis.
//
// The returned check is safe for concurrent use. It returns the zero
// decision and ctx.Err() when ctx is done, and an error whose text names
// neither the group key nor any credential when Redis fails; it never allows
// on error. Set the client's own timeouts too: ctx bounds a call only when the
// client has ContextTimeoutEnabled.
func NewRateCheck(client redis.UniversalClient, prefix string, policy admission.RatePolicy) (admission.RateCheck, error) {
	if client == nil {
		return nil, errors.New("redisstore: NewRateCheck: nil client")
	}
	if err := validateRateCheckPrefix(prefix); err != nil {
		return nil, err
	}
	if err := validateRateCheckPolicy(policy); err != nil {
		return nil, err
	}
	rc := &rateCheck{
		client:  client,
		prefix:  prefix,
		rateArg: strconv.FormatFloat(policy.PerSecond, 'f', -1, 64),
		burst:   strconv.Itoa(policy.Burst),
	}
	return rc.check, nil
}

func validateRateCheckPrefix(prefix string) error {
	switch {
	case prefix == "":
		return errors.New("redisstore: NewRateCheck: empty prefix")
	case len(prefix) > maxRateCheckPrefix:
		return fmt.Errorf("redisstore: NewRateCheck: prefix longer than %d bytes", maxRateCheckPrefix)
	case !utf8.ValidString(prefix):
		return errors.New("redisstore: NewRateCheck: prefix is not valid UTF-8")
	case strings.ContainsAny(prefix, "{}"):
		return errors.New(`redisstore: NewRateCheck: prefix contains "{" or "}", which would change the keys' cluster hash tag`)
	}
	for _, r := range prefix {
		if !unicode.IsPrint(r) || r == ' ' {
			return errors.New("redisstore: NewRateCheck: prefix contains a space or a non-printable character")
		}
	}
	return nil
}

func validateRateCheckPolicy(p admission.RatePolicy) error {
	switch {
	case math.IsNaN(p.PerSecond) || math.IsInf(p.PerSecond, 0) || p.PerSecond <= 0:
		return fmt.Errorf("redisstore: NewRateCheck: PerSecond must be positive and finite, got %v", p.PerSecond)
	case p.PerSecond > maxRateCheckPerSecond:
		return fmt.Errorf("redisstore: NewRateCheck: PerSecond %v above the maximum %v", p.PerSecond, float64(maxRateCheckPerSecond))
	case p.Burst <= 0:
		return fmt.Errorf("redisstore: NewRateCheck: Burst must be positive, got %d", p.Burst)
	case p.Burst > maxRateCheckBurst:
		return fmt.Errorf("redisstore: NewRateCheck: Burst %d above the maximum %d", p.Burst, maxRateCheckBurst)
	case !(float64(p.Burst)/p.PerSecond <= maxRateCheckRefill.Seconds()):
		// The same division, in the same float64, as the script's check.
		return fmt.Errorf("redisstore: NewRateCheck: Burst/PerSecond is %v s, above the maximum refill time %v", float64(p.Burst)/p.PerSecond, maxRateCheckRefill)
	}
	return nil
}

type rateCheck struct {
	client  redis.Scripter
	prefix  string
	rateArg string // ARGV[1], formatted once
	burst   string // ARGV[2], formatted once
}

func (rc *rateCheck) check(ctx context.Context, key string) (admission.RateDecision, error) {
	if err := ctx.Err(); err != nil {
		return admission.RateDecision{}, err
	}
	reply, err := rateCheckScript.Run(ctx, rc.client, []string{rateCheckKey(rc.prefix, key)}, rc.rateArg, rc.burst).Slice()
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return admission.RateDecision{}, cerr
		}
		// With ContextTimeoutEnabled the client sets the socket deadline to
		// ctx's, so a read can time out a moment before ctx's own timer
		// marks it done. That is still the caller's deadline, not a fault.
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return admission.RateDecision{}, context.DeadlineExceeded
		}
		return admission.RateDecision{}, rateCheckFailure(err)
	}
	return decodeRateCheck(reply)
}

// rateCheckKey is the bucket's Redis key for a group key: the prefix, then
// the hex SHA-256 of the group key as the hash tag. The raw group key never
// reaches Redis.
func rateCheckKey(prefix, key string) string {
	sum := sha256.Sum256([]byte(key))
	b := make([]byte, 0, len(prefix)+2+hex.EncodedLen(len(sum)))
	b = append(b, prefix...)
	b = append(b, '{')
	b = hex.AppendEncode(b, sum[:])
	b = append(b, '}')
	return string(b)
}

// maxRateCheckRetryMicros bounds a denial's delay: at most the time to refill
// from empty, which the policy checks bound.
var maxRateCheckRetryMicros = maxRateCheckRefill.Microseconds() + 1

// errRateCheckReply reports a script reply of the wrong shape or range. The
// script never sends one, so it points at whatever stands between the client
// and Redis (a proxy, say); the call is refused, never allowed.
var errRateCheckReply = errors.New("redisstore: rate check: malformed reply from Redis")

// decodeRateCheck turns the script's reply into a decision, checking the
// shape, every element's type and the range of the delay.
func decodeRateCheck(reply []any) (admission.RateDecision, error) {
	if len(reply) != 2 {
		return admission.RateDecision{}, errRateCheckReply
	}
	allowed, ok1 := reply[0].(int64)
	wait, ok2 := reply[1].(int64)
	switch {
	case !ok1 || !ok2:
		return admission.RateDecision{}, errRateCheckReply
	case allowed == 1 && wait == 0:
		return admission.RateDecision{Allowed: true}, nil
	case allowed == 0 && wait >= 1 && wait <= maxRateCheckRetryMicros:
		return admission.RateDecision{RetryAfter: time.Duration(wait) * time.Microsecond}, nil
	}
	return admission.RateDecision{}, errRateCheckReply
}

// rateCheckError is a Redis failure reduced to a fixed description. Network
// errors carry addresses, Redis errors can quote arguments, and a URL-built
// client's errors could in principle carry a password; none of that belongs
// in an error that may be logged next to a request, so the cause is dropped.
type rateCheckError struct{ what string }

func (e *rateCheckError) Error() string { return "redisstore: rate check failed: " + e.what }

// rateCheckFailure classifies err without keeping any of its text, except a
// Redis error's leading code word (WRONGTYPE, NOSCRIPT, CLUSTERDOWN, ...),
// which is a fixed token and tells an operator where to look.
func rateCheckFailure(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("redisstore: rate check failed: %w", context.DeadlineExceeded)
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("redisstore: rate check failed: %w", context.Canceled)
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		code, _, _ := strings.Cut(rerr.Error(), " ")
		if code == "" || len(code) > 20 || strings.TrimFunc(code, func(r rune) bool { return r >= 'A' && r <= 'Z' }) != "" {
			code = "an error"
		}
		return &rateCheckError{what: "Redis replied " + code}
	}
	var nerr net.Error
	if errors.As(err, &nerr) {
		if nerr.Timeout() {
			return &rateCheckError{what: "network timeout"}
		}
		return &rateCheckError{what: "network error"}
	}
	return &rateCheckError{what: "client error"}
}
