package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/recpack"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/lease"
)

// Resharding: a group's slot moving to another master while the store
// uses it (see slotGuard in groups.go and the hub in hub.go).

// rsTTL is long, so a waiter's liveness call (every TTL/3 = 10s) cannot
// pass for the wake event these tests wait for (at most rsWake).
const (
	rsTTL  = 30 * time.Second
	rsWake = 2 * time.Second
)

func rsStore(t *testing.T, c redis.UniversalClient, name string, opts ...Option) *Store {
	t.Helper()
	opts = append([]Option{WithLeaseTTL(rsTTL), WithShardKey(func(d budget.Domain) string { return d.ID })}, opts...)
	s, err := New(c, name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Register(ctx, budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}, false); err != nil {
		t.Fatal(err)
	}
	return s
}

func rsReq(key string) budget.Request {
	return budget.Request{Domains: []budget.Domain{{Version: 1, ID: key}}, Class: budget.OpGet}
}

func rsCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func rsCfg(name, key string) string { return groupPrefix(name, true, key) + "cfg" }

// rsKeyOn returns a shard key, other than those in not, whose group's
// slot is served by master addr.
func rsKeyOn(t *testing.T, cc *redis.ClusterClient, name, addr string, not ...string) string {
	t.Helper()
	for i := 0; i < 10000; i++ {
		k := fmt.Sprintf("k%d", i)
		if slices.Contains(not, k) {
			continue
		}
		m, err := cc.MasterForKey(rsCtx(t, 5*time.Second), rsCfg(name, k))
		if err != nil {
			t.Fatal(err)
		}
		if m.Options().Addr == addr {
			return k
		}
	}
	t.Fatalf("no shard key on %s", addr)
	return ""
}

// rsMasters returns the cluster's three masters.
func rsMasters(t *testing.T, cl *redistest.Cluster) []*redistest.Server {
	t.Helper()
	var out []*redistest.Server
	for _, n := range cl.Nodes() {
		info, err := n.Client(t).Info(rsCtx(t, 5*time.Second), "replication").Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(info, "role:master") {
			out = append(out, n)
		}
	}
	if len(out) != 3 {
		t.Fatalf("%d masters, want 3", len(out))
	}
	return out
}

// rsSlotKeys is every key of slot on the given nodes, with its content: what
// a call changed, wherever the key is.
func rsSlotKeys(t *testing.T, slot int, nodes ...*redistest.Server) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range nodes {
		c := n.Client(t)
		ctx := rsCtx(t, 5*time.Second)
		keys, err := c.ClusterGetKeysInSlot(ctx, slot, 1000).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			out[k] = rsContent(t, ctx, c, k, n.Addr())
		}
	}
	return out
}

// rsContent is key k's value on node addr, as text that does not depend on
// its encoding: a DUMP of a hash big enough to be a hash table lists its
// fields in an order a MIGRATE may change. A plain read on a node in the
// middle of a move may be redirected: ASKING makes the importing side
// answer too.
func rsContent(t *testing.T, ctx context.Context, c *redis.Client, k, addr string) string {
	t.Helper()
	read := func(cmd func(p redis.Pipeliner) redis.Cmder) redis.Cmder {
		pipe := c.Pipeline()
		pipe.Do(ctx, "asking")
		v := cmd(pipe)
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatalf("%v on %s: %v", v.Args(), addr, err)
		}
		return v
	}
	typ := read(func(p redis.Pipeliner) redis.Cmder { return p.Type(ctx, k) }).(*redis.StatusCmd).Val()
	var items []string
	switch typ {
	case "hash":
		h := read(func(p redis.Pipeliner) redis.Cmder { return p.HGetAll(ctx, k) }).(*redis.MapStringStringCmd).Val()
		for f, v := range h {
			items = append(items, fmt.Sprintf("%q=%q", f, v))
		}
	case "set":
		for _, m := range read(func(p redis.Pipeliner) redis.Cmder { return p.SMembers(ctx, k) }).(*redis.StringSliceCmd).Val() {
			items = append(items, fmt.Sprintf("%q", m))
		}
	default:
		// Strings, sorted sets and the rest: DUMP is their content.
		items = append(items, fmt.Sprintf("%q", read(func(p redis.Pipeliner) redis.Cmder { return p.Dump(ctx, k) }).(*redis.StringCmd).Val()))
	}
	if len(items) == 0 {
		t.Fatalf("%s on %s: %s with nothing in it", k, addr, typ)
	}
	slices.Sort(items)
	return typ + " " + strings.Join(items, " ")
}

