package redistest

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/internal/recpack"
)

// Lease records as a test sees them in Redis, without a script: each
// session of a budget's group keeps its leases in a hash of its own,
// <prefix>lx:<ce>:<sid>, where prefix is the group's ("rb:{<hex>}:") and ce
// the config's field of that name (luascripts/lib.lua, lxkey). Every such
// hash has one field that is no lease, the empty one.

// LeaseKey is the key of session sid's leases in the group under prefix.
func LeaseKey(ctx context.Context, c redis.UniversalClient, prefix, sid string) string {
	ce, _ := configCE(ctx, c, prefix)
	return recpack.LeaseKey(prefix, ce, sid)
}

// configCE reads the group's ce ("" when its config has none, or is gone).
func configCE(ctx context.Context, c redis.UniversalClient, prefix string) (string, error) {
	ce, err := c.HGet(ctx, prefix+"cfg", "ce").Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return ce, err
}

// Leases returns the records of every lease of the group under prefix, by
// id, and the session each is in. Only sessions listed in sexp are read:
// a session's hash goes when it ends.
func Leases(ctx context.Context, c redis.UniversalClient, prefix string) (recs, sessions map[string]string) {
	recs, sessions = map[string]string{}, map[string]string{}
	ce, _ := configCE(ctx, c, prefix)
	for _, sid := range c.ZRange(ctx, prefix+"sexp", 0, -1).Val() {
		for id, v := range c.HGetAll(ctx, recpack.LeaseKey(prefix, ce, sid)).Val() {
			if id != "" {
				recs[id], sessions[id] = v, sid
			}
		}
	}
	return recs, sessions
}

// Lease returns lease id's record in the group under prefix, and whether
// there is one (false too when Redis could not be read: see FindLease).
func Lease(ctx context.Context, c redis.UniversalClient, prefix, id string) (string, bool) {
	v, ok, err := FindLease(ctx, c, prefix, id)
	return v, ok && err == nil
}

// FindLease is Lease with the error of a read that failed. It looks in
// the sessions first (where the caller expects the lease: its host's),
// then in every session's hash, in one pipeline: a budget of many hosts
// has as many sessions.
func FindLease(ctx context.Context, c redis.UniversalClient, prefix, id string, first ...string) (string, bool, error) {
	ce, err := configCE(ctx, c, prefix)
	if err != nil {
		return "", false, err
	}
	for _, sid := range first {
		if sid == "" {
			continue
		}
		v, err := c.HGet(ctx, recpack.LeaseKey(prefix, ce, sid), id).Result()
		if err == nil {
			return v, true, nil
		}
		if !errors.Is(err, redis.Nil) {
			return "", false, err
		}
	}
	sids, err := c.ZRange(ctx, prefix+"sexp", 0, -1).Result()
	if err != nil || len(sids) == 0 {
		return "", false, err
	}
	pipe := c.Pipeline()
	gets := make([]*redis.StringCmd, len(sids))
	for i, sid := range sids {
		gets[i] = pipe.HGet(ctx, recpack.LeaseKey(prefix, ce, sid), id)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return "", false, err
	}
	for _, g := range gets {
		if v, err := g.Result(); err == nil {
			return v, true, nil
		}
	}
	return "", false, nil
}

// SessionSpy is a go-redis hook that notes the latest session id a
// client's script calls named (an argument of the form <uuid>.<n>, as
// redisstore names its sessions), so a test that checks a host's grants
// can look in that host's session first (FindLease).
type SessionSpy struct{ sid atomic.Value }

// Session is the latest session id seen, or "".
func (s *SessionSpy) Session() string {
	v, _ := s.sid.Load().(string)
	return v
}

func (s *SessionSpy) note(args []any) {
	for _, a := range args {
		if v, ok := a.(string); ok && len(v) > 37 && v[36] == '.' && strings.Trim(v[37:], "0123456789") == "" {
			if _, err := uuid.Parse(v[:36]); err == nil {
				s.sid.Store(v)
			}
		}
	}
}

func (s *SessionSpy) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *SessionSpy) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.note(cmd.Args())
		return next(ctx, cmd)
	}
}

func (s *SessionSpy) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			s.note(c.Args())
		}
		return next(ctx, cmds)
	}
}
