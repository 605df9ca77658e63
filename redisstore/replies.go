package redisstore

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/runbudget/runbudget/budget"
)

// Reply codes: the first field of every budget script's reply, named as
// lib.lua names them (replyOK is R_OK, and so on). The values are the wire
// format shared with the scripts; change both sides together (a test
// compares them). Each script's reply is decoded by one helper below, which
// checks the code and the reply's length before it reads a field.
const (
	replyOK           = "1"  // R_OK: done; further fields are the result
	replyGranted      = "1"  // R_GRANTED: acquire granted; the grant's age in us
	replyQueued       = "2"  // R_QUEUED: acquire queued; wait for a wake event
	replyDelayed      = "3"  // R_DELAYED: acquire held back by time; the wait in us
	replyUnregistered = "-2" // R_UNREGISTERED: the budget's config is missing
	replyConflict     = "-3" // R_CONFLICT: register found other limits; their JSON
	replyNewEpoch     = "-3" // R_NEW_EPOCH: heartbeat found a new epoch; the epoch
	replyNoState      = "0"  // R_NO_STATE: reset found no state for the domain
	replySessionGone  = "-4" // R_SESSION_GONE: acquire or heartbeat named a dead session
)

// errNotRegistered is a script's R_UNREGISTERED: the budget's config is not
// in Redis, because it was never stored or because Redis lost it. Store
// calls register again and retry; Admin reports ErrNoBudget.
var errNotRegistered = errors.New("redisstore: the budget's config is missing")

// errSessionGone is a script's R_SESSION_GONE: the session the call named
// is dead (it expired, and reclaim may have ended it). Nothing was granted;
// the store starts its next session and calls again.
var errSessionGone = errors.New("redisstore: the session is gone")

// unexpected is the error for a reply no decoder accepts.
func unexpected(op string, res []string) error {
	return fmt.Errorf("redisstore: %s: unexpected reply %q", op, res)
}

// code returns the reply's code and its length, "" for an empty reply.
func code(res []string) (string, int) {
	if len(res) == 0 {
		return "", 0
	}
	return res[0], len(res)
}

// decodeOK decodes the reply of a script that only succeeds (cancel,
// retire): {R_OK}.
func decodeOK(op string, res []string) error {
	if c, n := code(res); c == replyOK && n == 1 {
		return nil
	}
	return unexpected(op, res)
}

// decodeRegister decodes register.lua's reply into the budget's epoch.
// Other stored limits give an error wrapping budget.ErrLimitsConflict that
// names both (name is the budget's, mine the limits sent as JSON).
func decodeRegister(res []string, name string, mine []byte) (epoch string, err error) {
	switch c, n := code(res); {
	case c == replyOK && n == 2:
		return res[1], nil
	case c == replyConflict && n == 2:
		return "", fmt.Errorf("%w: budget %q holds %s, this host has %s", budget.ErrLimitsConflict, name, res[1], mine)
	}
	return "", unexpected("register", res)
}

// acquireReply is acquire.lua's reply, decoded.
type acquireReply struct {
	outcome budget.Outcome
	age     time.Duration // Granted: how long before the call the grant was made
	wait    time.Duration // Delayed: how long to sleep before trying again
	left    time.Duration // Queued: how long at least its session lives from the call's run
}

// decodeAcquire decodes acquire.lua's reply. errNotRegistered means the
// config is missing, errSessionGone that the session named is dead.
func decodeAcquire(res []string) (acquireReply, error) {
	us := func(i int, min int64) (time.Duration, bool) {
		v, err := strconv.ParseInt(res[i], 10, 64)
		return time.Duration(v) * time.Microsecond, err == nil && v >= min
	}
	switch c, n := code(res); {
	case c == replyGranted && n == 2:
		if age, ok := us(1, 0); ok {
			return acquireReply{outcome: budget.Granted, age: age}, nil
		}
	case c == replyQueued && n == 1:
		return acquireReply{outcome: budget.Queued}, nil
	case c == replyQueued && n == 2:
		if left, ok := us(1, 0); ok {
			return acquireReply{outcome: budget.Queued, left: left}, nil
		}
	case c == replyDelayed && n == 2:
		if wait, ok := us(1, 1); ok {
			return acquireReply{outcome: budget.Delayed, wait: wait}, nil
		}
	case c == replyUnregistered && n == 1:
		return acquireReply{}, errNotRegistered
	case c == replySessionGone && n == 1:
		return acquireReply{}, errSessionGone
	}
	return acquireReply{}, unexpected("acquire", res)
}

// heartbeatReply is heartbeat.lua's reply, decoded: the ids of the
// session's leases an operator dropped, or gone (the session is dead, and
// every lease in it with it), or the budget's new epoch (non-empty), which
// the host must re-assert its leases under before they are renewed.
type heartbeatReply struct {
	dropped  []string
	gone     bool
	newEpoch string
}

// decodeHeartbeat decodes heartbeat.lua's reply; errNotRegistered means
// the config is missing.
func decodeHeartbeat(res []string) (heartbeatReply, error) {
	switch c, n := code(res); {
	case c == replyOK:
		return heartbeatReply{dropped: res[1:]}, nil
	case c == replySessionGone && n == 1:
		return heartbeatReply{gone: true}, nil
	case c == replyNewEpoch && n == 2 && res[1] != "":
		return heartbeatReply{newEpoch: res[1]}, nil
	case c == replyUnregistered && n == 1:
		return heartbeatReply{}, errNotRegistered
	}
	return heartbeatReply{}, unexpected("heartbeat", res)
}

