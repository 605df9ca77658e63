package main

import (
	"context"
	"math"
	"testing"

	"github.com/runbudget/runbudget/internal/redistest"
)

// The lean yardstick claims today's commands for a contended admission:
// it must send the same ones, as many of each, as the store's own
// contended workload, or its count says nothing about today's layout.
func TestLeanSendsTodaysCommands(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	perOp := func(name string, n int, op func() error) map[string]float64 {
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
