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

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
)

// 22. Redis's clock jumps: the server's wall clock (TIME, and with it key
// expiry) moves back or forward by minutes under libfaketime while hosts
// admit against a small ceiling. Lanes hold briefly, one lane holds for 2L
// at a time, across each jump, and the referee counts holders. Pass bars: the
// referee never above the ceiling, no lane waits longer than L + 2 s in
// one Acquire (no waiter stuck until the clock catches up), no lease lost
// (a live holder keeps its session through the jump), usage back to zero.
//
// Cases: back by minutes; forward by 20 s (past half a TTL, short of the
// far-jump bound of an eighth of the idle TTL, 37.5 s here: the group
// clock absorbs it); forward by minutes (keys may expire apart: a new
// epoch under quarantine, counts rebuilt from re-assertion). The long
// version jumps more times, further (forward by 10 minutes expires every
// key: the budget is lost and registered again), on more hosts and lanes.
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
		t.Run(tc.name, func(t *testing.T) { clockJump(t, tc.jumps) })
	}
}

// jumpLane is what one lane saw.
type jumpLane struct {
	name     string
	asked    time.Time     // when its Acquire in progress began; zero when none is
	longest  time.Duration // longest single Acquire, finished or not
	grants   int
	lost     int
	errs     int
	firstErr error
}

func clockJump(t *testing.T, jumps []time.Duration) {
	schedule(t)
	const slots = 3
	hosts, lanes, phase := 3, 3, 1500*time.Millisecond
	if long {
		hosts, lanes, phase = 4, 6, 8*time.Second
	}
	srv := redistest.Start(t, redistest.WithMovableClock())
	name := "f22-" + strings.ReplaceAll(t.Name(), "/", "-")
	ref := startReferee(t, func(string) int { return slots })
	var bs []*budget.Budget
	for range hosts {
		bs = append(bs, hostOn(t, srv.Client(t), name, slots, budget.WithUnavailableGrace(time.Hour)))
	}
	smp := startSampler(t, srv.Client(t), name, []budget.Domain{faultDomain(0)}, slots)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var seen []*jumpLane
	for h, b := range bs {
		for i := range lanes {
			ln := &jumpLane{name: fmt.Sprintf("h%d/%d", h, i)}
			seen = append(seen, ln)
			// Lane 0 of host 0 holds one of the slots across each jump: its
			// session must survive it. The others hold briefly, and keep
			// the line moving on the other slots.
			hold := 5 * time.Millisecond
			if h == 0 && i == 0 {
				hold = 2 * faultL
			}
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
	for _, off := range jumps {
		epoch := c.HGet(context.Background(), p+"cfg", "epoch").Val()
		if err := srv.SetClockOffset(off); err != nil {
			t.Fatal(err)
		}
		at := time.Now()
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
		if e, _ := v[2].(string); e != epoch {
			// Re-assertions extend the quarantine: where it ended.
			v := c.HMGet(context.Background(), p+"cfg", "co", "qu").Val()
			now, _ := c.Time(context.Background()).Result()
			end := time.Duration(toInt(v[1])-(now.UnixMicro()+toInt(v[0]))) * time.Microsecond
			note += fmt.Sprintf(" (ended %v after it)", (time.Since(at) + end).Round(time.Millisecond))
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
	figure(t, "%d hosts x %d lanes on %d slots, jumps %v; %s; %d grants (%d holds reported); peak %d of ceiling %d, referee overshoot %d (for %v), server-side %d (%d samples); longest Acquire %v (lane %s; bar L + 2s); leases lost %d; lane errors %d",
		hosts, lanes, slots, jumps, strings.Join(notes, "; "), grants, starts, ref.peakOf(faultDomain(0).ID+"/get"), slots, over, overFor, sover, samples,
		longest.Round(time.Millisecond), worst, lost, errs)
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
	for _, ln := range seen {
		if ln.grants < 2 {
			t.Errorf("lane %s granted %d times", ln.name, ln.grants)
		}
	}
	expectZeroUsage(t, bs[0], faultL+slack)
	expectKeysHaveTTL(t, c, name)
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
