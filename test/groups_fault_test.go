//go:build linux

package test

import (
	"context"
	"encoding/hex"
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
	"github.com/runbudget/runbudget/test/history"
)

// Scenario 20 (FAULTS.md): a sharded budget (redisstore.WithShardKey, one
// shard group per domain) spread over a 3-master cluster with one replica
// each. Lanes on several hosts admit on every group; the master owning one
// group is killed with kill -9. The groups on the other masters must keep
// admitting throughout, the killed one must admit again within the node
// timeout plus two seconds, and no group may go above its ceiling.

// groupsSize is how big one run of scenario 20 is.
type groupsSize struct {
	hosts     int // each with its own cluster client and Budget
	lanes     int // per host and group
	perMaster int // groups on each master that survives (the killed one holds one)
	ceiling   int // get requests in flight per domain
	// after is how long the run goes on after the kill, at least; wait
	// bounds how long it waits for the killed group to recover.
	after, wait time.Duration
}

func groupsSizeFor() groupsSize {
	if long {
		return groupsSize{hosts: 4, lanes: 4, perMaster: 3, ceiling: 5, after: 20 * time.Second, wait: 50 * time.Second}
	}
	return groupsSize{hosts: 2, lanes: 2, perMaster: 2, ceiling: 3, after: 3 * time.Second, wait: 8 * time.Second}
}

const (
	// groupsHold is how long a lane holds each lease. Lane 0 of hosts 0 and
	// 1 holds 2 TTLs instead, so each of them has, on every group, a lease
	// that needs renewals; host 0's on the killed group is held at the
	// kill, host 1's is not.
	groupsHold = 10 * time.Millisecond
	// groupsGapBar: the longest time without a grant on a group whose
	// master lives.
	groupsGapBar = time.Second
)

// groupsLimits: a ceiling, and a rate the lanes press against (100/s at
// most, bursts of 4), so the history checks the bucket too.
func groupsLimits(ceiling int) budget.Limits {
	return budget.Limits{RequestsPerSecond: 100, Burst: 4, InFlight: map[budget.OpClass]int{budget.OpGet: ceiling}}
}

// groupGrant is one grant on group g: when its Acquire was called, and
// when it returned.
type groupGrant struct {
	group, host int
	issued, at  time.Time
}

type groupsRun struct {
	mu       sync.Mutex
	grants   []groupGrant
	lost     map[[2]int]int // leases lost, by group and host
	laneErrs []error
	// longSince is when the long-holding lane of each group got the lease
	// it holds now (zero: it holds none).
	longSince map[int]time.Time
}

// cfgKeyOf is the config key of shard group key of budget name.
func cfgKeyOf(name, key string) string {
	return "rb:{" + hex.EncodeToString([]byte(name)) + "." + hex.EncodeToString([]byte(key)) + "}:cfg"
}

// spreadGroups picks shard keys for domains "g0", "g1", ...: one on the
// master at kill, and per more on every other master, as the cluster
// client cc maps their config keys.
func spreadGroups(t *testing.T, cc *redis.ClusterClient, name, kill string, per int) (keys []string, masters []string) {
	t.Helper()
	count := map[string]int{}
	for i := 0; len(keys) < 1+2*per; i++ {
		if i > 10000 {
			t.Fatalf("no spread of groups found: %v", count)
		}
		k := "g" + strconv.Itoa(i)
		m, err := cc.MasterForKey(context.Background(), cfgKeyOf(name, k))
		if err != nil {
			t.Fatal(err)
		}
		addr := m.Options().Addr
		want := per
		if addr == kill {
			want = 1
		}
		if count[addr] < want {
			count[addr]++
			keys = append(keys, k)
			masters = append(masters, addr)
		}
	}
	if len(count) != 3 {
		t.Fatalf("groups on %d masters, want 3: %v", len(count), count)
	}
	return keys, masters
}

