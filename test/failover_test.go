//go:build linux

package test

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
)

// The master-crash scenarios (18 and 19 in FAULTS.md): the Redis master that
// holds a budget is killed with kill -9 while lanes on several hosts admit
// continuously, and its replica takes over (Redis Cluster's own failover,
// or Sentinel's). The budget must admit again within the failure-detection
// timeout plus two seconds of the crash and the quarantine that follows,
// and never above its ceiling.

const (
	// crashNodeTimeout is how long the failover waits before it calls a
	// silent master dead: cluster-node-timeout, or Sentinel's
	// down-after-milliseconds.
	crashNodeTimeout = time.Second
	// crashRecovery is how soon after the crash the store must answer
	// again: the node timeout plus two seconds.
	crashRecovery = crashNodeTimeout + 2*time.Second
	// crashBar is the pass bar of the first grant: the recovery, then the
	// quarantine. A promoted replica may have missed writes (scenario 21),
	// so the first call on it that would grant quarantines the group for
	// one lease TTL before anything is granted on its counts.
	crashBar = crashRecovery + crashTTL
	// crashLate is how long after a late promotion the first grant may
	// come: one quarantine and a little more (0.6-0.7 s measured).
	crashLate = crashTTL + 500*time.Millisecond
	// crashTTL is the lease TTL of these scenarios, and so the length of
	// the quarantine; a short TTL keeps the quarantine from hiding how
	// long the recovery itself takes. It is also shorter
	// than any failover, so every lease held at the crash is lost (its
	// holder cannot renew it) before the replica takes over.
	crashTTL = 500 * time.Millisecond
	// crashHold is how long a lane holds each lease.
	crashHold = 5 * time.Millisecond
)

// crashBarFor is the first-grant bar of a crash at killed whose replica was
// promoted at promoted (zero when it was not). bar assumes
// Redis promotes within the recovery time; on a loaded machine its own
// failure detection and election can take longer (2.99-3.4 s seen, the
// plain go-redis baseline as late), and what the budget answers for is
// what follows the promotion.
func crashBarFor(bar time.Duration, killed, promoted time.Time) time.Duration {
	if !promoted.IsZero() {
		bar = max(bar, promoted.Sub(killed)+crashLate)
	}
	return bar
}

// crashSize is how big one run of a scenario is.
type crashSize struct {
	hosts, lanes, ceiling int
	// wait bounds how long after the crash the run waits for the budget and
	// the go-redis baselines to recover, before it reports what did not.
	wait time.Duration
}

func crashSizeFor() crashSize {
	if long {
		// Long enough to see a ClusterClient without help recover when its
		// periodic slot-map reload comes (60s after the map was loaded).
		return crashSize{hosts: 4, lanes: 16, ceiling: 8, wait: 50 * time.Second}
	}
	return crashSize{hosts: 2, lanes: 8, ceiling: 4, wait: 8 * time.Second}
}

// crashRig is what a scenario hands to runMasterCrash: the clients, and how
// to crash the master and see its replica take over.
type crashRig struct {
	bar       time.Duration           // the first grant after the crash comes within this
	cfgKey    string                  // the budget's config key
	hosts     []redis.UniversalClient // one client per host
	baselines []crashBaseline         // plain go-redis write loops on the budget's master
	master    *redistest.Server
	replica   *redistest.Server // the one that takes over
	// switched, when set, reports whether the rest of the system names the
	// replica as master (the sentinels); nil when promotion is the switch.
	switched func() bool
	// ttl is the hosts' lease TTL; zero means crashTTL.
	ttl time.Duration
	// longHold is how long lane 0 of host 0 holds each lease; zero means
	// two TTLs, so that a lease is likely held at the crash.
	longHold time.Duration
	// beforeKill, when set, runs once every host admits, and the master is
	// killed as soon as it returns.
	beforeKill func(ctx context.Context, live crashLive)
	// store, when set, wraps host h's store (a history recorder): the
	// host's Budget is built on what it returns.
	store func(h int, s budget.Store) budget.Store
	// waited also counts, as a grant after the crash, one that an Acquire
	// called before the crash returned after the promotion: a lane that
	// waited through the outage, granted by the promoted replica. Without
	// it only calls made after the crash count.
	waited bool
}