// awaitChannel waits until channel ch has a subscriber on node on and none
// on node off. Subscriptions give a test no event: it polls PUBSUB
// SHARDCHANNELS, every 10ms for at most 5s.
func awaitChannel(t *testing.T, ch string, on, off *redistest.Server) time.Duration {
	t.Helper()
	start := time.Now()
	oc, fc := on.Client(t), off.Client(t)
	for time.Since(start) < 5*time.Second {
		ctx := rsCtx(t, time.Second)
		there, _ := oc.PubSubShardChannels(ctx, ch).Result()
		left, _ := fc.PubSubShardChannels(ctx, ch).Result()
		if len(there) == 1 && len(left) == 0 {
			return time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("wake channel %s not subscribed on %s alone within 5s", ch, on.Addr())
	return 0
}

func drain(c <-chan struct{}) {
	select {
	case <-c:
	default:
	}
}

// woken waits for a wake event on c, for at most rsWake: far below the
// 10s a waiter would wait for its own liveness call.
func woken(t *testing.T, c <-chan struct{}, what string) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-c:
		return time.Since(start)
	case <-time.After(rsWake):
		t.Fatalf("%s: no wake event within %v", what, rsWake)
		return 0
	}
}

// TestSlotGuardRefusesSplitCalls: while a group's slot is open for a move,
// every call of the group is refused whole, with nothing written on either
// master, whether its keys are all on the source or split between the
// two; once the move is over the group works on the new master with its
// state intact. Control calls declaring only the config key show what the
// guard prevents: on the source, Redis stops a script at the first key
// that is not there, its writes made; on the target, a script reads the
// keys still on the source as empty and grants above the ceiling.
func TestSlotGuardRefusesSplitCalls(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster")
	}
	cl := redistest.StartCluster(t, 3, 0)
	cc := cl.Client(t)
	masters := rsMasters(t, cl)
	from, to := masters[0], masters[1]
	const name = "guard"
	s := rsStore(t, cc, name)
	k := rsKeyOn(t, cc, name, from.Addr())
	g, err := s.group(rsCtx(t, 5*time.Second), k)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.keys) != 2 || g.keys[1] != g.prefix+slotGuard {
		t.Fatalf("group keys %q: want the config key and the guard", g.keys)
	}
	held := uuid.NewString()
	if a, err := s.TryAcquire(rsCtx(t, 5*time.Second), held, rsReq(k)); err != nil || a.Outcome != budget.Granted {
		t.Fatalf("first grant: %+v, %v", a, err)
	}
	slot := slotOf(g.keys[0])
	before := rsSlotKeys(t, slot, from, to)

	mv, err := cl.BeginSlotMove(rsCtx(t, 10*time.Second), slot, to)
	if err != nil {
		t.Fatal(err)
	}
	refused := func(phase string) {
		t.Helper()
		_, err := s.TryAcquire(rsCtx(t, 5*time.Second), uuid.NewString(), rsReq(k))
		if !errors.Is(err, budget.ErrUnavailable) || !strings.Contains(err.Error(), "TRYAGAIN") {
			t.Errorf("%s: acquire = %v, want ErrUnavailable from TRYAGAIN", phase, err)
		}
		if err := s.Retire(rsCtx(t, 5*time.Second), held, lease.Request); !errors.Is(err, budget.ErrUnavailable) {
			t.Errorf("%s: retire = %v, want ErrUnavailable", phase, err)
		}
		if after := rsSlotKeys(t, slot, from, to); !maps.Equal(after, before) {
			t.Errorf("%s: the refused calls changed the slot's keys", phase)
		}
	}
	refused("migrating, nothing moved")
	var half []string
	for key := range before {
		if key == g.keys[0] || len(half) < len(before)/2 {
			half = append(half, key)
		}
	}
	if _, err := mv.Migrate(rsCtx(t, 10*time.Second), half...); err != nil {
		t.Fatal(err)
	}
	refused("keys split, the config on the target")
	if _, err := mv.Migrate(rsCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := mv.Finish(rsCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if a, err := s.TryAcquire(rsCtx(t, 5*time.Second), uuid.NewString(), rsReq(k)); err != nil || a.Outcome == budget.Granted {
		t.Errorf("acquire on the new master with the slot held: %+v, %v; want queued or delayed", a, err)
	}
	u, err := s.Usage(rsCtx(t, 5*time.Second))
	if err != nil || len(u.Domains) != 1 || u.Domains[0].InFlight[budget.OpGet] != 1 {
		t.Errorf("usage after the move: %+v, %v; want the one lease held", u, err)
	}
	if err := s.Retire(rsCtx(t, 5*time.Second), held, lease.All); err != nil {
		t.Fatal(err)
	}
	if u, err := s.Usage(rsCtx(t, 5*time.Second)); err != nil || len(u.Domains) > 1 || len(u.Domains) == 1 && len(u.Domains[0].InFlight) != 0 {
		t.Errorf("usage after the release: %+v, %v; want nothing held", u, err)
	}

	// The same calls declaring only the config key, as every call did
	// before the guard, on budgets of their own (their slots stay open).
	unguarded := func(e *Store, k string, sc *redis.Script, args ...any) ([]string, error) {
		return sc.Run(rsCtx(t, 5*time.Second), cc, []string{rsCfg(e.name, k)}, e.args(args...)...).StringSlice()
	}
	changes := func(before, after map[string]string, prefix string) []string {
		var out []string
		for key, v := range after {
			if before[key] != v {
				out = append(out, strings.TrimPrefix(key, prefix))
			}
		}
		for key := range before {
			if _, ok := after[key]; !ok {
				out = append(out, strings.TrimPrefix(key, prefix)+" (deleted)")
			}
		}
		slices.Sort(out)
		return out
	}
	t.Run("control on the source", func(t *testing.T) {
		// A release whose handoff grants a waiter of another process: on
		// the migrating source the script stops at the waiter's session
		// hash, which does not exist (dropped here, with the waiter's
		// marker), after the release's own writes.
		const name = "guard-src"
		holder, waiter := rsStore(t, cl.Client(t), name, WithEvalOnly()), rsStore(t, cl.Client(t), name, WithEvalOnly())
		k := rsKeyOn(t, cc, name, from.Addr())
		held := uuid.NewString()
		if a, err := holder.TryAcquire(rsCtx(t, 5*time.Second), held, rsReq(k)); err != nil || a.Outcome != budget.Granted {
			t.Fatalf("grant: %+v, %v", a, err)
		}
		if a, err := waiter.TryAcquire(rsCtx(t, 5*time.Second), uuid.NewString(), rsReq(k)); err != nil || a.Outcome != budget.Queued {
			t.Fatalf("waiter: %+v, %v", a, err)
		}
		waiter.mu.Lock()
		wsid := waiter.groups[k].sid
		waiter.mu.Unlock()
		p := groupPrefix(name, true, k)
		ce := cc.HGet(rsCtx(t, 5*time.Second), p+"cfg", "ce").Val()
		if err := cc.Del(rsCtx(t, 5*time.Second), recpack.LeaseKey(p, ce, wsid)).Err(); err != nil {
			t.Fatal(err)
		}
		slot := slotOf(rsCfg(name, k))
		if _, err := cl.BeginSlotMove(rsCtx(t, 10*time.Second), slot, to); err != nil {
			t.Fatal(err)
		}
		before := rsSlotKeys(t, slot, from, to)
		holder.mu.Lock()
		hsid := holder.groups[k].sid
		holder.mu.Unlock()
		_, err := unguarded(holder, k, holder.sc.retire, held, int(lease.Request|lease.Body), hsid)
		if err == nil || !strings.Contains(err.Error(), "non local key") {
			t.Fatalf("unguarded release on the migrating source = %v, want a script error at a key that is not there", err)
		}
		changed := changes(before, rsSlotKeys(t, slot, from, to), groupPrefix(name, true, k))
		t.Logf("unguarded release on the migrating source: %v; left written: %q", err, changed)
		if len(changed) == 0 {
			t.Errorf("the failed release left nothing written; the guard's comment says such a script stops half-way")
		}
	})
	t.Run("control on the target", func(t *testing.T) {
		// With the config moved and the leases not yet, a call asked to
		// the target runs there and counts nothing held. EVALSHA: through
		// the library a grant first checks which server wrote the counts,
		// and the target's new run_id quarantines the group instead.
		const name = "guard-dst"
		e := rsStore(t, cl.Client(t), name, WithEvalOnly())
		k := rsKeyOn(t, cc, name, from.Addr())
		if a, err := e.TryAcquire(rsCtx(t, 5*time.Second), uuid.NewString(), rsReq(k)); err != nil || a.Outcome != budget.Granted {
			t.Fatalf("grant: %+v, %v", a, err)
		}
		cfg := rsCfg(name, k)
		mv, err := cl.BeginSlotMove(rsCtx(t, 10*time.Second), slotOf(cfg), to)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := mv.Migrate(rsCtx(t, 10*time.Second), cfg); err != nil {
			t.Fatal(err)
		}
		e.mu.Lock()
		sid := e.groups[k].sid
		e.mu.Unlock()
		res, err := unguarded(e, k, e.sc.acquire, uuid.NewString(), e.proc, sid, budget.OpGet.Index(), 0, "", ms(rsTTL), 1, encodeDomain(rsReq(k).Domains[0]), sid)
		t.Logf("unguarded acquire on the target, the one slot held on the source: %q, %v", res, err)
		if err != nil || len(res) == 0 || res[0] != replyGranted {
			t.Errorf("unguarded acquire = %q, %v; want granted, above the ceiling of 1", res, err)
		}
		if _, err := mv.Migrate(rsCtx(t, 10*time.Second)); err == nil || !strings.Contains(err.Error(), "BUSYKEY") {
			t.Errorf("migrating the rest after the target wrote keys of its own = %v, want BUSYKEY", err)
		}
	})
}

// TestWakeChannelFollowsSlotMove: a waiter queued in a group whose slot
// moves to another master is still woken by events: the sunsubscribe push
// from the old master makes the store subscribe the group's channel where
// the slot is now, on the hub it has there, or on a new one.
func TestWakeChannelFollowsSlotMove(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster")
	}
	cl := redistest.StartCluster(t, 3, 0)
	masters := rsMasters(t, cl)
	x, y, z := masters[0], masters[1], masters[2]
	const name = "follow"
	cc := cl.Client(t)
	holder, waiter := rsStore(t, cl.Client(t), name), rsStore(t, cl.Client(t), name)
	stay := rsKeyOn(t, cc, name, y.Addr())
	toY := rsKeyOn(t, cc, name, x.Addr())
	toZ := rsKeyOn(t, cc, name, x.Addr(), toY)
	// The waiter uses a group on y, so it has a hub there; none on z.
	id := uuid.NewString()
	if a, err := waiter.TryAcquire(rsCtx(t, 5*time.Second), id, rsReq(stay)); err != nil || a.Outcome != budget.Granted {
		t.Fatalf("grant on y: %+v, %v", a, err)
	}
	if err := waiter.Retire(rsCtx(t, 5*time.Second), id, lease.All); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		key    string
		target *redistest.Server
		hub    string
	}{{toY, y, "its hub on the target"}, {toZ, z, "a new hub"}} {
		held, w := uuid.NewString(), uuid.NewString()
		if a, err := holder.TryAcquire(rsCtx(t, 5*time.Second), held, rsReq(step.key)); err != nil || a.Outcome != budget.Granted {
			t.Fatalf("holder: %+v, %v", a, err)
		}
		a, err := waiter.TryAcquire(rsCtx(t, 5*time.Second), w, rsReq(step.key))
		if err != nil || a.Outcome != budget.Queued {
			t.Fatalf("waiter: %+v, %v; want queued", a, err)
		}
		g, err := waiter.group(rsCtx(t, time.Second), step.key)
		if err != nil {
			t.Fatal(err)
		}
		mv, err := cl.MoveSlot(rsCtx(t, 10*time.Second), g.slot, step.target)
		if err != nil {
			t.Fatal(err)
		}
		took := awaitChannel(t, g.channel, step.target, x)
		woken(t, a.Wake, "the waiter, once its channel was subscribed again") // everyone's woken then
		drain(a.Wake)
		if err := holder.Retire(rsCtx(t, 5*time.Second), held, lease.All); err != nil {
			t.Fatal(err)
		}
		d := woken(t, a.Wake, "the waiter, after the release on the new master")
		t.Logf("slot %d moved to %s (%s, %d keys): channel there %v after the move; wake %v after the release",
			g.slot, step.target.Addr(), step.hub, mv.Keys, took.Round(time.Millisecond), d.Round(time.Millisecond))
		waiter.hubMu.Lock()
		old := waiter.hubs[x.Addr()]
		if old != nil && strings.Contains(old.ps.String(), g.channel) {
			t.Errorf("the old master's hub still lists the moved channel: %s", old.ps)
		}
		if h := waiter.hubs[step.target.Addr()]; h == nil || !strings.Contains(h.ps.String(), g.channel) {
			t.Errorf("no hub on %s carries the moved channel", step.target.Addr())
		}
		waiter.hubMu.Unlock()
		if err := waiter.Cancel(rsCtx(t, 5*time.Second), w); err != nil {
			t.Fatal(err)
		}
	}
	// Both of the waiter's groups on x left: its hub there closed, and a
	// group used on x later gets a fresh one.
	waiter.hubMu.Lock()
	old := waiter.hubs[x.Addr()]
	closed := old != nil && old.closed
	waiter.hubMu.Unlock()
	if !closed {
		t.Errorf("the waiter's hub on x, with no channel left, is not closed")
	}
	k := rsKeyOn(t, cc, name, x.Addr(), toY, toZ)
	held, w := uuid.NewString(), uuid.NewString()
	if a, err := holder.TryAcquire(rsCtx(t, 5*time.Second), held, rsReq(k)); err != nil || a.Outcome != budget.Granted {
		t.Fatalf("holder on x: %+v, %v", a, err)
	}
	a, err := waiter.TryAcquire(rsCtx(t, 5*time.Second), w, rsReq(k))
	if err != nil || a.Outcome != budget.Queued {
		t.Fatalf("waiter on x: %+v, %v; want queued", a, err)
	}
	waiter.hubMu.Lock()
	h := waiter.hubs[x.Addr()]
	fresh := h != nil && h != old && !h.closed && slices.Contains(h.prev, old)
	waiter.hubMu.Unlock()
	if !fresh {
		t.Errorf("the group on x is not on a fresh hub that replaced the closed one")
	}
	if err := holder.Retire(rsCtx(t, 5*time.Second), held, lease.All); err != nil {
		t.Fatal(err)
	}
	woken(t, a.Wake, "the waiter on x's fresh hub")
	if err := waiter.Cancel(rsCtx(t, 5*time.Second), w); err != nil {
		t.Fatal(err)
	}
}

