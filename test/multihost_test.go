//go:build linux

// Package test holds integration tests that run real redis-server processes
// and several OS processes (this test binary, re-executed as worker hosts)
// sharing one budget, checked by a referee outside the budget.
package test

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(envFault); spec != "" {
		if err := runFaultWorker(spec); err != nil {
			fmt.Fprintln(os.Stderr, "fault worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// Every test stops what it started: workers, referees, samplers,
	// proxies, clients. A goroutine left over fails the package, except
	// go-redis's dial probe: a pool whose server is down probes it once a
	// second and looks for Close only between probes, so a client closed
	// after a kill leaves it for up to a second, longer than goleak waits.
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// TestMultiHost: 4 OS processes x 16 lanes on one budget with 8 get slots.
// The referee never sees more than 8 in flight, grants follow arrival order
// beyond a small tolerance, and usage ends at zero.
func TestMultiHost(t *testing.T) {
	const hosts, lanes, slots = 4, 16, 8
	dur := 1500 * time.Millisecond
	if testing.Short() {
		dur = 500 * time.Millisecond
	}
	srv := redistest.Start(t)
	name := "multihost"
	ref := startReferee(t, func(string) int { return slots }) // laneLimits(slots, 1): 8 of each

	s, err := redisstore.New(srv.Client(t), name, redisstore.WithLeaseTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	obs, err := budget.New(laneLimits(slots, 1), budget.WithStore(s)) // the limits the lanes register
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	var ws []*proc
	for h := range hosts {
		ws = append(ws, startWorker(t, faultEnv{Role: "lanes", Redis: srv.Addr(), Name: name, TTL: 2 * time.Second,
			Slots: slots, Domains: 1, Lanes: lanes, For: dur, Hold: time.Millisecond, Referee: ref.addr(),
			Consumer: "host" + strconv.Itoa(h)}))
	}
	for i, w := range ws {
		<-w.exit
		if w.err != nil {
			t.Errorf("host %d: %v", i, w.err)
		}
	}
	over, _, starts := ref.report()
	peak := ref.peakOf(faultDomain(0).ID + "/get")
	// Arrivals a few milliseconds apart can reach Redis in either order
	// (a lane reports, then calls); beyond the tolerance order must hold.
	const tol = 250 * time.Millisecond
	t.Logf("%d holds reported, peak %d of %d in flight; FIFO inversions: %d within 5ms, %d beyond 50ms, %d beyond %v",
		starts, peak, slots, ref.inversions(0)-ref.inversions(5*time.Millisecond),
		ref.inversions(50*time.Millisecond), ref.inversions(tol), tol)
	if over > 0 {
		t.Errorf("referee saw %d above a ceiling", over)
	}
	// Bodies are held longest of what the run shares (the request slot is
	// retired first; memory is each host's own), so they are the ceiling
	// that binds.
	if m := ref.peakOf(faultDomain(0).ID + "/body"); m < slots/2 {
		t.Errorf("peak bodies held only %d of %d: the budget was not shared", m, slots)
	}
	if n := ref.inversions(tol); n != 0 {
		t.Errorf("%d grants passed a waiter that arrived more than %v earlier", n, tol)
	}
	expectZeroUsage(t, obs, 5*time.Second)
}