// crashLive is a run in progress, as a beforeKill hook sees it.
type crashLive struct {
	budgets []*budget.Budget // one per host, in the order of crashRig.hosts
	ref     *referee
	run     *crashRun
	// wg holds the goroutines the hook starts: the run waits for them
	// after its ctx ends, before it checks that usage is back to zero.
	wg *sync.WaitGroup
}

// crashBaseline is a SET loop on a key in the budget's slot, through plain
// go-redis: what any client of that Redis sees, without runbudget.
type crashBaseline struct {
	name   string
	client redis.UniversalClient
	// onNetErr, when set, runs after each write that failed on the network
	// (not with a Redis error reply).
	onNetErr func(context.Context)
}

// crashRun is what a run recorded. Times are the test's clock.
type crashRun struct {
	// quiet is read-locked by each lane from its Acquire to its Release: a
	// hook that write-locks it has every lane idle, holding nothing.
	quiet    sync.RWMutex
	mu       sync.Mutex
	grants   []crashGrant
	lost     int
	laneErrs []error
	usage    map[int][]time.Time    // successful store calls of each host's probe, by when they were made
	writes   map[string][]time.Time // successful writes per baseline
}

// crashGrant is one grant: the host, when its Acquire was called and when
// it returned the lease.
type crashGrant struct {
	host       int
	issued, at time.Time
}

func (r *crashRun) grant(g crashGrant) {
	r.mu.Lock()
	r.grants = append(r.grants, g)
	r.mu.Unlock()
}

// firstAfter returns how long after t0 the first of ts came, if any did.
func firstAfter(ts []time.Time, t0 time.Time) (time.Duration, bool) {
	for _, at := range ts {
		if at.After(t0) {
			return at.Sub(t0), true
		}
	}
	return 0, false
}

// isNetErr reports whether err is a failure to reach Redis rather than a
// reply from it.
func isNetErr(err error) bool {
	var reply redis.Error
	return err != nil && !errors.As(err, &reply)
}