// 20. A sharded budget on a 3-master cluster with one replica each: the
// master of one group (and of the budget's group registry) is killed with
// kill -9 while lanes admit on every group. Twice: with
// cluster-require-full-coverage no, where the other masters serve their
// slots throughout and the other groups must keep admitting (no gap above
// a second); and with Redis's default (yes), where every master refuses
// every command from the moment the cluster marks the dead master failing
// until the replica takes over, so every group stops, and every group must
// admit again within the killed one's bar.
func TestFault20GroupMasterKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster with replicas")
	}
	schedule(t)
	t.Run("full-coverage=no", func(t *testing.T) { runGroupCrash(t, false) })
	t.Run("full-coverage=yes", func(t *testing.T) { runGroupCrash(t, true) })
}

// runGroupCrash runs scenario 20 on a cluster that requires full slot
// coverage or not.
func runGroupCrash(t *testing.T, fullCoverage bool) {
	size := groupsSizeFor()
	coverage, gapBar := "no", groupsGapBar
	if fullCoverage {
		// The surviving groups are not quarantined: their masters'
		// run_ids did not change.
		coverage, gapBar = "yes", crashRecovery
	}
	cl := redistest.StartCluster(t, 3, 1,
		redistest.WithConfig("cluster-node-timeout "+strconv.Itoa(int(crashNodeTimeout/time.Millisecond)),
			"cluster-require-full-coverage "+coverage))
	const name = "f20"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	probe := cl.Client(t)
	// The master to kill holds the registry (the zset listing the groups,
	// in the slot of the name): the harder case, since every host's Usage
	// and group listing goes through it.
	regKey := "rb:{" + hex.EncodeToString([]byte(name)) + "}:groups"
	reg, err := probe.MasterForKey(ctx, regKey)
	if err != nil {
		t.Fatal(err)
	}
	keys, masters := spreadGroups(t, probe, name, reg.Options().Addr, size.perMaster)
	killedGroup := slices.Index(masters, reg.Options().Addr)
	var master *redistest.Server
	for _, n := range cl.Nodes() {
		if n.Addr() == reg.Options().Addr {
			master = n
		}
	}
	if master == nil || cl.NodeForKey(t, cfgKeyOf(name, keys[killedGroup])) != master {
		t.Fatalf("the killed group's master is not %s", reg.Options().Addr)
	}
	replica := clusterReplicaOf(t, cl, master)
	domains := make([]budget.Domain, len(keys))
	for i, k := range keys {
		domains[i] = budget.Domain{Version: 1, ID: k}
	}
	shard := redisstore.WithShardKey(func(d budget.Domain) string { return d.ID })

	var (
		budgets []*budget.Budget
		recs    []*history.Recorder
	)
	for h := range size.hosts {
		s, err := redisstore.New(cl.Client(t), name, redisstore.WithLeaseTTL(crashTTL), shard)
		if err != nil {
			t.Fatal(err)
		}
		rec := history.NewRecorder(s, "h"+strconv.Itoa(h))
		recs = append(recs, rec)
		b, err := budget.New(groupsLimits(size.ceiling), budget.WithStore(rec), budget.WithUnavailableGrace(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		budgets = append(budgets, b)
	}
	refs := make([]*referee, len(keys))
	for g := range keys {
		refs[g] = startReferee(t, func(string) int { return size.ceiling })
	}

	run := &groupsRun{lost: map[[2]int]int{}, longSince: map[int]time.Time{}}
	stalls := watchStalls(t)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for g, d := range domains {
		req := budget.Request{Domains: []budget.Domain{d}, Class: budget.OpGet}
		for h, b := range budgets {
			for lane := range size.lanes {
				rc, err := dialReferee(refs[g].addr(), fmt.Sprintf("g%d/h%d/%d", g, h, lane))
				if err != nil {
					t.Fatal(err)
				}
				hold, long := groupsHold, h < 2 && lane == 0 && (g != killedGroup || h == 0)
				if long {
					hold = 2 * crashTTL
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer rc.Close()
					if err := groupsLane(ctx, g, h, b, req, hold, long, rc, run); err != nil && ctx.Err() == nil {
						run.mu.Lock()
						run.laneErrs = append(run.laneErrs, fmt.Errorf("group %d host %d: %w", g, h, err))
						run.mu.Unlock()
					}
				}()
			}
		}
	}

	// Warm up: every group has granted on every host, and the lanes have
	// run for two seconds (the gaps are measured from a second before the
	// kill). The kill comes while host 0 holds a lease on the killed group
	// that it got at least a renewal interval ago, so the lease is in
	// host 0's heartbeats when the master dies.
	started := time.Now()
	waitFor(t, "grants on every group and host before the kill", 30*time.Second, func() bool {
		if time.Since(started) < 2*time.Second {
			return false
		}
		run.mu.Lock()
		defer run.mu.Unlock()
		if since, ok := run.longSince[killedGroup]; !ok || time.Since(since) < crashTTL/3 || time.Since(since) > crashTTL {
			return false
		}
		n := map[[2]int]int{}
		for _, gr := range run.grants {
			n[[2]int{gr.group, gr.host}]++
		}
		for g := range keys {
			for h := range budgets {
				if n[[2]int{g, h}] < 10 {
					return false
				}
			}
		}
		return true
	})

	killed := time.Now()
	master.Kill()
	replicaClient := replica.Client(t)
	var promoted time.Time
	deadline := killed.Add(size.wait)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	// Run until the killed group has granted again on every host and one
	// more second has passed, and at least size.after since the kill; or
	// until the wait is over.
	for now := time.Now(); now.Before(deadline); now = <-tick.C {
		if promoted.IsZero() {
			pctx, pcancel := context.WithTimeout(ctx, 250*time.Millisecond)
			if strings.Contains(replicaClient.Info(pctx, "replication").Val(), "role:master") {
				promoted = now
			}
			pcancel()
		}
		run.mu.Lock()
		last, ok := time.Duration(0), true
		for h := range budgets {
			d, granted := firstGroupGrant(run.grants, killedGroup, h, killed)
			last, ok = max(last, d), ok && granted
		}
		run.mu.Unlock()
		if ok && now.Sub(killed) >= size.after && now.Sub(killed) >= last+time.Second {
			break
		}
	}
	// Gaps are measured up to now: no Acquire grants after the cancel, and
	// the lanes may take up to a long hold to return.
	end := time.Now()
	cancel()
	wg.Wait()

	run.mu.Lock()
	defer run.mu.Unlock()
	since := func(at time.Time) string {
		if at.IsZero() {
			return "not seen"
		}
		return at.Sub(killed).Round(time.Millisecond).String()
	}
	first, recovered := firstGroupGrant(run.grants, killedGroup, -1, killed)
	var perHost []string
	for h := range budgets {
		if d, ok := firstGroupGrant(run.grants, killedGroup, h, killed); ok {
			perHost = append(perHost, d.Round(time.Millisecond).String())
		} else {
			perHost = append(perHost, "none")
		}
	}
	// Surviving groups: the longest time without a grant, from a second
	// before the kill to the end; and the same before the kill, as a
	// yardstick.
	var worst, worstStalled, worstBefore time.Duration
	worstGroup, survivors, during := -1, 0, 0
	outageEnd := killed.Add(first)
	if !recovered {
		outageEnd = end
	}
	for g := range keys {
		if g == killedGroup {
			continue
		}
		survivors++
		gap, stalled := longestGap(run.grants, g, killed.Add(-time.Second), end, stalls)
		if gap > worst {
			worst, worstStalled, worstGroup = gap, stalled, g
		}
		before, _ := longestGap(run.grants, g, killed.Add(-time.Second), killed, stalls)
		worstBefore = max(worstBefore, before)
		for _, gr := range run.grants {
			if gr.group == g && gr.at.After(killed) && gr.at.Before(outageEnd) {
				during++
			}
		}
	}
	var over, holds, lostKilled int
	var overFor time.Duration
	var overAt []time.Time
	lostSurvivors := make([]int, len(budgets)) // by host
	for g, r := range refs {
		o, f, s := r.report()
		over, overFor, holds = max(over, o), overFor+f, holds+s
		overAt = append(overAt, r.overStarts()...)
		for h := range budgets {
			if g == killedGroup {
				lostKilled += run.lost[[2]int{g, h}]
			} else {
				lostSurvivors[h] += run.lost[[2]int{g, h}]
			}
		}
	}
	recovery := "none within " + size.wait.String()
	if recovered {
		recovery = first.Round(time.Millisecond).String()
	}
	bar := crashBarFor(crashBar, killed, promoted)
	figure(t, "cluster-require-full-coverage %s: %d groups on 3 masters (%d on the killed one, which also holds the group registry), %d hosts x %d lanes per group, ceiling %d, %v/s burst %d per domain, lease TTL %v; after kill -9: replica promoted %s; killed group first grant %s (bar %v; per host %s); surviving groups: longest gap in grants %v (bar %v; group %d; not counting %v this process stalled in it; the second before the kill: %v), %d grants on them while the killed group was out; leases lost: %d on the killed group; on the others %d by host 0 (which held a lease on the killed group at the kill), %d by host 1 (which did not); referee overshoot %d (for %v) over %d holds; %d lane errors",
		coverage, len(keys), 1, size.hosts, size.lanes, size.ceiling, groupsLimits(0).RequestsPerSecond, groupsLimits(0).Burst, crashTTL,
		since(promoted), recovery, bar, strings.Join(perHost, ", "), worst.Round(time.Millisecond), gapBar, worstGroup, worstStalled.Round(time.Millisecond),
		worstBefore.Round(time.Millisecond), during, lostKilled, lostSurvivors[0], lostSurvivors[1], over, overFor, holds, len(run.laneErrs))

	if promoted.IsZero() {
		t.Errorf("the replica was not promoted within %v of the kill", size.wait)
	}
	// Every host lives in this process. A stall of it longer than a third
	// of the TTL (a renewal interval) can outlast a waiter's place or a
	// session: a pause of every host, as in scenario 4, not a fault of the
	// budget. Safety is judged whatever happened, but an overshoot that
	// begins inside such a stall is the pause's; the bars that assume hosts
	// run on time (first grant, gaps, arrival order) are judged only when
	// no such stall happened.
	stallMin := crashTTL / 3
	onTime := stalls.longest() < stallMin
	excused, stallDesc := stalls.explains(overAt, stallMin, 10*time.Millisecond)
	figure(t, "%s", stallDesc)
	judge := func(format string, args ...any) {
		t.Helper()
		if onTime {
			t.Errorf(format, args...)
		} else {
			t.Logf("not judged (this process stalled for %v): "+format, append([]any{stalls.longest().Round(time.Millisecond)}, args...)...)
		}
	}
	switch {
	case !recovered:
		t.Errorf("the killed group granted nothing within %v of the kill (bar %v)", size.wait, bar)
	case first > bar:
		judge("the killed group's first grant came %v after the kill, bar %v", first.Round(time.Millisecond), bar)
	}
	if worst > gapBar {
		judge("group %d on a surviving master went %v without a grant (bar %v)", worstGroup, worst.Round(time.Millisecond), gapBar)
	}
	switch {
	case over > 0 && excused:
		t.Logf("a referee saw %d holders above the ceiling of %d, each time within a stall of this process longer than a third of the TTL (hosts paused, as in scenario 4): not judged", over, size.ceiling)
	case over > 0:
		t.Errorf("a referee saw %d holders above the ceiling of %d", over, size.ceiling)
	}
	for _, err := range run.laneErrs {
		t.Errorf("lane: %v", err)
	}
	if recovered {
		expectZeroUsage(t, budgets[0], 2*time.Second+3*crashTTL)
	}
	for _, b := range budgets {
		b.Close() // every cancellation and retirement made, so the history is whole
	}
	var hs []history.History
	for _, r := range recs {
		hs = append(hs, r.History())
	}
	// The killed group's state may be lost with its master, and its order
	// of arrival holds again only once its quarantine is over: a waiter
	// answered "wait" during one was not put in line. Every host that
	// re-asserts extends the quarantine to a TTL after it does, so it may
	// end well after the first grant; its end is read from the group's
	// config (Redis TIME, microseconds, this machine's clock). With full
	// coverage the other groups are refused calls meanwhile (their
	// waiters may lose their places), but keep their state.
	var quarantine time.Time
	lossEnd := outageEnd
	qctx, qcancel := context.WithTimeout(context.Background(), time.Second)
	if qu, err := replicaClient.HGet(qctx, cfgKeyOf(name, keys[killedGroup]), "qu").Int64(); err == nil {
		quarantine = time.UnixMicro(qu)
		if quarantine.After(lossEnd) {
			lossEnd = quarantine
		}
	}
	qcancel()
	lossEnd = lossEnd.Add(10 * time.Millisecond)
	opt := history.Options{Limits: groupsLimits(size.ceiling), Losses: []history.Window{
		{Domains: []budget.Domain{domains[killedGroup]}, From: killed, To: lossEnd}}}
	if fullCoverage {
		opt.Outages = []history.Window{{From: killed, To: lossEnd}}
	}
	// A stall can cost waiters their places (and a session its leases);
	// arrival order holds again once every waiter has called again.
	opt.Losses = append(opt.Losses, stalls.windows(stallMin, 10*time.Millisecond)...)
	opt.Outages = append(opt.Outages, stalls.windows(stallMin, crashTTL)...)
	figure(t, "the killed group's quarantine ended %s after the kill (%v after its first grant)", since(quarantine),
		quarantine.Sub(outageEnd).Round(time.Millisecond))
	res := checkHistory(t, history.Merge(hs...), opt)
	if n := len(res.Inversions); n > 0 && !onTime {
		judge("%d grants out of arrival order", n)
		res.Inversions = nil
	}
	if err := res.Err(); err != nil {
		t.Error(err)
	}
}

// groupsLane acquires on group g, tells the referee, holds for hold (or
// until the lease is lost), tells the referee and releases, until ctx ends.
func groupsLane(ctx context.Context, g, host int, b *budget.Budget, req budget.Request, hold time.Duration, long bool, ref *refClient, run *groupsRun) error {
	for ctx.Err() == nil {
		issued := time.Now()
		l, err := b.Acquire(ctx, req)
		if err != nil {
			return err
		}
		run.mu.Lock()
		at := time.Now()
		run.grants = append(run.grants, groupGrant{group: g, host: host, issued: issued, at: at})
		if long {
			run.longSince[g] = at
		}
		run.mu.Unlock()
		if err := ref.start("get"); err != nil {
			l.Release()
			return err
		}
		t := time.NewTimer(hold)
		select {
		case <-l.Lost():
			run.mu.Lock()
			run.lost[[2]int{g, host}]++
			run.mu.Unlock()
		case <-t.C:
		}
		t.Stop()
		if long {
			run.mu.Lock()
			delete(run.longSince, g)
			run.mu.Unlock()
		}
		err = ref.end("get")
		l.Release()
		if err != nil {
			return err
		}
	}
	return nil
}

// firstGroupGrant returns how long after t0 the first grant on group g
// (and host, unless negative) to an Acquire called after t0 came.
func firstGroupGrant(gs []groupGrant, g, host int, t0 time.Time) (time.Duration, bool) {
	var first time.Duration
	found := false
	for _, gr := range gs {
		if gr.group == g && (host < 0 || gr.host == host) && gr.issued.After(t0) && (!found || gr.at.Sub(t0) < first) {
			first, found = gr.at.Sub(t0), true
		}
	}
	return first, found
}

// longestGap returns the longest time in [from, to] without a grant on
// group g, counting from from to the first grant and from the last to to,
// less the time this process stalled in it (stalls may be nil), and that
// stalled time.
func longestGap(gs []groupGrant, g int, from, to time.Time, stalls *stallWatch) (gap, stalled time.Duration) {
	var ats []time.Time
	for _, gr := range gs {
		if gr.group == g && !gr.at.Before(from) && !gr.at.After(to) {
			ats = append(ats, gr.at)
		}
	}
	slices.SortFunc(ats, func(a, b time.Time) int { return a.Compare(b) })
	prev := from
	for _, at := range append(ats, to) {
		s := stalls.during(prev, at)
		if d := at.Sub(prev) - s; d > gap {
			gap, stalled = d, s
		}
		prev = at
	}
	return gap, stalled
}
