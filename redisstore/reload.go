package redisstore

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// A ClusterClient learns that a slot moved from a MOVED or ASK reply, or
// from its periodic reload (ClusterStateReloadInterval, 60 s by default).
// A master killed outright sends neither: the client keeps dialling the
// dead address until the next periodic reload, long after its replica took
// over (go-redis issue #3979; measured here: no successful call for 40 s).
// So a call that fails in a way a changed topology explains asks the
// client to reload its slot map. ReloadState is already bounded the way a
// storm of failing lanes needs: one reload runs at a time, followed by a
// 200 ms pause, and requests during either collapse into one more reload.

// reloadSlots asks c to reload its slot map when err suggests the map is
// stale: a connection error or timeout, or a reply saying the cluster (or a
// slot's master) is down or moved to a replica. Other clients, and server
// replies that say nothing about topology, are left alone.
func reloadSlots(ctx context.Context, c redis.UniversalClient, err error) {
	cc, ok := c.(*redis.ClusterClient)
	if !ok || err == nil || ctx.Err() != nil || !topologyError(err) {
		return
	}
	cc.ReloadState(ctx)
}

// topologyError reports errors that a stale slot map explains.
func topologyError(err error) bool {
	if errors.Is(err, context.Canceled) {
		return false
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return true // the network: refused, reset, timed out
	}
	msg := rerr.Error()
	for _, p := range []string{"CLUSTERDOWN", "MASTERDOWN", "READONLY", "TRYAGAIN", "LOADING"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
