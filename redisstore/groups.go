package redisstore

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/luascripts"
)

// Shard groups. Without WithShardKey a budget is one group: all of its
// state in one Redis slot, so every admission of the run goes through one
// Redis core. With it, domains whose keys are equal form a group, and each
// group is what a whole budget was before: its own config, arrival tickets,
// queues, domains, leases and wake channel, under a hash tag of its own, so
// groups spread over a Cluster's masters and the run's admissions scale
// with its independent quota domains.
//
// Groups are found through a registry, a zset in the slot of the budget's
// name: every host lists a group when it first uses it, and again while it
// keeps using it (with its heartbeats, at most once per quarter of the idle
// TTL); an entry not listed again for an idle TTL is dropped, as the group's
// own keys expire after the same time without use. Usage, Admin and the
// metrics exporter read it: one small call, then one call per group,
// instead of scanning every master's keyspace.

// WithShardKey spreads the budget over shard groups: domains with equal
// key(d) share a group (its state, FIFO order and wake channel live in one
// Redis slot), and different groups are independent, so on a Redis Cluster
// they spread over the masters. A request must stay inside one group:
// Acquire refuses one whose domains fall in two with an error wrapping
// budget.ErrInvalidRequest, so key must put domains that are metered
// together (a copy's source and destination, say) in the same group.
// Every host of a run must use the same key function. key must be cheap
// and must not panic; its result may be any string.
func WithShardKey(key func(budget.Domain) string) Option {
	return func(s *Store) { s.shardKey = key }
}

// groupPrefix returns the prefix of every key of one group. An unsharded
// budget's one group is "rb:{<hex of name>}:", as before groups existed; a
// shard group is "rb:{<hex of name>.<hex of key>}:". Hex has neither "."
// nor braces, so the pair is recovered unambiguously, the whole pair is the
// hash tag, and no two (name, key) pairs, nor a shard group and an
// unsharded budget, share a key.
func groupPrefix(name string, sharded bool, key string) string {
	if !sharded {
		return keyPrefix(name)
	}
	return "rb:{" + hex.EncodeToString([]byte(name)) + "." + hex.EncodeToString([]byte(key)) + "}:"
}

// registryKey is the zset that lists a sharded budget's groups, and
// limitsKey holds its limits, both in the slot of its name.
func registryKey(name string) string { return keyPrefix(name) + "groups" }
func limitsKey(name string) string   { return keyPrefix(name) + "limits" }

// parseGroupKey recovers the budget's name and, for a shard group, its key
// from a config key; sharded says which it is.
func parseGroupKey(cfgKey string) (name, key string, sharded, ok bool) {
	s, ok := strings.CutPrefix(cfgKey, "rb:{")
	if !ok {
		return "", "", false, false
	}
	tag, ok := strings.CutSuffix(s, "}:cfg")
	if !ok {
		return "", "", false, false
	}
	hn, hk, sharded := strings.Cut(tag, ".")
	n, err := hex.DecodeString(hn)
	if err != nil {
		return "", "", false, false
	}
	k, err := hex.DecodeString(hk)
	if err != nil {
		return "", "", false, false
	}
	return string(n), string(k), sharded, true
}

// group is one shard group as this process sees it.
type group struct {
	key     string   // shard key ("" in an unsharded budget)
	prefix  string   // of every key of the group
	keys    []string // KEYS of every script: the group's config hash (and, on a Cluster, slotGuard)
	channel string   // this process's wake channel in the group
	slot    int      // the Cluster hash slot of its keys and channel

	homing bool // its channel is being subscribed again (see hub.go), guarded by Store.hubMu

	// Guarded by Store.mu.
	epoch  string    // the group's epoch this store last saw; see reassert
	used   time.Time // when a call of this store last touched the group
	listed time.Time // when this store last listed the group in the registry

	// This process's session in the group (see sessions.go), guarded by
	// Store.mu too.
	gen         int                  // the session's generation: the next one starts when it is dead
	sid         string               // the session's id: the process's name and gen
	renewed     time.Time            // Redis keeps the session alive at least a TTL from this moment
	keysRenewed time.Time            // when a heartbeat last renewed the idle TTLs of the session's keys
	domsRenewed map[string]time.Time // domains of leases held, and when a heartbeat last checked their keys
	done        map[doneID]struct{}  // what the next heartbeat cancels: see heartbeat.lua
	flushAt     time.Time            // when renewals may send done's cancels themselves (flushDone); zero: not yet planned

	commit committer // this process's calls to the group in flight and queued (batch.go)

	ready chan struct{} // closed once the group is set up (subscribed, limits checked)
	err   error         // why set-up failed, read after ready is closed
}