// TestWakeAfterPubSubReconnect: when a hub's connection is cut, go-redis
// dials again and subscribes every channel of it with one SSUBSCRIBE,
// which Redis refuses when the channels lie in several slots; the hub
// subscribes them one by one instead. And a wake published while the
// connection was down is not left to the waiter's liveness call: once the
// channel is subscribed again the group's waiters are woken. On a plain
// Redis too.
func TestWakeAfterPubSubReconnect(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster")
	}
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3, 0)
		x := rsMasters(t, cl)[0]
		const name = "reconnect"
		cc := cl.Client(t)
		holder, waiter := rsStore(t, cl.Client(t), name), rsStore(t, cl.Client(t), name)
		k1 := rsKeyOn(t, cc, name, x.Addr())
		k2 := rsKeyOn(t, cc, name, x.Addr(), k1)
		var gs []*group
		for _, k := range []string{k1, k2} {
			id := uuid.NewString()
			if a, err := waiter.TryAcquire(rsCtx(t, 5*time.Second), id, rsReq(k)); err != nil || a.Outcome != budget.Granted {
				t.Fatalf("grant: %+v, %v", a, err)
			}
			if err := waiter.Retire(rsCtx(t, 5*time.Second), id, lease.All); err != nil {
				t.Fatal(err)
			}
			g, _ := waiter.group(rsCtx(t, time.Second), k)
			gs = append(gs, g)
		}
		if gs[0].slot == gs[1].slot {
			t.Fatal("both groups in one slot")
		}
		xc := x.Client(t)
		for round, lose := range []bool{false, true} {
			held, w := uuid.NewString(), uuid.NewString()
			if a, err := holder.TryAcquire(rsCtx(t, 5*time.Second), held, rsReq(k1)); err != nil || a.Outcome != budget.Granted {
				t.Fatalf("holder: %+v, %v", a, err)
			}
			a, err := waiter.TryAcquire(rsCtx(t, 5*time.Second), w, rsReq(k1))
			if err != nil || a.Outcome != budget.Queued {
				t.Fatalf("waiter: %+v, %v; want queued", a, err)
			}
			if err := xc.ClientKillByFilter(rsCtx(t, 5*time.Second), "TYPE", "pubsub").Err(); err != nil {
				t.Fatal(err)
			}
			if !lose {
				// Both channels back on x, each on its own.
				for _, g := range gs {
					awaitChannel(t, g.channel, x, masterOtherThan(t, cl, x))
				}
				drain(a.Wake)
			}
			// With lose, the release comes at once: its wake may be
			// published before the hub is back, and the poke recovers it.
			if err := holder.Retire(rsCtx(t, 5*time.Second), held, lease.All); err != nil {
				t.Fatal(err)
			}
			d := woken(t, a.Wake, fmt.Sprintf("round %d", round))
			t.Logf("round %d (release before the hub is back: %v): waiter woken %v after the release", round, lose, d.Round(time.Millisecond))
			if err := waiter.Cancel(rsCtx(t, 5*time.Second), w); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("plain", func(t *testing.T) {
		srv := redistest.Start(t)
		opts := []Option{WithLeaseTTL(rsTTL)}
		holder, err := New(srv.Client(t), "reconnect", opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { holder.Close() })
		waiter, err := New(srv.Client(t), "reconnect", opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { waiter.Close() })
		l := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
		for _, s := range []*Store{holder, waiter} {
			if err := s.Register(rsCtx(t, 5*time.Second), l, false); err != nil {
				t.Fatal(err)
			}
		}
		held, w := uuid.NewString(), uuid.NewString()
		if a, err := holder.TryAcquire(rsCtx(t, 5*time.Second), held, rsReq("d")); err != nil || a.Outcome != budget.Granted {
			t.Fatalf("holder: %+v, %v", a, err)
		}
		a, err := waiter.TryAcquire(rsCtx(t, 5*time.Second), w, rsReq("d"))
		if err != nil || a.Outcome != budget.Queued {
			t.Fatalf("waiter: %+v, %v; want queued", a, err)
		}
		if err := srv.Client(t).ClientKillByFilter(rsCtx(t, 5*time.Second), "TYPE", "pubsub").Err(); err != nil {
			t.Fatal(err)
		}
		if err := holder.Retire(rsCtx(t, 5*time.Second), held, lease.All); err != nil {
			t.Fatal(err)
		}
		d := woken(t, a.Wake, "waiter")
		t.Logf("waiter woken %v after the release", d.Round(time.Millisecond))
	})
}

// masterOtherThan is a master of cl other than n.
func masterOtherThan(t *testing.T, cl *redistest.Cluster, n *redistest.Server) *redistest.Server {
	t.Helper()
	for _, m := range rsMasters(t, cl) {
		if m != n {
			return m
		}
	}
	t.Fatal("no other master")
	return nil
}

// TestSlotOf: the hub's slot of a key is Redis's.
func TestSlotOf(t *testing.T) {
	for _, k := range []string{"", "a", "rb:{61.6b30}:cfg", "{}", "{}x", "x{", "{a", "a{}b{c}", "{{x}}", "a{b}c{d}", "\x00\xff{\n}", "rb:{" + strings.Repeat("f", 300) + "}:wake:x"} {
		if got, want := slotOf(k), redistest.Slot(k); got != want {
			t.Errorf("slotOf(%q) = %d, Redis's slot %d", k, got, want)
		}
	}
}