// runMasterCrash runs lanes on rig's hosts, kills the master with kill -9,
// measures the recovery and checks the bar and the ceiling.
func runMasterCrash(t *testing.T, rig crashRig, size crashSize) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ref := startReferee(t, func(string) int { return size.ceiling })
	const name = "crash"
	ttl := cmp.Or(rig.ttl, crashTTL)
	run := &crashRun{usage: map[int][]time.Time{}, writes: map[string][]time.Time{}}

	var budgets []*budget.Budget
	for h, c := range rig.hosts {
		rs, err := redisstore.New(c, name, redisstore.WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		var s budget.Store = rs
		if rig.store != nil {
			s = rig.store(h, s)
		}
		// The grace outlasts the run: a lane rides the whole outage in one
		// Acquire call, and any error it returns is a failure.
		b, err := budget.New(faultLimits(size.ceiling), budget.WithStore(s), budget.WithUnavailableGrace(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		budgets = append(budgets, b)
	}
	epochBefore, err := rig.master.Client(t).HGet(ctx, rig.cfgKey, "epoch").Result()
	if err != nil {
		t.Fatalf("the budget's epoch on its master: %v", err)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // runs before wg.Wait: stop every goroutine, then wait
	req := budget.Request{Domains: []budget.Domain{faultDomain(0)}, Class: budget.OpGet}
	for h, b := range budgets {
		for lane := range size.lanes {
			rc, err := dialReferee(ref.addr(), fmt.Sprintf("h%d/%d", h, lane))
			if err != nil {
				t.Fatal(err)
			}
			// One lane holds for two TTLs, so a lease is likely held at the
			// crash and lost (its holder cannot renew it) during the outage.
			hold := crashHold
			if h == 0 && lane == 0 {
				hold = cmp.Or(rig.longHold, 2*ttl)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer rc.Close()
				if err := crashLane(ctx, h, b, req, hold, rc, run); err != nil && ctx.Err() == nil {
					run.mu.Lock()
					run.laneErrs = append(run.laneErrs, err)
					run.mu.Unlock()
				}
			}()
		}
	}
	// A probe per host: a store call (Usage, one script on the budget's
	// slot) every 10ms, to tell when the host's store answers again apart
	// from when it grants again.
	for h, b := range budgets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			every(ctx, 10*time.Millisecond, func() {
				pctx, pcancel := context.WithTimeout(ctx, 250*time.Millisecond)
				defer pcancel()
				issued := time.Now()
				if _, err := b.Usage(pctx); err == nil {
					// Recorded when the call was made (the answer came at most
					// 250ms later): a call answered just after the crash by
					// the old master must not count as the store answering
					// again.
					run.mu.Lock()
					run.usage[h] = append(run.usage[h], issued)
					run.mu.Unlock()
				}
			})
		}()
	}
	baselineKey := "baseline:" + rig.cfgKey // same hash tag, same slot
	for _, bl := range rig.baselines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			every(ctx, 10*time.Millisecond, func() {
				wctx, wcancel := context.WithTimeout(ctx, 250*time.Millisecond)
				defer wcancel()
				err := bl.client.Set(wctx, baselineKey, "x", time.Minute).Err()
				switch {
				case err == nil:
					run.mu.Lock()
					run.writes[bl.name] = append(run.writes[bl.name], time.Now())
					run.mu.Unlock()
				case bl.onNetErr != nil && isNetErr(err) && ctx.Err() == nil:
					bl.onNetErr(ctx)
				}
			})
		}()
	}

	// Warm up: every host admits and every baseline writes before the crash.
	waitFor(t, "grants and baseline writes before the crash", 20*time.Second, func() bool {
		run.mu.Lock()
		defer run.mu.Unlock()
		for _, bl := range rig.baselines {
			if len(run.writes[bl.name]) == 0 {
				return false
			}
		}
		hosts := map[int]bool{}
		for _, g := range run.grants {
			hosts[g.host] = true
		}
		return len(run.grants) >= 50*len(budgets) && len(hosts) == len(budgets) && len(run.usage) == len(budgets)
	})

	if rig.beforeKill != nil {
		rig.beforeKill(ctx, crashLive{budgets: budgets, ref: ref, run: run, wg: &wg})
	}
	killed := time.Now()
	rig.master.Kill()
	replicaClient := rig.replica.Client(t)
	// qEnd is the quarantine's end as first read, qLast as last read:
	// a host's re-assertion may extend it.
	var promoted, switched, qStart, qEnd, qLast time.Time
	// waitedFrom is when grants to calls made before the crash count too
	// (see crashRig.waited); zero: never.
	waitedFrom := func() time.Time {
		if rig.waited {
			return promoted
		}
		return time.Time{}
	}
	deadline := killed.Add(size.wait)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	// Poll the replica (no event announces a promotion to an outsider) until
	// it is master, the budget has granted again and its quarantine is over,
	// every baseline wrote again, and one more renewal interval (a host's
	// first heartbeat after the quarantine may re-assert) and a second have
	// run under the referee; or until the wait is over.
	for now := time.Now(); now.Before(deadline); now = <-tick.C {
		pctx, pcancel := context.WithTimeout(ctx, 250*time.Millisecond)
		if promoted.IsZero() && strings.Contains(replicaClient.Info(pctx, "replication").Val(), "role:master") {
			promoted = now
		}
		if switched.IsZero() && rig.switched != nil && rig.switched() {
			switched = now
		}
		if !promoted.IsZero() {
			// The promoted replica's copy of the config: a new epoch means a
			// script noticed the new server and started the quarantine.
			// Both are Redis TIME in microseconds, on this machine's clock.
			v, err := replicaClient.HMGet(pctx, rig.cfgKey, "epoch", "qu").Result()
			if err == nil && len(v) == 2 {
				e, _ := v[0].(string)
				qu, _ := v[1].(string)
				qs, err1 := strconv.ParseInt(e, 10, 64)
				qe, err2 := strconv.ParseInt(qu, 10, 64)
				if e != epochBefore && err1 == nil && err2 == nil {
					if qStart.IsZero() {
						qStart, qEnd = time.UnixMicro(qs), time.UnixMicro(qe)
					}
					qLast = time.UnixMicro(qe)
				}
			}
		}
		pcancel()
		run.mu.Lock()
		_, granted := firstGrantAfter(run.grants, -1, killed, waitedFrom())
		wrote := true
		for _, bl := range rig.baselines {
			_, ok := firstAfter(run.writes[bl.name], killed)
			wrote = wrote && ok
		}
		run.mu.Unlock()
		if granted && wrote && !qStart.IsZero() && now.After(qLast.Add(ttl/3+time.Second)) &&
			(rig.switched == nil || !switched.IsZero()) {
			break
		}
	}
	cancel()
	wg.Wait()
	end := time.Now()

	run.mu.Lock()
	defer run.mu.Unlock()
	// after formats a time after the crash, or says there was none.
	after := func(d time.Duration, ok bool) string {
		if !ok {
			return fmt.Sprintf("none within %v", size.wait)
		}
		return d.Round(time.Millisecond).String()
	}
	first, granted := firstGrantAfter(run.grants, -1, killed, waitedFrom())
	var perHostGrant, perHostStore []string
	for h := range budgets {
		perHostGrant = append(perHostGrant, after(firstGrantAfter(run.grants, h, killed, waitedFrom())))
		perHostStore = append(perHostStore, after(firstAfter(run.usage[h], killed)))
	}
	pause, inQuarantine, lastInQuarantine := grantPauses(run.grants, killed, waitedFrom(), end, qStart, qEnd, ttl)
	over, overFor, starts := ref.report()
	since := func(at time.Time) string {
		if at.IsZero() {
			return "not seen"
		}
		return at.Sub(killed).Round(time.Millisecond).String()
	}
	sw := ""
	if rig.switched != nil {
		sw = ", sentinels named it master " + since(switched)
	}
	quarantine := "no quarantine seen"
	if !qStart.IsZero() {
		quarantine = fmt.Sprintf("quarantine from %s to %s (%d grants returned inside it after TTL/3", since(qStart), since(qEnd), inQuarantine)
		if inQuarantine > 0 {
			quarantine += fmt.Sprintf(", the last %v after it began", lastInQuarantine.Round(time.Millisecond))
		}
		quarantine += ")"
		if qLast.After(qEnd) {
			quarantine += ", extended by re-assertions to " + since(qLast)
		}
	}
	bar := crashBarFor(rig.bar, killed, promoted)
	firstGrant := after(first, granted)
	if granted && !promoted.IsZero() {
		firstGrant += ", " + (first - promoted.Sub(killed)).Round(time.Millisecond).String() + " after the promotion"
	}
	figure(t, "%d hosts x %d lanes, ceiling %d, lease TTL %v; after kill -9 of the budget's master: replica promoted %s%s; first store call answered per host %s; first grant %s (bar %v; per host %s); %s; longest pause in grants after the first %v; %d leases lost; referee peak %d of %d (overshoot %d, for %v) over %d holds; %d lane errors",
		size.hosts, size.lanes, size.ceiling, ttl, since(promoted), sw, strings.Join(perHostStore, ", "),
		firstGrant, bar, strings.Join(perHostGrant, ", "), quarantine, pause.Round(time.Millisecond), run.lost,
		ref.peakOf("get"), size.ceiling, over, overFor, starts, len(run.laneErrs))
	var bl []string
	for _, b := range rig.baselines {
		bl = append(bl, fmt.Sprintf("%s: first SET %s after the kill", b.name, after(firstAfter(run.writes[b.name], killed))))
	}
	if len(bl) > 0 {
		figure(t, "baseline, plain go-redis SET loop on the budget's slot: %s", strings.Join(bl, "; "))
	}

	if promoted.IsZero() {
		t.Errorf("the replica was not promoted within %v of the crash", size.wait)
	}
	switch {
	case !granted:
		t.Errorf("no grant within %v of the crash (bar %v)", size.wait, bar)
	case first > bar:
		t.Errorf("first grant %v after the crash, bar %v", first.Round(time.Millisecond), bar)
	}
	if over > 0 {
		t.Errorf("the referee saw %d holders above the ceiling of %d", over, size.ceiling)
	}
	for _, err := range run.laneErrs {
		t.Errorf("lane: %v", err)
	}
	if granted {
		// Nothing leaks across the failover: every lease given back or
		// expired, no waiter left.
		expectZeroUsage(t, budgets[0], 2*time.Second+3*ttl)
	}
}

