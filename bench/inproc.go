package main

import (
	"context"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/runbudget/runbudget/budget"
)

// nsPerOp runs op from g goroutines for about d and returns the wall time
// per operation (with g > 1, the inverse of throughput).
func nsPerOp(ctx context.Context, g int, d time.Duration, op func(context.Context) error) (Round, error) {
	var (
		stop  atomic.Bool
		ops   atomic.Int64
		first atomic.Pointer[error]
		wg    sync.WaitGroup
		ready sync.WaitGroup
		start = make(chan struct{})
	)
	for range g {
		ready.Add(1)
		wg.Go(func() {
			ready.Done()
			<-start
			var n int64
			for !stop.Load() {
				for range 64 {
					if err := op(ctx); err != nil {
						first.CompareAndSwap(nil, &err)
						stop.Store(true)
						break
					}
					n++
				}
			}
			ops.Add(n)
		})
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	wall := time.Since(t0)
	if p := first.Load(); p != nil {
		return Round{}, *p
	}
	n := ops.Load()
	return Round{V: float64(wall.Nanoseconds()) / float64(n), Rate: float64(n) / wall.Seconds(), N: int(n)}, nil
}

// p7: the in-process budget against x/sync/semaphore, which bounds
// concurrency and nothing else: uncontended, and 64 goroutines on 8 slots.
func p7(ctx context.Context, e *env) error {
	inproc := func(slots int) (*budget.Budget, error) {
		return budget.New(budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: slots}})
	}
	free, err := inproc(1 << 30)
	if err != nil {
		return err
	}
	defer free.Close()
	tight, err := inproc(slots)
	if err != nil {
		return err
	}
	defer tight.Close()
	req := budget.Request{Domains: []budget.Domain{{Version: 1, ID: "a"}}, Class: budget.OpGet}
	use := func(b *budget.Budget) func(context.Context) error {
		return func(ctx context.Context) error {
			l, err := b.Acquire(ctx, req)
			if err != nil {
				return err
			}
			l.Release()
			return nil
		}
	}
	weighted := func(n int64) func(context.Context) error {
		sem := semaphore.NewWeighted(n)
		return func(ctx context.Context) error {
			if err := sem.Acquire(ctx, 1); err != nil {
				return err
			}
			sem.Release(1)
			return nil
		}
	}
	semFree, semTight := weighted(1<<30), weighted(slots)
	d := e.sz.inproc
	s := "P7 in-process budget"
	fSem := e.figure(sectionFloors, "peer.semaphore.g1", "x/sync/semaphore Acquire+Release, uncontended", "ns", false)
	fSem64 := e.figure(sectionFloors, "peer.semaphore.g64", "x/sync/semaphore Acquire+Release, 64 goroutines on 8 slots", "ns", false)
	fB := e.figure(s, "p7.budget.g1", "budget Acquire+Release, uncontended", "ns", false)
	fB64 := e.figure(s, "p7.budget.g64", "budget Acquire+Release, 64 goroutines on 8 slots", "ns", false)
	if err := e.rounds(ctx,
		into(fSem, func(ctx context.Context) (Round, error) { return nsPerOp(ctx, 1, d, semFree) }),
		into(fB, func(ctx context.Context) (Round, error) { return nsPerOp(ctx, 1, d, use(free)) }),
		into(fSem64, func(ctx context.Context) (Round, error) { return nsPerOp(ctx, 64, d, semTight) }),
		into(fB64, func(ctx context.Context) (Round, error) { return nsPerOp(ctx, 64, d, use(tight)) }),
	); err != nil {
		return err
	}
	e.target(perRound("P7a", "in-process Acquire+Release / semaphore, uncontended", "x", "<=", 10, ratios(fB, fSem, p50)))
	e.target(perRound("P7b", "in-process Acquire+Release / semaphore, 64 goroutines on 8 slots", "x", "<=", 3, ratios(fB64, fSem64, p50)))

	if e.cfg.cpuProfile != "" {
		f, err := os.Create(e.cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		_, err = nsPerOp(ctx, 1, 3*time.Second, use(free))
		pprof.StopCPUProfile()
		if err != nil {
			return err
		}
		e.note("CPU profile of the uncontended in-process loop: %s (go tool pprof -top %s)", e.cfg.cpuProfile, e.cfg.cpuProfile)
	}
	return nil
}
