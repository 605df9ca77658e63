package budget_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/runbudget/runbudget/budget"
	"golang.org/x/sync/semaphore"
)

// The budget's admission path is measured beside x/sync/semaphore doing the
// same job (bounding concurrent work), so one `go test -bench` run shows the
// price of what the budget adds: per-domain queues, several dimensions,
// leases with parts that retire apart.

// contenders and slots shape the contended benchmarks: 64 goroutines share
// 8 slots, so most acquisitions wait for a release.
const (
	contenders = 64
	slots      = 8
)

func benchBudget(b *testing.B, inFlight int) *budget.Budget {
	b.Helper()
	bg, err := budget.New(budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: inFlight}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bg.Close() })
	return bg
}

func BenchmarkAcquireRelease(b *testing.B) {
	bg := benchBudget(b, 1<<30)
	ctx := context.Background()
	req := budget.Request{Domains: []budget.Domain{{Version: 1, ID: "a"}}, Class: budget.OpGet}
	b.ReportAllocs()
	for b.Loop() {
		l, err := bg.Acquire(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		l.Release()
	}
}

func BenchmarkAcquireReleaseMultiDomain(b *testing.B) {
	bg := benchBudget(b, 1<<30)
	ctx := context.Background()
	req := budget.Request{Domains: []budget.Domain{
		{Version: 1, ID: "account"}, {Version: 1, ID: "bucket"}, {Version: 1, ID: "region"}, {Version: 1, ID: "endpoint"},
	}, Class: budget.OpGet}
	b.ReportAllocs()
	for b.Loop() {
		l, err := bg.Acquire(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		l.Release()
	}
}

func BenchmarkAcquireReleaseContended(b *testing.B) {
	bg := benchBudget(b, slots)
	req := budget.Request{Domains: []budget.Domain{{Version: 1, ID: "a"}}, Class: budget.OpGet}
	contend(b, func(ctx context.Context) {
		l, err := bg.Acquire(ctx, req)
		if err != nil {
			b.Error(err)
			return
		}
		l.Release()
	})
}

func BenchmarkSemaphoreAcquireRelease(b *testing.B) {
	sem := semaphore.NewWeighted(1 << 30)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := sem.Acquire(ctx, 1); err != nil {
			b.Fatal(err)
		}
		sem.Release(1)
	}
}

func BenchmarkSemaphoreAcquireReleaseContended(b *testing.B) {
	sem := semaphore.NewWeighted(slots)
	contend(b, func(ctx context.Context) {
		if err := sem.Acquire(ctx, 1); err != nil {
			b.Error(err)
			return
		}
		sem.Release(1)
	})
}

// contend runs op b.N times in all, spread over exactly contenders
// goroutines (b.RunParallel would start a multiple of GOMAXPROCS).
func contend(b *testing.B, op func(context.Context)) {
	b.Helper()
	ctx := context.Background()
	var next atomic.Int64
	n := int64(b.N)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range contenders {
		wg.Go(func() {
			<-start
			for next.Add(1) <= n {
				op(ctx)
			}
		})
	}
	b.ReportAllocs()
	b.ResetTimer()
	close(start)
	wg.Wait()
}
