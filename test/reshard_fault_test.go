//go:build linux

package test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/lease"
	"github.com/runbudget/runbudget/redisstore"
	"github.com/runbudget/runbudget/test/history"
)

// Scenario 24 (FAULTS.md): a sharded budget on a 3-master cluster, lanes on
// several hosts admitting on every group, and the slot of one busy group
// (leases held, waiters queued) moved to another master while they run,
// with the raw steps redis-cli --cluster reshard sends for each slot
// (internal/redistest/reshard.go says why not redis-cli itself): IMPORTING,
// MIGRATING, the group's config key and half of its other keys, the rest
// reshardSplit later, SETSLOT NODE. The bars:
//   - no referee above its ceiling;
//   - the moved group: no gap in grants longer than twice the time the
//     slot was open, plus L and H (see gapBar), and none above a second
//     once its quarantine is over; the other groups: none above a second;
//   - nothing lost: no lease lost, every lease released in the end, usage
//     back to zero, no key of the slot left on the old master;
//   - wakes: every host's channel of the moved group subscribed on the new
//     master within a second, no queued waiter of it granted by its
//     liveness call after the move, and the wake probes (a waiter queued
//     behind leases the probe holds, woken by the release of one) woken by
//     an event within H, the one queued across the move included;
//   - every host's history checked (porcupine Ok, nothing above a ceiling,
//     grants in arrival order), with the move and the quarantine after it
//     declared an outage of the moved group: calls refused, state kept.

// reshardSize is how big one run of scenario 24 is.
type reshardSize struct {
	hosts      int // each with its own cluster client and Budget
	lanes      int // per host on every group but the moved one
	movedLanes int // per host on the moved group: more lanes than slots, so waiters queue
	perMaster  int // groups on each master
	ceiling    int // get requests in flight per domain
	probes     int // wake probes before the move and after it, at least
	after      time.Duration
}

func reshardSizeFor() reshardSize {
	if long {
		return reshardSize{hosts: 4, lanes: 2, movedLanes: 4, perMaster: 3, ceiling: 4, probes: 20, after: 15 * time.Second}
	}
	return reshardSize{hosts: 2, lanes: 2, movedLanes: 3, perMaster: 2, ceiling: 2, probes: 6, after: 3 * time.Second}
}

const (
	// reshardTTL is L here; a waiter whose wake is lost is recovered by its
	// liveness call, up to H = L/3 later.
	reshardTTL  = faultL
	reshardHold = 10 * time.Millisecond
	// probePace spaces the wake probes, so they add a few calls a second
	// to the moved group rather than a busy loop.
	probePace = 50 * time.Millisecond
	// reshardSplit is how long the moved group's keys stay split between
	// the two masters.
	reshardSplit = 100 * time.Millisecond
	// reshardSubscribed bounds how long after the move every host's wake
	// channel of the moved group is subscribed on the new master.
	reshardSubscribed = time.Second
)

// reshardGrant is one grant: when the store reported it, and,
// for a waiter that was queued, whether what got it going again was its
// liveness call (no wake event since it was told to wait).
type reshardGrant struct {
	group, host int // group -1: the probe's
	at          time.Time
	queued      bool
	byLiveness  bool
}

// storeErr is one error a host's store returned to its Budget (which
// retried it).
type storeErr struct {
	at   time.Time
	kind string
}

type reshardRun struct {
	mu       sync.Mutex
	grants   []reshardGrant
	errs     []storeErr
	lost     int
	laneErrs []error
	// ended records, by lease ID, how a queued waiter got its grant; the
	// probe reads it.
	ended map[string]bool // true: by its liveness call
}

// watchStore wraps one host's store. It notes every error the store
// returns, and for each waiter whether its wake channel fired between the
// call that told it to wait and the call that found it granted. The store
// signals a waiter's channel on a wake event only; the Budget's liveness
// calls (every H) come from its own timer, so a grant after a Queued reply
// with no wake in between is one the wake event did not bring.
type watchStore struct {
	budget.Store
	host    int
	groupOf func(budget.Request) int
	run     *reshardRun
	// probe is the probe's domain; queued receives a value each time a
	// waiter on it is told to wait.
	probe  budget.Domain
	queued chan struct{}

	mu    sync.Mutex
	waits map[string]*watchedWait
}

