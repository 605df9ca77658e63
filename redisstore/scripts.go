package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/luascripts"
)

// How the budget scripts reach Redis: as one function library (FCALL) on
// Redis 7, or one by one by EVALSHA, with or without a shebang line, and
// the common arguments every call sends first.

// scriptSet holds the budget scripts, built once; Run uses EVALSHA and falls
// back to EVAL (which also reloads the script) when Redis answers NOSCRIPT.
type scriptSet struct {
	register, acquire, cancel, retire, heartbeat, throttle, usage, reassert, inspect, reset, drop, renew *redis.Script
}

func newScriptSet(shebang bool) *scriptSet {
	load := func(name string) *redis.Script {
		src := luascripts.Source(name)
		if !shebang {
			src = luascripts.WithoutShebang(src)
		}
		return redis.NewScript(src)
	}
	return &scriptSet{
		register: load("register"), acquire: load("acquire"), cancel: load("cancel"), retire: load("retire"),
		heartbeat: load("heartbeat"), throttle: load("throttle"), usage: load("usage"), reassert: load("reassert"),
		inspect: load("inspect"), reset: load("reset"), drop: load("drop"), renew: load("renew"),
	}
}

var (
	// withShebang declares each script's flags: on Redis 7 a full Redis
	// (maxmemory, noeviction) refuses an admitting script as a whole rather
	// than at its first growing write, so nothing is admitted and nothing is
	// half-applied, while retirements (flagged allow-oom) still free slots.
	withShebang = newScriptSet(true)
	// noShebang serves servers that do not parse a shebang line (Redis
	// before 7, miniredis). There, a script that has already written goes on
	// writing past maxmemory.
	noShebang = newScriptSet(false)
)

// scriptsFor asks the server which script set it understands. A reply lost
// on the way is asked again (a few times, within ctx), so one network blip
// does not fail a host's start.
func scriptsFor(ctx context.Context, c redis.UniversalClient) (*scriptSet, error) {
	var err error
	for attempt := range 4 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("redisstore: probing the server: %w: %v", budget.ErrUnavailable, ctx.Err())
			case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
			}
		}
		err = c.Eval(ctx, "#!lua flags=no-writes\nreturn 1", nil).Err()
		switch {
		case err == nil:
			return withShebang, nil
		case strings.Contains(strings.ToLower(err.Error()), "compil"), strings.Contains(err.Error(), "syntax"):
			return noShebang, nil
		}
	}
	return nil, fmt.Errorf("redisstore: probing the server: %w: %v", budget.ErrUnavailable, err)
}

// library is the budget scripts as one Redis function library (Redis 7):
// FCALL runs a script without building lib.lua's helpers on every call,
// which is most of what an uncontended release costs Redis.
type library struct {
	name, src string
	functions map[string]string // script name -> function name
}

// libraryPrefix starts the name of every runbudget library.
const libraryPrefix = "runbudget_"

var budgetLibrary = func() *library {
	name, src, fns := luascripts.Library()
	return &library{name: name, src: src, functions: fns}
}()

// function is the library's function for script op, or "" when l is nil.
func (l *library) function(op string) string {
	if l == nil {
		return ""
	}
	return l.functions[op]
}

// loadLibrary loads the library on c (on every master of a Cluster). A
// library of the same name already there is the same code: fine.
func loadLibrary(ctx context.Context, c redis.UniversalClient) error {
	load := func(ctx context.Context, c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, budgetLibrary.src).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	return eachServer(ctx, c, load)
}

// functionMissing reports an FCALL refused because Redis does not have the
// library (a restart without persistence, FUNCTION FLUSH, a new master).
func functionMissing(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// eachServer runs fn on the one server, or on every master of a Cluster
// (concurrently): for what is per server rather than per key.
func eachServer(ctx context.Context, c redis.UniversalClient, fn func(context.Context, redis.Cmdable) error) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return fn(ctx, m) })
	}
	return fn(ctx, c)
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// commonArgs are the arguments every budget script takes first (lib.lua's
// conventions): the publish command, the idle TTL, and the clock, where ""
// means Redis TIME and a decimal is a test's time in microseconds.
func commonArgs(pubCmd string, idle time.Duration, clock func() time.Time, own ...any) []any {
	t := ""
	if clock != nil {
		t = strconv.FormatInt(clock().UnixMicro(), 10)
	}
	return append([]any{pubCmd, ms(idle), t}, own...)
}

