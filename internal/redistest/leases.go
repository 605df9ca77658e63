package redistest

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// Lease records as a test sees them in Redis, without a script: each
// session of a budget's group keeps its leases in a hash of its own,
// <prefix>lx:<ce>:<sid>, where prefix is the group's ("rb:{<hex>}:") and ce
// the config's field of that name (luascripts/lib.lua, lxkey). Every such
// hash has one field that is no lease, the empty one.

// LeaseKey is the key of session sid's leases in the group under prefix.
func LeaseKey(ctx context.Context, c redis.UniversalClient, prefix, sid string) string {
	ce, err := c.HGet(ctx, prefix+"cfg", "ce").Result()
	if err != nil || ce == "" {
		ce = "0"
	}
	return prefix + "lx:" + ce + ":" + sid
}

// Leases returns the records of every lease of the group under prefix, by
// id, and the session each is in. Only sessions listed in sexp are read:
// a session's hash goes when it ends.
func Leases(ctx context.Context, c redis.UniversalClient, prefix string) (recs, sessions map[string]string) {
	recs, sessions = map[string]string{}, map[string]string{}
	for _, sid := range c.ZRange(ctx, prefix+"sexp", 0, -1).Val() {
		for id, v := range c.HGetAll(ctx, LeaseKey(ctx, c, prefix, sid)).Val() {
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

// FindLease is Lease with the error of a read that failed.
func FindLease(ctx context.Context, c redis.UniversalClient, prefix, id string) (string, bool, error) {
	ce, err := c.HGet(ctx, prefix+"cfg", "ce").Result()
	switch {
	case errors.Is(err, redis.Nil) || ce == "":
		ce = "0"
	case err != nil:
		return "", false, err
	}
	sids, err := c.ZRange(ctx, prefix+"sexp", 0, -1).Result()
	if err != nil {
		return "", false, err
	}
	for _, sid := range sids {
		v, err := c.HGet(ctx, prefix+"lx:"+ce+":"+sid, id).Result()
		if err == nil {
			return v, true, nil
		}
		if !errors.Is(err, redis.Nil) {
			return "", false, err
		}
	}
	return "", false, nil
}

// SessionLeases counts the leases of session sid.
func SessionLeases(ctx context.Context, c redis.UniversalClient, prefix, sid string) int {
	n := 0
	for id := range c.HGetAll(ctx, LeaseKey(ctx, c, prefix, sid)).Val() {
		if id != "" {
			n++
		}
	}
	return n
}
