package main

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
)

// These run without valgrind, on a plain redis-server: they check what the
// tool loads and sends, not what it counts.

func testStore(t *testing.T, c *redis.Client, name string) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, name, redisstore.WithLeaseTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Register(context.Background(), budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}, false); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCensusCountsAndLoadsTheLibraryBack(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	s := testStore(t, c, "census")
	op, err := uncontendedOp(ctx, s, 1)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	err = censusCounts(ctx, c, 50, []workload{{"uncontended", op}}, func(_ string, cs []censusCount) {
		for _, k := range cs {
			got[k.name] = k.per
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// An uncontended Acquire+Release runs commands, unpacks records and
	// packs them: a census without them counted nothing.
	for _, name := range []string{"redis.call", "struct.unpack", "struct.pack"} {
		if got[name] < 1 {
			t.Errorf("%s: %.2f calls per operation, want at least 1 (all: %v)", name, got[name], got)
		}
	}
	// Every operation is alike, so a count per operation is a whole
	// number, give or take the cache-warm difference of a rare call.
	if v := got["redis.call"]; math.Abs(v-math.Round(v)) > 0.1 {
		t.Errorf("redis.call: %.3f per operation, not a steady count", v)
	}
	// The library is back as it was: no rb_census, and the store works.
	if err := c.FCall(ctx, "rb_census", nil).Err(); err == nil {
		t.Error("rb_census is still loaded after the census")
	}
	if err := op(); err != nil {
		t.Errorf("the store after the census: %v", err)
	}
}