// args prefixes a script's own arguments with the common ones.
func (s *Store) args(own ...any) []any {
	return commonArgs(s.pubCmd, s.idle, s.clock, own...)
}

// run runs the script named op and returns its reply as strings: the
// library's function where the server has the library, else sc by EVALSHA.
// The reply is not decoded: each script's decode helper (replies.go) does
// that.
func (s *Store) run(ctx context.Context, g *group, op string, sc *redis.Script, args ...any) ([]string, error) {
	var res []string
	var err error
	if fn := s.lib.function(op); fn != "" {
		res, err = s.fcall(ctx, g, fn, args).StringSlice()
	} else {
		res, err = sc.Run(ctx, s.client, g.keys, args...).StringSlice()
	}
	if err != nil {
		reloadSlots(ctx, s.client, err)
		return nil, s.classify(ctx, op, err)
	}
	return res, nil
}

// fcall calls library function fn for g, loading the library again (a few
// times) where Redis does not have it: nothing ran then.
func (s *Store) fcall(ctx context.Context, g *group, fn string, args []any) *redis.Cmd {
	cmd := s.client.FCall(ctx, fn, g.keys, args...)
	for try := 0; functionMissing(cmd.Err()) && try < 3; try++ {
		if err := loadLibrary(ctx, s.client); err != nil {
			return cmd
		}
		cmd = s.client.FCall(ctx, fn, g.keys, args...)
	}
	return cmd
}

// classify maps a failed call to the budget's errors: a script's refusal of
// an argument to ErrInvalidRequest, a budget kept in a layout newer than
// this build's to ErrLimitsConflict, the caller's cancellation to
// ctx.Err(), anything else (network, BUSY, OOM, LOADING, failover) to
// ErrUnavailable, which the budget retries within its grace.
func (s *Store) classify(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return s.explain(ctx.Err())
	}
	msg := err.Error()
	if i := strings.Index(msg, "RBINVAL "); i >= 0 {
		return fmt.Errorf("redisstore: %s: %w: %s", op, budget.ErrInvalidRequest, trimScriptNoise(msg[i+len("RBINVAL "):]))
	}
	if i := strings.Index(msg, "RBLAYOUT "); i >= 0 {
		return &layoutError{op: op, msg: trimScriptNoise(msg[i+len("RBLAYOUT "):])}
	}
	return s.explain(fmt.Errorf("redisstore: %s: %w: %v", op, budget.ErrUnavailable, err))
}

// layoutError is a script's refusal of a budget kept in a layout newer
// than this build's (lib.lua, LAYOUT): nothing was done, and retrying will
// not help. The stored budget does not fit this host, as other stored
// limits do not, so it is an ErrLimitsConflict, though its text says what
// is wrong instead.
type layoutError struct{ op, msg string }

func (e *layoutError) Error() string {
	return "redisstore: " + e.op + ": " + e.msg + ": every host of this budget needs a build that reads its layout"
}

func (e *layoutError) Is(target error) bool { return target == budget.ErrLimitsConflict }

// explain adds to err what this store's client saw that go-redis does
// not report: Redis refusing new connections for maxclients (refusals.go).
func (s *Store) explain(err error) error {
	if err == nil || !s.refusals.recent(time.Now()) {
		return err
	}
	return fmt.Errorf("%w (Redis refused new connections within the last %v: max number of clients reached)", err, refusalMemory)
}

// trimScriptNoise drops the script location Redis appends to error replies.
func trimScriptNoise(msg string) string {
	if i := strings.Index(msg, " script:"); i >= 0 {
		msg = msg[:i]
	}
	return strings.TrimSpace(msg)
}
