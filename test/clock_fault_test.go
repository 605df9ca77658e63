//go:build linux

package test

import (
	"context"
	"encoding/hex"
	"fmt"
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

// 22. Redis's clock jumps: the server's wall clock (TIME, and with it key
// expiry) moves back or forward by minutes under libfaketime while hosts
// admit against a small ceiling and a rate. Lanes hold briefly, one lane
// holds for 2L at a time, across each jump, and the referee counts
// holders; before each jump one more host takes a slot and, right after
// it, dies (its client closed: no release, no beat). Pass bars: the
// referee never above the ceiling; no lane waits longer than L + 2 s in
// one Acquire (no waiter stuck until the clock catches up, on a slot or on
// the bucket); no lane's lease lost (a live holder keeps its session
// through the jump); the dead host's slot back within L + H + slack, as in
// scenario 1; usage back to zero; every host's history checked (porcupine
// Ok, nothing above the ceiling, grants in arrival order), with a jump that
// started a new epoch declared a state loss up to its quarantine's end.
// The recorders read this process's clock, which does not jump (only the
// server's does), so their intervals hold across every jump.
//
// Cases: back by minutes; forward by 20 s (past half a TTL, short of the
// far-jump bound of an eighth of the idle TTL, 37.5 s here: the group
// clock absorbs it); forward by minutes (keys may expire apart: a new
// epoch under quarantine, counts rebuilt from re-assertion). The long
// version jumps more times, further (forward by 10 minutes expires every
// key: the budget is lost and registered again), on more hosts and lanes,
// and both ways ("both": +3, -6, +6, -3 min; a step back longer than the
// idle TTL, during which a script must not renew keys off the stepped
// clock, and a jump forward that expires everything renewed since).
func TestFault22ClockJump(t *testing.T) {
	cases := []struct {
		name  string
		jumps []time.Duration // offsets, applied in turn
	}{
		{"back", []time.Duration{-2 * time.Minute}},
		{"forward-20s", []time.Duration{20 * time.Second}},
		{"forward", []time.Duration{2 * time.Minute}},
	}
	if long {
		cases = []struct {
			name  string
			jumps []time.Duration
		}{
			{"back", []time.Duration{-2 * time.Minute, -7 * time.Minute, -8 * time.Minute}},
			{"forward-20s", []time.Duration{20 * time.Second, 40 * time.Second, 55 * time.Second}},
			{"forward", []time.Duration{2 * time.Minute, 4 * time.Minute, 14 * time.Minute}},
			{"both", []time.Duration{3 * time.Minute, -3 * time.Minute, 3 * time.Minute, 0}},
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clockJump(t, tc.jumps)
		})
	}
}

// jumpLane is what one lane saw.
type jumpLane struct {
	name     string
	asked    time.Time     // when its Acquire in progress began; zero when none is
	longest  time.Duration // longest single Acquire, finished or not
	grants   int
	lost     int
	lostIDs  []string    // the leases lost
	lostAt   []time.Time // when each was heard lost
	errs     int
	firstErr error
}

// jumpSlots is the ceiling: the long lane's slot, the dying host's, and
// two for the short lanes.
const jumpSlots = 4

// jumpLimits: a rate the lanes reach, so a bucket that stopped refilling
// shows, and the ceiling.
func jumpLimits() budget.Limits {
	return budget.Limits{RequestsPerSecond: 2000, Burst: 20, InFlight: map[budget.OpClass]int{budget.OpGet: jumpSlots}}
}

