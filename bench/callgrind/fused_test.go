package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/dompack"
	"github.com/runbudget/runbudget/internal/redistest"
)

// The fused pair is a yardstick, and its count means something only if it
// does today's work: two lines built alike, one carried by the fused pair
// and one by today's batch, must run the same commands per admission and
// end with domain values that agree in every field but the times (a line
// granted out of order, or a count or queue account gone wrong, shows in
// them), and each admission's replies are checked as it runs.
func TestFusedPairDoesWhatTheBatchDoes(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	perOp := commandCounter(t, c)
	fused, err := fusedOp(ctx, c, testStore(t, c, "fused-a"), 8)
	if err != nil {
		t.Fatal(err)
	}
	batched, err := batchedOp(ctx, c, testStore(t, c, "fused-b"), 8)
	if err != nil {
		t.Fatal(err)
	}
	cf := perOp("fused", 100, fused)
	cb := perOp("batched", 100, batched)
	for _, m := range []map[string]float64{cf, cb} {
		delete(m, "fcall")
	}
	if len(cf) != len(cb) {
		t.Errorf("commands per admission: fused %v, batched %v", cf, cb)
	}
	for name, n := range cb {
		if cf[name] != n {
			t.Errorf("%s per admission: fused %v, batched %v", name, cf[name], n)
		}
	}
	a, b := domainOf(t, c, "fused-a"), domainOf(t, c, "fused-b")
	// The start rate is a sum of starts decayed with time, so it follows
	// the pace each line ran at: both must have counted their starts.
	if a.StartSum <= 0 || b.StartSum <= 0 || a.StartSum > 2*b.StartSum || b.StartSum > 2*a.StartSum {
		t.Errorf("start rate sums: fused %v, batched %v", a.StartSum, b.StartSum)
	}
	for _, d := range []*dompack.Domain{&a, &b} {
		d.TokensAt, d.TTLEnd, d.DecreasedAt, d.LastStart, d.FirstStart, d.Epoch, d.StartSum = 0, 0, 0, 0, 0, 0, 0
	}
	if a.Waiters != 8 || a.InFlight[budget.OpGet.Index()] != 1 {
		t.Errorf("fused line: %d waiters and %d in flight, want 8 and 1", a.Waiters, a.InFlight[budget.OpGet.Index()])
	}
	if ga, gb := fmt.Sprintf("%+v", a), fmt.Sprintf("%+v", b); ga != gb {
		t.Errorf("domain values differ beyond their times:\nfused   %s\nbatched %s", ga, gb)
	}
}

// domainOf decodes the value of the one domain of budget name.
func domainOf(t *testing.T, c *redis.Client, name string) dompack.Domain {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, "rb:{"+hex.EncodeToString([]byte(name))+"}*:d:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("domain keys of %s: %v, %v", name, keys, err)
	}
	v, err := c.Get(ctx, keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	d, err := dompack.Decode(v, budget.NumClasses)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