// crashLane acquires, tells the referee, holds for hold (or until the lease
// is lost), tells the referee, and releases, until ctx ends.
func crashLane(ctx context.Context, host int, b *budget.Budget, req budget.Request, hold time.Duration, ref *refClient, run *crashRun) error {
	for ctx.Err() == nil {
		run.quiet.RLock() // see crashRun.quiet
		issued := time.Now()
		l, err := b.Acquire(ctx, req)
		if err != nil {
			run.quiet.RUnlock()
			return err
		}
		run.grant(crashGrant{host: host, issued: issued, at: time.Now()})
		if err := ref.start("get"); err != nil {
			l.Release()
			run.quiet.RUnlock()
			return err
		}
		t := time.NewTimer(hold)
		select {
		case <-l.Lost():
			run.mu.Lock()
			run.lost++
			run.mu.Unlock()
		case <-t.C:
		}
		t.Stop()
		err = ref.end("get")
		l.Release()
		run.quiet.RUnlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// firstGrantAfter returns how long after t0 the first grant on host (any
// host when negative) to an Acquire called after t0 came, or returned
// after also (when not zero). Counting only calls made after the crash
// rules out a grant the old master made just before it died whose reply
// was read just after; a grant returned after the promotion cannot be one.
func firstGrantAfter(gs []crashGrant, host int, t0, also time.Time) (time.Duration, bool) {
	var first time.Duration
	found := false
	for _, g := range gs {
		counts := g.issued.After(t0) || !also.IsZero() && g.at.After(also)
		if (host < 0 || g.host == host) && counts && (!found || g.at.Sub(t0) < first) {
			first, found = g.at.Sub(t0), true
		}
	}
	return first, found
}

// grantPauses returns the longest time without a grant from the first
// grant after t0 (see firstGrantAfter, with also) to end, zero when there was none;
// how many grants returned inside the quarantine [qs, qe] later than
// ttl/3 + 20ms into it; and how long after qs the last of them
// returned. The allowance is for
// grants made just before the quarantine: a waiter granted by another's
// release learns it from a wake message or, when that is lost (the wake
// subscription reconnects after a failover), from its own liveness call
// at most TTL/3 later.
func grantPauses(gs []crashGrant, t0, also, end, qs, qe time.Time, ttl time.Duration) (pause time.Duration, inside int, last time.Duration) {
	first, ok := firstGrantAfter(gs, -1, t0, also)
	ats := make([]time.Time, 0, len(gs))
	for _, g := range gs {
		if ok && g.at.Sub(t0) >= first {
			ats = append(ats, g.at)
		}
		if !qs.IsZero() && g.at.After(qs.Add(ttl/3+20*time.Millisecond)) && g.at.Before(qe) {
			inside++
			last = max(last, g.at.Sub(qs))
		}
	}
	slices.SortFunc(ats, func(a, b time.Time) int { return a.Compare(b) })
	if len(ats) == 0 {
		return 0, inside, last
	}
	prev := ats[0]
	for _, at := range append(ats[1:], end) {
		pause = max(pause, at.Sub(prev))
		prev = at
	}
	return pause, inside, last
}

// every runs f now and then every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		f()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// crashCfgKey is the config key of the budget runMasterCrash uses.
func crashCfgKey() string { return "rb:{" + hex.EncodeToString([]byte("crash")) + "}:cfg" }

// 18. Redis Cluster, 3 masters x 1 replica, cluster-node-timeout 1s: the
// master owning the budget's slot is killed with kill -9 under load.
func TestFault18ClusterMasterKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster with replicas")
	}
	schedule(t)
	size := crashSizeFor()
	cl := redistest.StartCluster(t, 3, 1,
		redistest.WithConfig("cluster-node-timeout "+strconv.Itoa(int(crashNodeTimeout/time.Millisecond))))
	key := crashCfgKey()
	master := cl.NodeForKey(t, key)
	rig := crashRig{bar: crashBar, cfgKey: key, master: master, replica: clusterReplicaOf(t, cl, master)}
	for range size.hosts {
		rig.hosts = append(rig.hosts, cl.Client(t))
	}
	plain, reload := cl.Client(t), cl.Client(t)
	rig.baselines = []crashBaseline{
		{name: "ClusterClient as it is", client: plain},
		{name: "ClusterClient with ReloadState after each network error", client: reload,
			onNetErr: func(ctx context.Context) { reload.ReloadState(ctx) }},
	}
	runMasterCrash(t, rig, size)
}