// decodeThrottle decodes throttle.lua's reply into the domain's rate factor
// after the report; errNotRegistered means the config is missing.
func decodeThrottle(res []string) (float64, error) {
	switch c, n := code(res); {
	case c == replyOK && n == 2:
		if f, err := strconv.ParseFloat(res[1], 64); err == nil && f > 0 && f <= 1 {
			return f, nil
		}
	case c == replyUnregistered && n == 1:
		return 0, errNotRegistered
	}
	return 0, unexpected("throttle", res)
}

// decodeCount decodes the reply of a script that counts what it did
// (reassert, drop): {R_OK, count}. errNotRegistered means the config is
// missing.
func decodeCount(op string, res []string) (int, error) {
	switch c, n := code(res); {
	case c == replyOK && n == 2:
		if v, err := strconv.Atoi(res[1]); err == nil && v >= 0 {
			return v, nil
		}
	case c == replyUnregistered && n == 1:
		return 0, errNotRegistered
	}
	return 0, unexpected(op, res)
}

// decodeReset decodes reset.lua's reply: whether the domain had state.
// errNotRegistered means the budget does not exist.
func decodeReset(res []string) (bool, error) {
	switch c, n := code(res); {
	case c == replyOK && n == 1:
		return true, nil
	case c == replyNoState && n == 1:
		return false, nil
	case c == replyUnregistered && n == 1:
		return false, errNotRegistered
	}
	return false, unexpected("reset", res)
}

// decodeInspect decodes inspect.lua's reply into its JSON document.
// errNotRegistered means the budget does not exist.
func decodeInspect(res []string) (string, error) {
	switch c, n := code(res); {
	case c == replyOK && n == 2:
		return res[1], nil
	case c == replyUnregistered && n == 1:
		return "", errNotRegistered
	}
	return "", unexpected("inspect", res)
}

// decodeUsage decodes usage.lua's reply. errNotRegistered means nothing is
// stored. MemoryHeld stays 0: memory is each host's, not Redis's.
func decodeUsage(res []string) (budget.Usage, error) {
	switch c, n := code(res); {
	case c == replyUnregistered && n == 1:
		return budget.Usage{}, errNotRegistered
	case c != replyOK:
		return budget.Usage{}, unexpected("usage", res)
	}
	res = res[1:]
	const row = budget.NumClasses + 5 // enc, counts by class, bodies, factor, pause, queue
	if len(res) < 1 || (len(res)-1)%row != 0 {
		return budget.Usage{}, fmt.Errorf("redisstore: usage: malformed reply of %d fields", len(res))
	}
	var u budget.Usage
	var err error
	bad := func(what string) (budget.Usage, error) {
		return budget.Usage{}, fmt.Errorf("redisstore: usage: malformed %s", what)
	}
	if u.Waiters, err = strconv.Atoi(res[0]); err != nil {
		return bad("waiter count")
	}
	for r := res[1:]; len(r) >= row; r = r[row:] {
		d, err := decodeDomain(r[0])
		if err != nil {
			return budget.Usage{}, err
		}
		du := budget.DomainUsage{Domain: d}
		for i, c := range budget.Classes() {
			n, err := strconv.Atoi(r[1+i])
			if err != nil {
				return bad("in-flight count")
			}
			if n > 0 {
				if du.InFlight == nil {
					du.InFlight = make(map[budget.OpClass]int)
				}
				du.InFlight[c] = n
			}
		}
		tail := r[1+budget.NumClasses : row]
		if du.OpenBodies, err = strconv.Atoi(tail[0]); err != nil {
			return bad("body count")
		}
		if du.RateFactor, err = strconv.ParseFloat(tail[1], 64); err != nil {
			return bad("rate factor")
		}
		pause, err := strconv.ParseInt(tail[2], 10, 64)
		if err != nil {
			return bad("pause")
		}
		du.Paused = time.Duration(pause) * time.Microsecond
		if du.Waiters, err = strconv.Atoi(tail[3]); err != nil {
			return bad("queue length")
		}
		u.Domains = append(u.Domains, du)
	}
	sortDomains(u.Domains)
	return u, nil
}

// renewReply is renew.lua's reply, decoded: one status per id sent
// (renewWaiting, renewGranted, renewGone), or held (the budget is
// quarantined: nothing was renewed).
type renewReply struct {
	status string
	held   bool
}

// The statuses of renew.lua, one character per id.
const (
	renewWaiting = 'w' // still queued: its deadline was pushed a TTL on
	renewGranted = 'g' // its lease exists: a handoff, whose wake may be lost
	renewGone    = 'x' // neither queued nor granted
)

// decodeRenew decodes renew.lua's reply for n ids; errNotRegistered means
// the config is missing.
func decodeRenew(res []string, n int) (renewReply, error) {
	switch c, k := code(res); {
	case c == replyOK && k == 2 && len(res[1]) == n:
		for i := range n {
			if b := res[1][i]; b != renewWaiting && b != renewGranted && b != renewGone {
				return renewReply{}, unexpected("renew", res)
			}
		}
		return renewReply{status: res[1]}, nil
	case c == replyDelayed && k == 2:
		return renewReply{held: true}, nil
	case c == replyDelayed && k == 3 && len(res[2]) == n:
		// Quarantined: the sessions were renewed, nobody was tried.
		return renewReply{held: true, status: res[2]}, nil
	case c == replyUnregistered && k == 1:
		return renewReply{}, errNotRegistered
	}
	return renewReply{}, unexpected("renew", res)
}
