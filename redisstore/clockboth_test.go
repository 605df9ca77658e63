package redisstore_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/lease"
	"github.com/runbudget/runbudget/luascripts"
	"github.com/runbudget/runbudget/redisstore"
)

// wallJump moves Redis's wall clock by d as libfaketime does (FAULTS.md,
// scenario 22): TIME (the scripts' clock) and, with it, the expiry of every
// key, which a jump forward of d expires if it had less than d to live.
func wallJump(t *testing.T, c *redis.Client, clock *jumpClock, prefix string, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	clock.jump(d)
	keys, err := c.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		left := c.PTTL(ctx, k).Val()
		if left < 0 {
			continue
		}
		if left -= d; left <= 0 {
			c.Del(ctx, k)
		} else {
			c.PExpire(ctx, k, left)
		}
	}
}

func groupState(c *redis.Client, prefix, enc string) string {
	ctx := context.Background()
	v := c.HMGet(ctx, prefix+"cfg", "co", "lt", "ce", "epoch", "qu").Val()
	d := c.HMGet(ctx, prefix+"d:"+enc, "ep", "f2").Val()
	var ttls string
	for _, k := range []string{"cfg", "sexp", "doms", "d:" + enc} {
		ttls += fmt.Sprintf(" %s=%v", k, c.PTTL(ctx, prefix+k).Val().Round(time.Second))
	}
	return fmt.Sprintf("cfg co/lt/ce/epoch/qu %v, domain ep/f2 %v, ttl%s", v, d, ttls)
}

// TestClockBothWays: Redis's wall clock goes +3m, -6m, +6m, -3m (scenario
// 22's long case "both") while a holder keeps one lease across every jump
// and another host cycles short leases and holds one across each jump.
func TestClockBothWays(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	clock := newJumpClock()
	const ttl = time.Second
	const ceiling = 3
	l := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: ceiling}}
	name := "both-ways"
	p := "rb:{" + hex.EncodeToString([]byte(name)) + "}:"
	enc := "1." + hex.EncodeToString([]byte("a"))
	holder := jumpStore(t, c, name, ttl, clock, l)
	lanes := jumpStore(t, c, name, ttl, clock, l)
	if a := try(t, holder, "long"); a.Outcome != budget.Granted {
		t.Fatalf("grant: %v", a.Outcome)
	}
	held := map[string]bool{}
	n := 0
	asked := map[string]int{} // step of the first attempt of a waiter not yet granted
	step := 0
	// acquire tries id once; true when granted.
	acquire := func(id string) bool {
		if _, ok := asked[id]; !ok {
			asked[id] = step
		}
		a := try(t, lanes, id)
		if a.Outcome != budget.Granted {
			if step-asked[id] > 12 { // 3 TTLs
				t.Fatalf("step %d: %s waiting since step %d (%v): %s", step, id, asked[id], a.Outcome, groupState(c, p, enc))
			}
			return false
		}
		delete(asked, id)
		held[id] = true
		return true
	}
	beat := func(s *redisstore.Store, ids []string) {
		missing, err := s.Heartbeat(ctx, ids)
		if err != nil {
			t.Fatalf("step %d: heartbeat: %v", step, err)
		}
		if len(missing) > 0 {
			t.Fatalf("step %d: leases lost %v: %s", step, missing, groupState(c, p, enc))
		}
	}
	run := func(steps int) {
		for range steps {
			step++
			clock.step(ttl / 4)
			beat(holder, []string{"long"})
			var ids []string
			for id := range held {
				ids = append(ids, id)
			}
			if len(ids) > 0 {
				beat(lanes, ids)
			}
			// one short lease a step
			id := fmt.Sprintf("s%d", n)
			if acquire(id) {
				n++
				if err := lanes.Retire(ctx, id, lease.All); err != nil {
					t.Fatal(err)
				}
				delete(held, id)
			}
			if u := storeUsage(t, lanes).InFlight[budget.OpGet]; u > ceiling {
				t.Fatalf("step %d: %d in flight, ceiling %d: %s", step, u, ceiling, groupState(c, p, enc))
			}
		}
	}
	run(8)
	for i, d := range []time.Duration{3 * time.Minute, -6 * time.Minute, 6 * time.Minute, -3 * time.Minute} {
		id := fmt.Sprintf("h%d", i)
		for !acquire(id) {
			run(1)
		}
		t.Logf("before jump %v: %s", d, groupState(c, p, enc))
		wallJump(t, c, clock, p, d)
		run(2)
		t.Logf("after jump %v: %s", d, groupState(c, p, enc))
		run(6)
		if err := lanes.Retire(ctx, id, lease.All); err != nil {
			t.Fatal(err)
		}
		delete(held, id)
		run(56)
	}
	if err := holder.Retire(ctx, "long", lease.All); err != nil {
		t.Fatal(err)
	}
	if u := storeUsage(t, lanes).InFlight[budget.OpGet]; u != 0 {
		t.Fatalf("in flight at the end: %d: %s", u, groupState(c, p, enc))
	}
}

// TestClockBackDuringScript: Redis 7.0 judges a key's expiry inside a
// script by the time the script started, and reads TIME and a relative
// PEXPIRE's base as the clock is. When the clock steps back by more than
// the idle TTL while a script runs, a key the script renews relative to
// the stepped clock expires, as the script sees it, before it started, and
// its next access deletes it. A long re-assertion (many leases) straddles
// a step back of 6 minutes here: its session's lease set and the lease
// records must survive it.
func TestClockBackDuringScript(t *testing.T) {
	srv := redistest.Start(t, redistest.WithMovableClock())
	c := srv.Client(t)
	ctx := context.Background()
	const name = "back-during"
	s, err := redisstore.New(c, name, redisstore.WithLeaseTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Register(ctx, slots(1_000_000), false); err != nil {
		t.Fatal(err)
	}
	p := "rb:{" + hex.EncodeToString([]byte(name)) + "}:"
	const n = 20_000
	args := []any{"PUBLISH", redisstore.IdleTTL(s).Milliseconds(), "", 1000, "sess.1", 3, n}
	enc := "1." + hex.EncodeToString([]byte("a"))
	for i := range n {
		args = append(args, fmt.Sprintf("l%d", i), budget.OpGet.Index(), 1, "c", 1, enc)
	}
	src := luascripts.Source("reassert")
	type result struct {
		start, end time.Time
		err        error
	}
	res := make(chan result, 1)
	go func() {
		start := time.Now()
		err := c.Eval(ctx, src, []string{p + "cfg"}, args...).Err()
		res <- result{start, time.Now(), err}
	}()
	// The script has started once the server stops answering others.
	probe := srv.Client(t)
	for {
		pctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		err := probe.Ping(pctx).Err()
		cancel()
		if err != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	jumped := time.Now()
	go srv.SetClockOffset(-6 * time.Minute) // the file is written at once; the wait ends after the script
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.end.Sub(jumped) < 20*time.Millisecond {
		t.Skipf("the script ended %v after the step: too soon to tell", r.end.Sub(jumped))
	}
	t.Logf("the script ran %v, %v of it after the step", r.end.Sub(r.start), r.end.Sub(jumped))
	for _, k := range []string{p + "cfg", redistest.LeaseKey(ctx, c, p, "sess.1"), p + "sexp"} {
		if ttl := c.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("%s after the step back: PTTL %v, want a live key with a TTL", k, ttl)
		}
	}
	if got := sessionLeases(c, redistest.LeaseKey(ctx, c, p, "sess.1")); got != n {
		t.Errorf("lease records after the step back: %d, want %d", got, n)
	}
}