// jumpHost is one host of scenario 22, recording its history into recs.
func jumpHost(t *testing.T, c *redis.Client, name string, recs *[]*history.Recorder) *budget.Budget {
	t.Helper()
	s, err := redisstore.New(c, name, redisstore.WithLeaseTTL(faultL))
	if err != nil {
		t.Fatal(err)
	}
	rec := history.NewRecorder(s, "h"+strconv.Itoa(len(*recs)))
	*recs = append(*recs, rec)
	b, err := budget.New(jumpLimits(), budget.WithStore(rec), budget.WithUnavailableGrace(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func clockJump(t *testing.T, jumps []time.Duration) {
	schedule(t)
	const slots = jumpSlots
	hosts, lanes, phase := 3, 3, 1500*time.Millisecond
	if long {
		hosts, lanes, phase = 4, 6, 8*time.Second
	}
	srv := redistest.Start(t, redistest.WithMovableClock())
	name := "f22-" + strings.ReplaceAll(t.Name(), "/", "-")
	ref := startReferee(t, func(string) int { return slots })
	var (
		bs   []*budget.Budget
		recs []*history.Recorder // every host's, the dying ones' too
	)
	for range hosts {
		bs = append(bs, jumpHost(t, srv.Client(t), name, &recs))
	}
	smp := startSampler(t, srv.Client(t), name, []budget.Domain{faultDomain(0)}, slots)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var seen []*jumpLane
	// One more host runs one lane that holds a slot for 2L at a time,
	// across each jump: its session must survive it. Alone on its host, it
	// is heard from only by heartbeats, every H, as a holder of long
	// requests would be. The other lanes hold briefly and keep the line
	// moving on the other slots.
	holder := jumpHost(t, srv.Client(t), name, &recs)
	for h, b := range append(bs, holder) {
		n, hold := lanes, 5*time.Millisecond
		if b == holder {
			n, hold = 1, 2*faultL
		}
		for i := range n {
			ln := &jumpLane{name: fmt.Sprintf("h%d/%d", h, i)}
			if b == holder {
				ln.name = "long"
			}
			seen = append(seen, ln)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := jumpLaneRun(ctx, b, ref, ln, hold, &mu); err != nil {
					mu.Lock()
					ln.errs++
					if ln.firstErr == nil {
						ln.firstErr = err
					}
					mu.Unlock()
				}
			}()
		}
	}

	c := srv.Client(t)
	p := "rb:{" + hex.EncodeToString([]byte(name)) + "}:"
	time.Sleep(phase) // load before the first jump
	var notes []string
	var reclaims []time.Duration // per jump: the dead host's slot back after its death
	var losses []history.Window  // per jump that started a new epoch: to its quarantine's end
	var dead []*budget.Budget    // the dying hosts
	var jumpedAt []time.Time
	stalls := watchStalls(t)
	for _, off := range jumps {
		// The host that dies: it takes a slot in line, like any lane.
		dc := srv.Client(t)
		dying := jumpHost(t, dc, name, &recs)
		dead = append(dead, dying)
		actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
		dl, err := dying.Acquire(actx, budget.Request{Domains: []budget.Domain{faultDomain(0)}, Class: budget.OpGet, Consumer: "dying"})
		acancel()
		if err != nil {
			t.Fatalf("the dying host's Acquire: %v", err)
		}
		epoch := c.HGet(context.Background(), p+"cfg", "epoch").Val()
		jumped := time.Now() // the jump comes during SetClockOffset
		jumpedAt = append(jumpedAt, jumped)
		if err := srv.SetClockOffset(off); err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		dc.Close() // dead: it never releases nor beats again
		reclaimed := make(chan time.Duration, 1)
		go func() {
			for time.Since(at) < 2*phase {
				if _, n, err := redistest.FindLease(context.Background(), c, p, dl.ID()); err == nil && !n {
					reclaimed <- time.Since(at)
					return
				}
				time.Sleep(10 * time.Millisecond) // Redis sends no event when a lease is reclaimed
			}
			reclaimed <- -1
		}()
		// What the group made of it, once the hosts have called: its clock
		// offset, a new epoch, and a quarantine's end (group time).
		time.Sleep(faultH)
		v := c.HMGet(context.Background(), p+"cfg", "co", "qu", "epoch").Val()
		now, _ := c.Time(context.Background()).Result()
		co, qu := toInt(v[0]), toInt(v[1])
		quarantine := time.Duration(qu-(now.UnixMicro()+co)) * time.Microsecond
		note := fmt.Sprintf("offset %v: group clock offset %v", off, time.Duration(co)*time.Microsecond)
		if e, _ := v[2].(string); e != epoch {
			note += fmt.Sprintf(", new epoch, quarantine ending %v after the jump", (time.Since(at) + quarantine).Round(time.Millisecond))
		} else {
			note += ", same epoch, no quarantine"
		}
		time.Sleep(phase*2 - faultH)
		reclaims = append(reclaims, <-reclaimed)
		if e, _ := v[2].(string); e != epoch {
			// Re-assertions extend the quarantine: where it ended.
			v := c.HMGet(context.Background(), p+"cfg", "co", "qu").Val()
			now, _ := c.Time(context.Background()).Result()
			end := time.Duration(toInt(v[1])-(now.UnixMicro()+toInt(v[0]))) * time.Microsecond
			note += fmt.Sprintf(" (ended %v after it)", (time.Since(at) + end).Round(time.Millisecond))
			// Keys may have expired apart at the jump (leases dropped,
			// places in line lost), and arrival order holds again only
			// after the quarantine: a state loss, declared up to the
			// quarantine's end on this machine's clock (group time less
			// the group's offset, read just now), with scenario 20's
			// margin.
			losses = append(losses, history.Window{Domains: []budget.Domain{faultDomain(0)}, From: jumped,
				To: time.Now().Add(end + 10*time.Millisecond)})
		}
		notes = append(notes, note)
	}
	// An Acquire still waiting at the end counts as long as it has waited.
	mu.Lock()
	for _, ln := range seen {
		if !ln.asked.IsZero() {
			ln.longest = max(ln.longest, time.Since(ln.asked))
		}
	}
	mu.Unlock()
	cancel()
	wg.Wait()

	over, overFor, starts := ref.report()
	sover, samples := smp.overshoot()
	var longest time.Duration
	var worst string
	lost, errs, grants := 0, 0, 0
	var perLane []string
	for _, ln := range seen {
		if ln.longest > longest {
			longest, worst = ln.longest, ln.name
		}
		lost += ln.lost
		errs += ln.errs
		grants += ln.grants
		perLane = append(perLane, fmt.Sprintf("%s %v", ln.name, ln.longest.Round(time.Millisecond)))
		if ln.firstErr != nil {
			t.Errorf("lane %s: %v", ln.name, ln.firstErr)
		}
	}
	var back []string
	for _, r := range reclaims {
		if r < 0 {
			back = append(back, fmt.Sprintf("not within %v", 2*phase))
		} else {
			back = append(back, r.Round(time.Millisecond).String())
		}
	}
	figure(t, "%d hosts x %d lanes on %d slots at 2000/s, jumps to offsets %v; %s; %d grants (%d holds reported); peak %d of ceiling %d, referee overshoot %d (for %v), server-side %d (%d samples); longest Acquire %v (lane %s; bar L + 2s); lanes' leases lost %d; dead host's slot back after %s (bar L + H + slack); lane errors %d",
		hosts, lanes, slots, jumps, strings.Join(notes, "; "), grants, starts, ref.peakOf(faultDomain(0).ID+"/get"), slots, over, overFor, sover, samples,
		longest.Round(time.Millisecond), worst, lost, strings.Join(back, ", "), errs)
	t.Logf("longest Acquire per lane: %s", strings.Join(perLane, ", "))
	if over > 0 || sover > 0 {
		t.Errorf("over-admission: referee %d, server-side %d", over, sover)
	}
	if longest > faultL+2*time.Second {
		t.Errorf("lane %s waited %v in one Acquire, bar L + 2s = %v", worst, longest, faultL+2*time.Second)
	}
	if lost > 0 {
		t.Errorf("%d leases lost: a live holder's session did not survive the jump", lost)
	}
	for i, r := range reclaims {
		if r < 0 || r > faultL+faultH+slack {
			t.Errorf("jump %d: the dead host's slot back after %s, bar L + H + slack = %v", i, back[i], faultL+faultH+slack)
		}
	}
	for _, ln := range seen {
		if ln.grants < 2 {
			t.Errorf("lane %s granted %d times", ln.name, ln.grants)
		}
	}
	expectZeroUsage(t, bs[0], faultL+slack)
	expectKeysHaveTTL(t, c, name)

	// Closed first, so every cancellation and retirement is made and the
	// history is whole. A dying host's lease was never retired: it stays
	// open, given back at some time after its grant.
	for _, b := range append(append(bs, holder), dead...) {
		b.Close()
	}
	var hs []history.History
	for _, r := range recs {
		hs = append(hs, r.History())
	}
	merged := history.Merge(hs...)
	if lost > 0 {
		figure(t, "leases lost: %s; %s", describeLost(seen, jumpedAt, merged), func() string {
			_, d := stalls.explains(nil, faultH, 0)
			return d
		}())
	}
	res := checkHistory(t, merged, history.Options{Limits: jumpLimits(), Losses: losses})
	if err := res.Err(); err != nil {
		t.Error(err)
	}
}

// jumpLaneRun acquires, reports to the referee, holds and releases until
// ctx ends, recording into ln (under mu) its longest Acquire and any lost
// lease.
func jumpLaneRun(ctx context.Context, b *budget.Budget, ref *referee, ln *jumpLane, hold time.Duration, mu *sync.Mutex) error {
	rc, err := dialReferee(ref.addr(), ln.name)
	if err != nil {
		return err
	}
	defer rc.Close()
	res := faultDomain(0).ID + "/get"
	req := budget.Request{Domains: []budget.Domain{faultDomain(0)}, Class: budget.OpGet, Consumer: ln.name}
	for ctx.Err() == nil {
		if err := rc.arrive(); err != nil {
			return err
		}
		asked := time.Now()
		mu.Lock()
		ln.asked = asked
		mu.Unlock()
		l, err := b.Acquire(ctx, req)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		took := time.Since(asked)
		mu.Lock()
		ln.asked = time.Time{}
		ln.grants++
		ln.longest = max(ln.longest, took)
		mu.Unlock()
		if err := rc.start(res); err != nil {
			l.Release()
			return err
		}
		lostIt := false
		select {
		case <-l.Lost():
			lostIt = true
		case <-time.After(hold):
		case <-ctx.Done():
		}
		if err := rc.end(res); err != nil {
			l.Release()
			return err
		}
		l.Release()
		if lostIt {
			mu.Lock()
			ln.lost++
			ln.lostIDs = append(ln.lostIDs, l.ID())
			ln.lostAt = append(ln.lostAt, time.Now())
			mu.Unlock()
		}
	}
	return nil
}

func toInt(v any) int64 {
	s, _ := v.(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// describeLost says, for each lease a lane lost, when after which jump it
// was heard lost and how: reported missing by a heartbeat (the store
// dropped it), or given up by the keeper with no renewal confirmed.
func describeLost(lanes []*jumpLane, jumps []time.Time, h history.History) string {
	missing := map[string]bool{}
	for _, f := range h.Frees {
		if f.Missing {
			missing[f.Lease] = true
		}
	}
	var out []string
	for _, ln := range lanes {
		for i, id := range ln.lostIDs {
			at, when := ln.lostAt[i], "before the first jump"
			for k := len(jumps) - 1; k >= 0; k-- {
				if !at.Before(jumps[k]) {
					when = fmt.Sprintf("%v after jump %d", at.Sub(jumps[k]).Round(time.Millisecond), k+1)
					break
				}
			}
			how := "the keeper gave it up (no renewal confirmed)"
			if missing[id] {
				how = "a heartbeat found it missing"
			}
			out = append(out, fmt.Sprintf("lane %s lease %s %s: %s", ln.name, id, when, how))
		}
	}
	return strings.Join(out, "; ")
}