var groupsScript = redis.NewScript(luascripts.WithoutShebang(luascripts.Source("groups")))

// registryCall runs the registry script for budget name: it lists hexKeys
// (none: only reads), checks the budget's limits js against the stored
// ones, storing them when none are stored or replace is set (js nil: leaves
// them alone), and returns the shard keys listed. Different stored limits
// without replace give an error wrapping budget.ErrLimitsConflict.
func registryCall(ctx context.Context, c redis.UniversalClient, name string, idle time.Duration, clock func() time.Time,
	js []byte, replace bool, hexKeys ...string) ([]string, error) {
	now := ""
	if clock != nil {
		now = fmt.Sprint(clock().UnixMicro())
	}
	args := append([]any{ms(idle), now, string(js), flag(replace)}, toAny(hexKeys)...)
	res, err := groupsScript.Run(ctx, c, []string{registryKey(name), limitsKey(name)}, args...).StringSlice()
	if err != nil {
		return nil, err
	}
	code, _ := code(res)
	switch {
	case code == replyConflict && len(res) == 2:
		return nil, fmt.Errorf("%w: budget %q holds %s, this host has %s", budget.ErrLimitsConflict, name, res[1], js)
	case code != replyOK || len(res) < 2:
		return nil, unexpected("groups", res)
	}
	keys := make([]string, 0, len(res)-2)
	for _, h := range res[2:] {
		k, err := hex.DecodeString(h)
		if err != nil {
			return nil, fmt.Errorf("redisstore: malformed entry %q in the group registry", h)
		}
		keys = append(keys, string(k))
	}
	return keys, nil
}

// listGroups reads the shard keys of budget name's registry.
func listGroups(ctx context.Context, c redis.UniversalClient, name string, idle time.Duration, clock func() time.Time) ([]string, error) {
	return registryCall(ctx, c, name, idle, clock, nil, false)
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// eachGroup runs fn for every group in gs, at most 16 at a time, and
// returns the first error.
func eachGroup(gs []*group, fn func(*group) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, 16)
	)
	for _, g := range gs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := fn(g); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// slotGuard names a key of every group that no script ever writes. On a
// Cluster every call declares it beside the config key, so that while the
// group's slot migrates Redis refuses the call whole, before the script
// runs: the source answers TRYAGAIN while it still holds the config (some
// declared keys there, some not) and ASK once it holds none, and the
// target, asked, answers TRYAGAIN until the move is over (a multi-key call
// with keys missing). A script declaring only the config key would run on
// either side and fail at, or worse read as empty, the first key that is
// on the other node: on the source, Redis stops it at a key that is not
// there ("non local key") with its earlier writes kept; on the target,
// asked, it serves keys not there yet as missing, so a call could count
// no leases and grant above the ceiling. The calls fail only while the
// slot is open (as long as its keys take to migrate), and go-redis and the
// Budget retry them.
const slotGuard = "slot-guard"

