package main

import (
	"context"
	"encoding/hex"
	"math"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/internal/redistest"
)

// The lean yardstick claims today's commands for a contended admission:
// it must send the same ones, as many of each, as the store's own
// contended workload, or its count says nothing about today's layout.
func TestLeanSendsTodaysCommands(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	perOp := commandCounter(t, c)
	const n = 100
	l, err := contendedLine(ctx, testStore(t, c, "lean-real"), 1, 8)
	if err != nil {
		t.Fatal(err)
	}
	real := perOp("today's scripts", n, l.admission)
	var lean map[string]float64
	if _, err := leanAdmission(ctx, c, 8, func(name string, warm int, op func() error) (float64, error) {
		lean = perOp(name, n, op)
		return 0, nil
	}); err != nil {
		t.Fatal(err)
	}
	// Rounded: today's scripts read the queue or reclaim now and then
	// (zrange 2.02, zrangebyscore 0.01), which the yardstick leaves out.
	for _, m := range []map[string]float64{real, lean} {
		for k, v := range m {
			if m[k] = math.Round(v); m[k] == 0 {
				delete(m, k)
			}
		}
	}
	for k, v := range real {
		if lean[k] != v {
			t.Errorf("%s: %.0f per admission from today's scripts, %.0f from lean.go", k, v, lean[k])
		}
	}
	for k, v := range lean {
		if _, ok := real[k]; !ok {
			t.Errorf("%s: %.0f per admission from lean.go, none from today's scripts", k, v)
		}
	}
}

// commandCounter returns a function that runs op n times, after 20 to
// warm up, and gives the commands it sent per run by commandstats.
func commandCounter(t *testing.T, c *redis.Client) func(name string, n int, op func() error) map[string]float64 {
	ctx := context.Background()
	return func(name string, n int, op func() error) map[string]float64 {
		t.Helper()
		for range 20 {
			if err := op(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		before, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			if err := op(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		after, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		return commandsPer(before, after, n)
	}
}

// The layout-2 yardstick claims 21 commands per contended admission, 8 in
// the join and 13 in the handoff; its count means that only if it sends
// them, and makes the same grants (each handoff's reply names a grant,
// which the next handoff retires in turn: a wrong record would end the
// line with an error).
func TestLean2SendsItsCommands(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	perOp := commandCounter(t, c)
	var got map[string]float64
	if _, err := lean2Admission(ctx, c, 8, func(name string, warm int, op func() error) (float64, error) {
		got = perOp(name, 100, op)
		return 0, nil
	}); err != nil {
		t.Fatal(err)
	}
	delete(got, "fcall") // the two calls themselves, not commands of theirs
	want := map[string]float64{"time": 2, "hmget": 2, "hget": 3, "zrange": 2, "hincrby": 1, "zadd": 1, "hset": 2,
		"sadd": 1, "zscore": 1, "zrem": 1, "get": 1, "set": 1, "publish": 1, "srem": 1, "hdel": 1}
	total := 0.0
	for k, v := range got {
		total += v
		if math.Abs(want[k]-v) > 1e-9 {
			t.Errorf("%s: %v per admission, want %v", k, v, want[k])
		}
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			t.Errorf("%s: none sent, want %v per admission", k, want[k])
		}
	}
	if total != 21 {
		t.Errorf("%v commands per admission, want 21", total)
	}
	// Every handoff granted: the lease hash holds the holder and the
	// waiters, nothing else (a grant that failed would leave its waiter's
	// record and no lease, or both).
	p := "rb:{" + hex.EncodeToString([]byte("cg-lean2")) + "}:"
	if n, err := c.HLen(ctx, p+"lx").Result(); err != nil || n != 9 {
		t.Errorf("lx holds %d records (%v), want the holder and 8 waiters", n, err)
	}
	if n, err := c.ZCard(ctx, p+"q:1.6430").Result(); err != nil || n != 8 {
		t.Errorf("the queue holds %d (%v), want 8", n, err)
	}
}