type watchedWait struct {
	fwd      chan struct{} // the Budget's view of the store's wake channel
	stop     chan struct{}
	woken    time.Time // when the store's channel last fired
	called   time.Time // when the latest call went out
	queued   bool      // the latest call answered Queued
	everWait bool      // some call answered Queued
}

func (w *watchStore) TryAcquire(ctx context.Context, id string, req budget.Request) (budget.Attempt, error) {
	sent := time.Now()
	att, err := w.Store.TryAcquire(ctx, id, req)
	w.noteErr("acquire", err)
	w.mu.Lock()
	ww := w.waits[id]
	if err == nil && att.Outcome == budget.Granted {
		// Got going by its liveness call: the latest call said Queued, and
		// no wake came after it went out.
		queued, byLiveness := ww != nil && ww.everWait, ww != nil && ww.queued && ww.woken.Before(ww.called)
		if ww != nil {
			close(ww.stop)
			delete(w.waits, id)
		}
		w.mu.Unlock()
		g := w.groupOf(req)
		if req.Domains[0] == w.probe {
			g = -1 // the probe's grants are its own figures
		}
		w.run.mu.Lock()
		w.run.grants = append(w.run.grants, reshardGrant{group: g, host: w.host, at: time.Now(), queued: queued, byLiveness: byLiveness})
		if queued {
			w.run.ended[id] = byLiveness
		}
		w.run.mu.Unlock()
		return att, nil
	}
	if ww == nil && err == nil && att.Wake != nil {
		ww = &watchedWait{fwd: make(chan struct{}, 1), stop: make(chan struct{})}
		w.waits[id] = ww
		go w.forward(ww, att.Wake)
	}
	if ww != nil {
		ww.called = sent
		ww.queued = err == nil && att.Outcome == budget.Queued
		ww.everWait = ww.everWait || ww.queued
		if att.Wake != nil {
			att.Wake = ww.fwd
		}
	}
	w.mu.Unlock()
	if err == nil && att.Outcome == budget.Queued && len(req.Domains) == 1 && req.Domains[0] == w.probe {
		select {
		case w.queued <- struct{}{}:
		default:
		}
	}
	return att, err
}

// forward passes the store's wake signals on to the Budget, noting when
// each came.
func (w *watchStore) forward(ww *watchedWait, from <-chan struct{}) {
	for {
		select {
		case <-from:
		case <-ww.stop:
			return
		}
		w.mu.Lock()
		ww.woken = time.Now()
		w.mu.Unlock()
		select {
		case ww.fwd <- struct{}{}:
		default:
		}
	}
}

func (w *watchStore) Cancel(ctx context.Context, id string) error {
	w.mu.Lock()
	if ww := w.waits[id]; ww != nil {
		close(ww.stop)
		delete(w.waits, id)
	}
	w.mu.Unlock()
	err := w.Store.Cancel(ctx, id)
	w.noteErr("cancel", err)
	return err
}

func (w *watchStore) Retire(ctx context.Context, id string, parts lease.Parts) error {
	err := w.Store.Retire(ctx, id, parts)
	w.noteErr("retire", err)
	return err
}

func (w *watchStore) Heartbeat(ctx context.Context, ids []string) ([]string, error) {
	missing, err := w.Store.Heartbeat(ctx, ids)
	w.noteErr("heartbeat", err)
	return missing, err
}

// noteErr records err by call and kind: what Redis or go-redis said,
// without the per-call details.
func (w *watchStore) noteErr(op string, err error) {
	if err == nil || errors.Is(err, context.Canceled) {
		return
	}
	msg := err.Error()
	kind := msg
	for _, k := range []string{"TRYAGAIN", "ASK", "MOVED", "CLUSTERDOWN", "non local key", "deadline exceeded", "connection refused"} {
		if strings.Contains(msg, k) {
			kind = k
			break
		}
	}
	if len(kind) > 120 {
		kind = kind[:120]
	}
	kind = op + " " + strconv.Quote(kind)
	w.run.mu.Lock()
	w.run.errs = append(w.run.errs, storeErr{at: time.Now(), kind: kind})
	w.run.mu.Unlock()
}