// clusterReplicaOf returns the node replicating master.
func clusterReplicaOf(t *testing.T, cl *redistest.Cluster, master *redistest.Server) *redistest.Server {
	t.Helper()
	for _, n := range cl.Nodes() {
		if n == master {
			continue
		}
		info := n.Client(t).Info(context.Background(), "replication").Val()
		if strings.Contains(info, "role:slave") && strings.Contains(info, "master_port:"+strconv.Itoa(master.Port())+"\r") {
			return n
		}
	}
	t.Fatalf("no replica of %s", master.Addr())
	return nil
}

// 19. Sentinel: a master, one replica and three sentinels (quorum 2,
// down-after 1s, stock polling); the master is killed with kill -9 under
// load, and every host reaches Redis through redis.NewFailoverClient with
// go-redis's defaults but for PoolSize, set as redisstore's doc advises
// (ten per lane): go-redis stops dialling for a second once PoolSize dials
// in a row have failed (its dial breaker, which the switch to the new
// master does not reset), and the default (10 per core) trips during the
// outage, so the first call after the switch came up to a second late
// (first grant 2.29-3.10 s, 1 of 6 runs within the bar; with the advised
// size 2.18-2.30 s).
func TestFault19SentinelMasterKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("sentinels with a replica")
	}
	schedule(t)
	if redistest.SentinelDownAfter != crashNodeTimeout {
		t.Fatalf("the harness's sentinel down-after is %v, the bar assumes %v", redistest.SentinelDownAfter, crashNodeTimeout)
	}
	size := crashSizeFor()
	sn := redistest.StartSentinel(t, 1)
	nodes := sn.Nodes()
	rig := crashRig{bar: crashBar, cfgKey: crashCfgKey(), master: nodes[0], replica: nodes[1],
		switched: func() bool { return sn.Master(t) == nodes[1] }}
	pool := func(o *redis.FailoverOptions) { o.PoolSize = 10 * size.lanes }
	for range size.hosts {
		rig.hosts = append(rig.hosts, sn.ClientWith(t, pool))
	}
	rig.baselines = []crashBaseline{{name: "FailoverClient", client: sn.Client(t)}}
	runMasterCrash(t, rig, size)
}
