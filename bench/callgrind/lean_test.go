package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"math"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/internal/redistest"
)

// TestTodaysCommands: a contended admission of today's scripts (layout
// 3: a join behind the head, then a release that hands its slot to the
// next waiter) sends these commands and no others. The join: TIME, the
// config's HMGET, its session's ZSCORE, one BITFIELD that counts it into
// its domain's queue, HSETNX of its marker, APPEND of its entry. The
// handoff: TIME, HMGET, the lease's HGET and HDEL, the domain's GET and
// SET, one GETRANGE for the queue's head and the entry after it, the
// session's ZSCORE, HSET of the lease over the marker, and PUBLISH.
// (lean.go, lean2.go and lean3.go are yardsticks of layouts 1, 2 and a
// floor for 3, kept for -sketch.)
func TestTodaysCommands(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	perOp := commandCounter(t, c)
	const n = 100
	l, err := contendedLine(ctx, testStore(t, c, "lean-real"), 1, 8)
	if err != nil {
		t.Fatal(err)
	}
	real := perOp("today's scripts", n, l.admission)
	// Rounded: today's scripts reclaim now and then, which is no part of
	// an admission.
	for k, v := range real {
		if real[k] = math.Round(v); real[k] == 0 {
			delete(real, k)
		}
	}
	want := map[string]float64{"fcall": 2, "time": 2, "hmget": 2, "zscore": 2, "bitfield": 1, "hsetnx": 1, "append": 1,
		"hget": 1, "hdel": 1, "get": 1, "set": 1, "getrange": 1, "hset": 1, "publish": 1}
	for k, v := range real {
		if want[k] != v {
			t.Errorf("%s: %.0f per admission, want %.0f", k, v, want[k])
		}
	}
	for k, v := range want {
		if _, ok := real[k]; !ok {
			t.Errorf("%s: none per admission, want %.0f", k, v)
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

// The layout-3 yardstick claims 11 commands per contended admission with
// the sessions known (3 in the join, 8 in the handoff), 13 without its
// session cache, and a compaction (GETRANGE and SET) per 64, and grants
// that chain: each handoff's grant is a lease
// the next one retires by its field, so a wrong field name would end the
// line with nothing granted.
func TestLean3SendsItsCommands(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	perOp := commandCounter(t, c)
	for _, nocache := range []bool{false, true} {
		var got map[string]float64
		if _, err := lean3Admission(ctx, c, 8, nocache, func(name string, warm int, op func() error) (float64, error) {
			got = perOp(name, 100, op)
			return 0, nil
		}); err != nil {
			t.Fatal(err)
		}
		delete(got, "fcall")
		want := map[string]float64{"time": 2, "hmget": 2, "append": 1, "hdel": 1, "get": 1, "getrange": 1, "hset": 1,
			"setrange": 1, "publish": 1}
		if nocache {
			want["zscore"] = 2
		}
		for k, v := range got {
			// A compaction (a GETRANGE and a SET) comes once per 64 handoffs.
			slack := 0.0
			if k == "getrange" || k == "set" {
				slack = 0.02
			}
			if v < want[k]-1e-9 || v > want[k]+slack+1e-9 {
				t.Errorf("nocache %v: %s: %v per admission, want %v", nocache, k, v, want[k])
			}
		}
		if got["set"] == 0 {
			t.Errorf("nocache %v: no compaction in 100 handoffs", nocache)
		}
		for k := range want {
			if _, ok := got[k]; !ok {
				t.Errorf("nocache %v: %s: none sent, want %v per admission", nocache, k, want[k])
			}
		}
		p := lean3Prefix(lean3Name(nocache))
		if n, err := c.HLen(ctx, p+"lx:"+lean3Session).Result(); err != nil || n != 1 {
			t.Errorf("nocache %v: the session holds %d leases (%v), want the one last granted", nocache, n, err)
		}
		d, err := c.Get(ctx, p+"d:"+leanEnc).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		qh := int64(binary.BigEndian.Uint64(d[176:])) // HOT's first field
		if n, err := c.StrLen(ctx, p+"q:"+leanEnc).Result(); err != nil || (n-qh)/128 != 8 {
			t.Errorf("nocache %v: the queue holds %d entries past its head (%v), want 8", nocache, (n-qh)/128, err)
		}
	}
}

// A cancelled waiter of layout 3 is marked where it stands, found by its
// arrival, and passed by the handoffs that reach it: the slot goes to the
// waiter behind it.
func TestLean3CancelIsPassed(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	l, holder, err := newLean3(ctx, c, "cg-lean3-pass", false)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"a-0000", "b-0000", "c-0000", "d-0000"}
	at := map[string]string{}
	for _, id := range ids {
		if at[id], err = l.join(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.cancel("b-0000", at["b-0000"]); err != nil {
		t.Fatal(err)
	}
	if err := l.cancel("b-0000", at["b-0000"]); err == nil {
		t.Error("a second cancel of b found it queued")
	}
	p := lean3Prefix("cg-lean3-pass")
	lx := p + "lx:" + lean3Session
	for i, next := range []string{"a-0000", "c-0000", "d-0000"} {
		if err := l.handoff(holder); err != nil {
			t.Fatal(err)
		}
		ok, err := c.HExists(ctx, lx, next+"|4|"+leanEnc).Result()
		if err != nil || !ok {
			t.Fatalf("handoff %d: %s holds no lease (%v)", i, next, err)
		}
		holder = next
	}
	if n, err := c.Exists(ctx, p+"q:"+leanEnc).Result(); err != nil || n != 0 {
		t.Errorf("the queue is still there (%d, %v) after its last waiter was granted", n, err)
	}
}

// The batched workloads send a lane's release and its next acquire in one
// call: today's through the library's batch function, layout 3's through
// lean3_pair. Each must grant and queue as the unbatched line does (their
// replies are checked on every call) and send one call per admission.
func TestBatchedWorkloads(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	perOp := commandCounter(t, c)
	for _, w := range []struct {
		name string
		run  func(counted func(string, int, func() error) (float64, error)) (float64, error)
	}{
		{"today", func(counted func(string, int, func() error) (float64, error)) (float64, error) {
			return todayBatched(ctx, c, testStore(t, c, "batched-real"), 8, counted)
		}},
		{"lean3", func(counted func(string, int, func() error) (float64, error)) (float64, error) {
			return lean3Batched(ctx, c, 8, counted)
		}},
	} {
		var got map[string]float64
		if _, err := w.run(func(name string, warm int, op func() error) (float64, error) {
			got = perOp(name, 100, op)
			return 0, nil
		}); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		if got["fcall"] != 1 {
			t.Errorf("%s: %v calls per admission, want 1", w.name, got["fcall"])
		}
		if got["time"] != 1 {
			t.Errorf("%s: TIME %v times per admission, want once for both operations", w.name, got["time"])
		}
	}
}
