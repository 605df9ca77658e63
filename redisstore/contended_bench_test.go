package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/runbudget/runbudget/internal/redistest"
)

// BenchmarkContendedAdmission: 64 goroutines of one host on 8 slots, each
// an Acquire then a Release, against real Redis. Its allocations per
// admission (-benchmem) are the lanes' side of P3 that a profile can name.
func BenchmarkContendedAdmission(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	bud := open(b, c, "contended", slots(8), 10*time.Second)
	req := get(dom("a"))
	b.SetParallelism(32) // 64 goroutines on 2 CPUs
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			l, err := bud.Acquire(ctx, req)
			if err != nil {
				b.Error(err)
				return
			}
			l.Release()
		}
	})
}