// probeSample is one wake probe: a waiter queued behind leases the probe
// holds on a domain of its own in the moved group, woken by the release
// of one of them.
type probeSample struct {
	released   time.Time
	latency    time.Duration // from the release call to the waiter's Acquire returning
	byLiveness bool
	across     bool // queued before the move, released after it
}

// probe runs wake probes on the moved group until ctx ends: holder takes
// every slot of the probe domain, waiter queues for one, holder releases
// one. A hold request makes the next probe keep its waiter queued until
// the channel it carries is closed.
type probe struct {
	holder, waiter *budget.Budget
	req            budget.Request
	ceiling        int
	queued         chan struct{}
	holdReq        chan chan struct{}
	held           chan struct{}
	run            *reshardRun

	mu      sync.Mutex
	samples []probeSample
}

func (p *probe) loop(ctx context.Context) error {
	for ctx.Err() == nil {
		var release chan struct{}
		select {
		case release = <-p.holdReq:
		default:
		}
		if err := p.once(ctx, release); err != nil {
			return err
		}
		t := time.NewTimer(probePace)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	return nil
}

func (p *probe) once(ctx context.Context, release chan struct{}) error {
	var held []*budget.Lease
	defer func() {
		for _, l := range held {
			l.Release()
		}
	}()
	for range p.ceiling {
		l, err := p.holder.Acquire(ctx, p.req)
		if err != nil {
			return err
		}
		held = append(held, l)
	}
	select {
	case <-p.queued: // a stale signal from an earlier probe
	default:
	}
	type result struct {
		l  *budget.Lease
		at time.Time
		e  error
	}
	res := make(chan result, 1)
	go func() {
		l, err := p.waiter.Acquire(ctx, p.req)
		res <- result{l, time.Now(), err}
	}()
	select {
	case <-p.queued:
	case r := <-res:
		if r.e == nil {
			r.l.Release()
			return errors.New("probe waiter granted while every slot was held")
		}
		return r.e
	}
	if release != nil {
		p.held <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
	}
	released := time.Now()
	held[0].Release()
	held = held[1:]
	r := <-res
	if r.e != nil {
		return r.e
	}
	r.l.Release()
	p.run.mu.Lock()
	byLiveness, seen := p.run.ended[r.l.ID()]
	p.run.mu.Unlock()
	if !seen {
		return fmt.Errorf("probe waiter %s granted without a Queued reply before", r.l.ID())
	}
	p.mu.Lock()
	p.samples = append(p.samples, probeSample{released: released, latency: r.at.Sub(released), byLiveness: byLiveness, across: release != nil})
	p.mu.Unlock()
	return nil
}

func (p *probe) count(after time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.samples {
		if s.released.After(after) {
			n++
		}
	}
	return n
}

// 24. A shard group's slot moved to another master under load.
func TestFault24Reshard(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster")
	}
	schedule(t)
	size := reshardSizeFor()
	cl := redistest.StartCluster(t, 3, 0)
	const name = "f24"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	probeCC := cl.Client(t)
	keys, masters := spreadGroups(t, probeCC, name, "", size.perMaster)
	// The moved group is the first; it goes to another master that holds
	// groups of its own (so each host already has a wake connection there).
	const moved = 0
	movedCfg := cfgKeyOf(name, keys[moved])
	slot := redistest.Slot(movedCfg)
	source := cl.NodeForKey(t, movedCfg)
	i := slices.IndexFunc(masters, func(m string) bool { return m != masters[moved] })
	target := cl.NodeForKey(t, cfgKeyOf(name, keys[i]))
	if source.Addr() != masters[moved] || target == source {
		t.Fatalf("moved group on %s (want %s), target %s", source.Addr(), masters[moved], target.Addr())
	}
	domains := make([]budget.Domain, len(keys))
	for i, k := range keys {
		domains[i] = budget.Domain{Version: 1, ID: k}
	}
	// The probe's domain shares the moved group's shard key (its state,
	// queue and wake channel), and no lane uses it.
	probeDomain := budget.Domain{Version: 1, ID: keys[moved] + "/probe"}
	shardKey := func(d budget.Domain) string { k, _, _ := strings.Cut(d.ID, "/"); return k }
	groupOf := func(req budget.Request) int { return slices.Index(keys, shardKey(req.Domains[0])) }
	limits := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: size.ceiling}}

	run := &reshardRun{ended: map[string]bool{}}
	var budgets []*budget.Budget
	var watches []*watchStore
	var recs []*history.Recorder
	for h := range size.hosts {
		s, err := redisstore.New(cl.Client(t), name, redisstore.WithLeaseTTL(reshardTTL), redisstore.WithShardKey(shardKey))
		if err != nil {
			t.Fatal(err)
		}
		// The recorder below the watch: the watch sees what the Budget sees.
		rec := history.NewRecorder(s, "h"+strconv.Itoa(h))
		recs = append(recs, rec)
		w := &watchStore{Store: rec, host: h, groupOf: groupOf, run: run, probe: probeDomain,
			queued: make(chan struct{}, 1), waits: map[string]*watchedWait{}}
		b, err := budget.New(limits, budget.WithStore(w), budget.WithUnavailableGrace(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		budgets = append(budgets, b)
		watches = append(watches, w)
	}
	refs := make([]*referee, len(keys))
	for g := range keys {
		refs[g] = startReferee(t, func(string) int { return size.ceiling })
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for g, d := range domains {
		req := budget.Request{Domains: []budget.Domain{d}, Class: budget.OpGet}
		lanes := size.lanes
		if g == moved {
			lanes = size.movedLanes
		}
		for h, b := range budgets {
			for lane := range lanes {
				rc, err := dialReferee(refs[g].addr(), fmt.Sprintf("g%d/h%d/%d", g, h, lane))
				if err != nil {
					t.Fatal(err)
				}
				// Lane 0 of host 0 holds each lease for 2L, so leases
				// renewed by heartbeats are held across the move.
				hold := reshardHold
				if h == 0 && lane == 0 {
					hold = 2 * reshardTTL
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer rc.Close()
					if err := reshardLane(ctx, b, req, hold, rc, run); err != nil && ctx.Err() == nil {
						run.mu.Lock()
						run.laneErrs = append(run.laneErrs, fmt.Errorf("group %d host %d: %w", g, h, err))
						run.mu.Unlock()
					}
				}()
			}
		}
	}
	pr := &probe{holder: budgets[0], waiter: budgets[1], req: budget.Request{Domains: []budget.Domain{probeDomain}, Class: budget.OpGet},
		ceiling: size.ceiling, queued: watches[1].queued, holdReq: make(chan chan struct{}, 1), held: make(chan struct{}), run: run}
	probeErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		probeErr <- pr.loop(ctx)
	}()

	// Warm up: two seconds of lanes, every group granted on every host,
	// enough probes; then one probe's waiter is held queued across the move.
	started := time.Now()
	waitFor(t, "grants on every group and host, and probes, before the move", 30*time.Second, func() bool {
		if time.Since(started) < 2*time.Second || pr.count(started) < size.probes {
			return false
		}
		run.mu.Lock()
		defer run.mu.Unlock()
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
	release := make(chan struct{})
	pr.holdReq <- release
	select {
	case <-pr.held:
	case err := <-probeErr:
		t.Fatalf("probe: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no probe waiter queued within 10s")
	}

	moving := time.Now() // calls may be refused from the MIGRATING on
	mv, err := moveSplit(ctx, cl, source, slot, movedCfg, target)
	if err != nil {
		t.Fatalf("moving slot %d: %v", slot, err)
	}
	close(release)
	// Every host's wake channel of the moved group on the new master, and
	// none left on the old one. The hosts' subscriptions give the test no
	// event: it polls PUBSUB SHARDCHANNELS.
	pattern := "rb:{" + hex.EncodeToString([]byte(name)) + "." + hex.EncodeToString([]byte(keys[moved])) + "}:wake:*"
	subscribed := time.Duration(-1)
	sc, tc := source.Client(t), target.Client(t)
	for deadline := time.Now().Add(reshardSubscribed + 4*time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		qctx, qcancel := context.WithTimeout(ctx, time.Second)
		onTarget := shardSubscribers(qctx, tc, pattern)
		onSource := shardSubscribers(qctx, sc, pattern)
		qcancel()
		if len(onTarget) == len(budgets) && len(onSource) == 0 {
			subscribed = time.Since(mv.Closed)
			break
		}
	}

	// Run on until enough probes came after the move, size.after has
	// passed, and the moved group has been out of its quarantine for a
	// second (read from its config: nothing tells the test when a
	// quarantine starts or ends).
	var qStart, qEnd time.Time
	waitFor(t, "probes after the move, and a second after the quarantine", 60*time.Second, func() bool {
		select {
		case err := <-probeErr:
			t.Fatalf("probe: %v", err)
		default:
		}
		qStart, qEnd = quarantineOf(ctx, tc, movedCfg)
		return time.Since(mv.Closed) >= size.after && pr.count(mv.Closed) >= size.probes && time.Since(qEnd) >= time.Second
	})
	end := time.Now()
	cancel()
	wg.Wait()
	select {
	case err := <-probeErr:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("probe: %v", err)
		}
	default:
	}
	qStart, qEnd = quarantineOf(context.Background(), tc, movedCfg)

	run.mu.Lock()
	grants, errs, lost, laneErrs := slices.Clone(run.grants), slices.Clone(run.errs), run.lost, slices.Clone(run.laneErrs)
	run.mu.Unlock()
	from := mv.Opened.Add(-time.Second)
	open := mv.Closed.Sub(mv.Opened)
	// Nothing of the group runs while its slot is open; the refused calls
	// back off (doubling), so the first call after the move may come up to
	// as long again later; that call, on a server that did not write the
	// group's config, quarantines it for L (see FAULTS.md); and waiters
	// call, and the keeper retries retirements refused meanwhile, within H.
	gapBar := 2*open + reshardTTL + reshardTTL/3
	gapMoved, _ := longestReshardGap(grants, moved, from, end)
	gapMovedBefore, _ := longestReshardGap(grants, moved, from, mv.Opened)
	gapMovedAfterQ := time.Duration(-1)
	if qEnd.After(mv.Opened) {
		gapMovedAfterQ, _ = longestReshardGap(grants, moved, qEnd, end)
	}
	var gapOther, gapOtherBefore time.Duration
	var gapOtherAt time.Time
	otherGroup := -1
	for g := range keys {
		if g == moved {
			continue
		}
		if gap, at := longestReshardGap(grants, g, from, end); gap > gapOther {
			gapOther, gapOtherAt, otherGroup = gap, at, g
		}
		before, _ := longestReshardGap(grants, g, from, mv.Opened)
		gapOtherBefore = max(gapOtherBefore, before)
	}
	sinceOpen := func(at time.Time) string {
		if at.IsZero() || at.Before(mv.Opened) {
			return "none"
		}
		return at.Sub(mv.Opened).Round(time.Millisecond).String()
	}
	// Queued waiters of the moved group, and what got them going.
	var queuedBefore, livenessBefore, queuedAfter, livenessAfter, grantsAfter int
	first := time.Duration(-1)
	for _, gr := range grants {
		if gr.group != moved {
			continue
		}
		if gr.at.After(mv.Opened) && (first < 0 || gr.at.Sub(mv.Opened) < first) {
			first = gr.at.Sub(mv.Opened)
		}
		switch {
		case !gr.queued:
		case gr.at.Before(mv.Opened):
			queuedBefore++
			if gr.byLiveness {
				livenessBefore++
			}
		case gr.at.After(mv.Closed):
			queuedAfter++
			if gr.byLiveness {
				livenessAfter++
			}
		}
		if gr.at.After(mv.Closed) {
			grantsAfter++
		}
	}
	var lb, la []time.Duration
	var across *probeSample
	probeLiveness := 0
	pr.mu.Lock()
	for i, s := range pr.samples {
		if s.byLiveness {
			probeLiveness++
		}
		switch {
		case s.across:
			across = &pr.samples[i]
		case s.released.Before(mv.Opened):
			lb = append(lb, s.latency)
		case s.released.After(mv.Closed):
			la = append(la, s.latency)
		}
	}
	pr.mu.Unlock()
	errKinds := map[string]int{}
	for _, e := range errs {
		errKinds[e.kind]++
	}
	var kinds []string
	for k, n := range errKinds {
		kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(kinds)
	errFig := "none"
	if len(errs) > 0 {
		errFig = fmt.Sprintf("%s, %v to %v after the move opened", strings.Join(kinds, ", "),
			errs[0].at.Sub(mv.Opened).Round(time.Millisecond), errs[len(errs)-1].at.Sub(mv.Opened).Round(time.Millisecond))
	}
	var over, holds int
	var overFor time.Duration
	for _, r := range refs {
		o, f, s := r.report()
		over, overFor, holds = max(over, o), overFor+f, holds+s
	}
	acrossFig := "none"
	if across != nil {
		acrossFig = fmt.Sprintf("%v (by liveness call: %v)", across.latency.Round(time.Millisecond), across.byLiveness)
	}
	subFig := "not within " + (reshardSubscribed + 4*time.Second).String()
	if subscribed >= 0 {
		subFig = subscribed.Round(time.Millisecond).String() + " after the move"
	}
	figure(t, "%d groups on 3 masters, %d hosts, lanes per host %d (moved group %d), ceiling %d, L %v; slot %d moved %s -> %s: %d keys, open %v (MIGRATING to the last SETSLOT NODE, split for %v); store errors: %s",
		len(keys), size.hosts, size.lanes, size.movedLanes, size.ceiling, reshardTTL, slot, source.Addr(), target.Addr(), mv.Keys,
		open.Round(time.Millisecond), reshardSplit, errFig)
	figure(t, "moved group: quarantined from %s to %s after the move opened; first grant %v after it; longest gap %v (bar 2 open + L + H = %v; the second before: %v); gaps over 150ms: %s; longest gap after the quarantine %v (bar %v); %d grants after the move",
		sinceOpen(qStart), sinceOpen(qEnd), first.Round(time.Millisecond), gapMoved.Round(time.Millisecond), gapBar.Round(time.Millisecond),
		gapMovedBefore.Round(time.Millisecond), stalls(grants, moved, mv.Opened, end, mv.Opened, 150*time.Millisecond),
		gapMovedAfterQ.Round(time.Millisecond), groupsGapBar, grantsAfter)
	figure(t, "other groups: longest gap %v, from %v after the move opened (bar %v; group %d; the second before: %v)",
		gapOther.Round(time.Millisecond), gapOtherAt.Sub(mv.Opened).Round(time.Millisecond), groupsGapBar, otherGroup, gapOtherBefore.Round(time.Millisecond))
	figure(t, "wakes: the moved group's channels on the new master %s (bar %v); its queued waiters granted after their liveness call instead of a wake: %d of %d before the move, %d of %d after it; probe wake latency before: %s; after: %s (bar H); the waiter queued across the move: %s; probes by liveness call: %d",
		subFig, reshardSubscribed, livenessBefore, queuedBefore, livenessAfter, queuedAfter, latencies(lb), latencies(la), acrossFig, probeLiveness)
	figure(t, "leases lost %d; referee overshoot %d (for %v) over %d holds; %d lane errors", lost, over, overFor, holds, len(laneErrs))

	if over > 0 {
		t.Errorf("a referee saw %d holders above the ceiling of %d", over, size.ceiling)
	}
	if grantsAfter == 0 {
		t.Errorf("no grant on the moved group after the move")
	}
	if gapMoved > gapBar {
		t.Errorf("the moved group went %v without a grant (bar %v)", gapMoved.Round(time.Millisecond), gapBar.Round(time.Millisecond))
	}
	if gapMovedAfterQ > groupsGapBar {
		t.Errorf("the moved group went %v without a grant after its quarantine (bar %v)", gapMovedAfterQ.Round(time.Millisecond), groupsGapBar)
	}
	if gapOther > groupsGapBar {
		t.Errorf("group %d, not moved, went %v without a grant (bar %v)", otherGroup, gapOther.Round(time.Millisecond), groupsGapBar)
	}
	if livenessAfter > 0 {
		t.Errorf("%d of %d queued waiters of the moved group were granted after their liveness call, not a wake, after the move", livenessAfter, queuedAfter)
	}
	if subscribed < 0 || subscribed > reshardSubscribed {
		t.Errorf("the hosts' wake channels of the moved group were not all on the new master within %v of the move", reshardSubscribed)
	}
	if across == nil || across.byLiveness || probeLiveness > 0 {
		t.Errorf("probe waiters woken by their liveness call: %d (the one queued across the move: %s)", probeLiveness, acrossFig)
	}
	for _, d := range la {
		if d > reshardTTL/3 {
			t.Errorf("a probe waiter after the move was woken %v after the release (bar H = %v)", d.Round(time.Millisecond), reshardTTL/3)
		}
	}
	if lost > 0 {
		t.Errorf("%d leases lost", lost)
	}
	for _, err := range laneErrs {
		t.Errorf("lane: %v", err)
	}
	expectZeroUsage(t, budgets[0], 2*time.Second+3*reshardTTL)
	for _, b := range budgets {
		b.Close()
	}
	// Every host closed, so every cancellation and retirement is made. The
	// move loses nothing (MIGRATE carries every key), so it is an outage of
	// the moved group, not a loss: its calls were refused while the slot
	// was open, and the new master's quarantine answers waiters without a
	// place in line, so arrival order starts again after it (its end read
	// from the config, with scenario 20's margin); ceilings hold throughout.
	var hs []history.History
	for _, r := range recs {
		hs = append(hs, r.History())
	}
	outageEnd := mv.Closed
	if qEnd.After(outageEnd) {
		outageEnd = qEnd
	}
	hres := checkHistory(t, history.Merge(hs...), history.Options{Limits: limits, Outages: []history.Window{
		{Domains: []budget.Domain{domains[moved], probeDomain}, From: moving, To: outageEnd.Add(10 * time.Millisecond)}}})
	if err := hres.Err(); err != nil {
		t.Error(err)
	}
	// Nothing of the moved group stayed behind on the source, and nothing
	// of it is held on the target.
	vctx, vcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer vcancel()
	if n, err := sc.ClusterCountKeysInSlot(vctx, slot).Result(); err != nil || n != 0 {
		t.Errorf("keys of the moved slot left on the source: %d, %v", n, err)
	}
	prefix := strings.TrimSuffix(movedCfg, "cfg")
	if recs, _ := redistest.Leases(vctx, tc, prefix); len(recs) != 0 {
		t.Errorf("leases of the moved group on the target after every release: %d", len(recs))
	}
	if n, err := tc.ZCard(vctx, prefix+"wexp").Result(); err != nil || n != 0 {
		t.Errorf("waiters of the moved group on the target after the run: %d, %v", n, err)
	}
}

// quarantineOf reads a group's quarantine from its config: when its epoch
// began and when the quarantine ends (Redis TIME in microseconds, this
// machine's clock); zero times where the fields are missing.
func quarantineOf(ctx context.Context, c *redis.Client, cfg string) (start, end time.Time) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	v, err := c.HMGet(ctx, cfg, "epoch", "qu").Result()
	if err != nil || len(v) != 2 {
		return time.Time{}, time.Time{}
	}
	at := func(x any) time.Time {
		s, _ := x.(string)
		us, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return time.Time{}
		}
		return time.UnixMicro(us)
	}
	return at(v[0]), at(v[1])
}

// moveSplit moves slot to target the way a resharding of a slot with many
// keys goes: the config key and half of the others first, the rest
// reshardSplit later (redis-cli migrates --cluster-pipeline keys per
// MIGRATE), so for a while the group's keys are split between the masters.
func moveSplit(ctx context.Context, cl *redistest.Cluster, source *redistest.Server, slot int, cfg string, target *redistest.Server) (*redistest.SlotMove, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	mv, err := cl.BeginSlotMove(ctx, slot, target)
	if err != nil {
		return nil, err
	}
	sc := redis.NewClient(&redis.Options{Addr: source.Addr(), ContextTimeoutEnabled: true})
	defer sc.Close()
	keys, err := sc.ClusterGetKeysInSlot(ctx, slot, 1000).Result()
	if err != nil {
		return mv, err
	}
	first := []string{cfg}
	for i, k := range keys {
		if k != cfg && i%2 == 0 {
			first = append(first, k)
		}
	}
	if _, err := mv.Migrate(ctx, first...); err != nil {
		return mv, err
	}
	t := time.NewTimer(reshardSplit)
	select {
	case <-t.C:
	case <-ctx.Done():
		return mv, ctx.Err()
	}
	if _, err := mv.Migrate(ctx); err != nil {
		return mv, err
	}
	return mv, mv.Finish(ctx)
}

// reshardLane acquires, tells the referee, holds for hold (or until the
// lease is lost), tells the referee and releases, until ctx ends.
func reshardLane(ctx context.Context, b *budget.Budget, req budget.Request, hold time.Duration, ref *refClient, run *reshardRun) error {
	for ctx.Err() == nil {
		l, err := b.Acquire(ctx, req)
		if err != nil {
			return err
		}
		if err := ref.start("get"); err != nil {
			l.Release()
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
		if err != nil {
			return err
		}
	}
	return nil
}

// longestReshardGap is longestGap for scenario 24's grants, and when the
// gap began.
func longestReshardGap(gs []reshardGrant, g int, from, to time.Time) (time.Duration, time.Time) {
	var ats []time.Time
	for _, gr := range gs {
		if gr.group == g && !gr.at.Before(from) && !gr.at.After(to) {
			ats = append(ats, gr.at)
		}
	}
	slices.SortFunc(ats, func(a, b time.Time) int { return a.Compare(b) })
	gap, began, prev := time.Duration(0), from, from
	for _, at := range append(ats, to) {
		if at.Sub(prev) > gap {
			gap, began = at.Sub(prev), prev
		}
		prev = at
	}
	return gap, began
}

// stalls lists the gaps in grants on group g longer than min in [from,
// to], each as "<start after t0>+<length>".
func stalls(gs []reshardGrant, g int, from, to, t0 time.Time, min time.Duration) string {
	var ats []time.Time
	for _, gr := range gs {
		if gr.group == g && !gr.at.Before(from) && !gr.at.After(to) {
			ats = append(ats, gr.at)
		}
	}
	slices.SortFunc(ats, func(a, b time.Time) int { return a.Compare(b) })
	var out []string
	prev := from
	for _, at := range append(ats, to) {
		if at.Sub(prev) > min {
			out = append(out, fmt.Sprintf("%v+%v", prev.Sub(t0).Round(time.Millisecond), at.Sub(prev).Round(time.Millisecond)))
		}
		prev = at
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// shardSubscribers lists the shard channels matching pattern that have
// subscribers on one node.
func shardSubscribers(ctx context.Context, c *redis.Client, pattern string) []string {
	chans, err := c.PubSubShardChannels(ctx, pattern).Result()
	if err != nil {
		return nil
	}
	return chans
}

// latencies summarizes wake latencies: count, median and worst.
func latencies(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%d, median %v, worst %v", len(s), s[len(s)/2].Round(100*time.Microsecond), s[len(s)-1].Round(100*time.Microsecond))
}