// newGroup returns the group of shard key key (any key, when unsharded).
func (s *Store) newGroup(key string) *group {
	p := groupPrefix(s.name, s.shardKey != nil, key)
	keys := []string{p + "cfg"}
	if _, cluster := s.client.(*redis.ClusterClient); cluster {
		keys = append(keys, p+slotGuard)
	}
	g := &group{key: key, prefix: p, keys: keys, channel: p + "wake:" + s.proc, slot: slotOf(p),
		ready: make(chan struct{}), sid: sessionID(s.proc, 0),
		domsRenewed: make(map[string]time.Time), done: make(map[doneID]struct{})}
	g.commit.spawn = func(o *batchOp) {
		s.detachedLeads.Go(func() { s.lead(o.ctx, g, o) })
	}
	return g
}

// allGroupsLocked returns every group this process uses (Store.mu held).
func (s *Store) allGroupsLocked() []*group {
	if s.single != nil {
		return []*group{s.single}
	}
	out := make([]*group, 0, len(s.groups))
	for _, g := range s.groups {
		out = append(out, g)
	}
	return out
}

// groupOf returns the group of a request's domains, set up for use, or an
// error wrapping budget.ErrInvalidRequest when they fall in two groups.
func (s *Store) groupOf(ctx context.Context, ds []budget.Domain) (*group, error) {
	if s.shardKey == nil {
		return s.single, nil
	}
	k := s.shardKey(ds[0])
	for _, d := range ds[1:] {
		if k2 := s.shardKey(d); k2 != k {
			return nil, fmt.Errorf("redisstore: %w: domains %s and %s fall in different shard groups (%q and %q), and a request must stay inside one",
				budget.ErrInvalidRequest, ds[0], d, k, k2)
		}
	}
	return s.group(ctx, k)
}

// group returns shard group key, set up: subscribed to its wake channel,
// its limits registered (or checked against this host's), and listed in
// the registry. Concurrent first uses wait for one set-up; one that failed
// is tried again by the next use.
func (s *Store) group(ctx context.Context, key string) (*group, error) {
	s.mu.Lock()
	g := s.groups[key]
	owner := g == nil
	if owner {
		g = s.newGroup(key)
		s.groups[key] = g
	}
	s.mu.Unlock()
	if owner {
		g.err = s.setUp(ctx, g)
		if g.err != nil {
			s.mu.Lock()
			delete(s.groups, key)
			s.mu.Unlock()
		}
		close(g.ready)
	}
	select {
	case <-g.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if g.err != nil {
		return nil, g.err
	}
	return g, nil
}

// setUp prepares a shard group on its first use by this process.
func (s *Store) setUp(ctx context.Context, g *group) error {
	if err := s.subscribeGroup(ctx, g); err != nil {
		return err
	}
	s.mu.Lock()
	l, replace := s.limits, s.replace
	s.mu.Unlock()
	if err := s.register(ctx, g, l, replace, false); err != nil {
		return err
	}
	return s.list(ctx, g)
}

// list writes g into the registry, so Usage and Admin find it.
func (s *Store) list(ctx context.Context, gs ...*group) error {
	hexKeys := make([]string, len(gs))
	for i, g := range gs {
		hexKeys[i] = hex.EncodeToString([]byte(g.key))
	}
	if _, err := registryCall(ctx, s.client, s.name, s.idle, s.clock, nil, false, hexKeys...); err != nil {
		return s.classify(ctx, "list groups", err)
	}
	now := s.now()
	s.mu.Lock()
	for _, g := range gs {
		g.listed = now
	}
	s.mu.Unlock()
	return nil
}

// knownGroups returns every group of the budget: for a sharded one, those
// in the registry and those this process uses; for an unsharded one, its
// one group. Groups found in the registry are not set up: they serve
// calls that need no subscription (usage, register).
func (s *Store) knownGroups(ctx context.Context) ([]*group, error) {
	if s.shardKey == nil {
		return []*group{s.single}, nil
	}
	keys, err := listGroups(ctx, s.client, s.name, s.idle, s.clock)
	if err != nil {
		return nil, s.classify(ctx, "list groups", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := make(map[string]bool, len(keys)+len(s.groups))
	var out []*group
	for k, g := range s.groups {
		seen[k] = true
		out = append(out, g)
	}
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, s.newGroup(k))
		}
	}
	return out, nil
}
