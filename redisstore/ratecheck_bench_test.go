package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/admission"
	"github.com/runbudget/runbudget/internal/redistest"
)

// BenchmarkRateCheck compares NewRateCheck's check with redis_rate's
// Limiter.Allow on the same redis-server, same client settings and same
// keys, with 1 and 64 goroutines, on the admitting path (a rate nothing
// exhausts) and the denying path (a bucket that stays empty). Both are one
// EVALSHA per call; ns/op is wall time per call, so with 64 goroutines it
// measures throughput.
func BenchmarkRateCheck(b *testing.B) {
	s := redistest.Start(b)
	const keys = 100
	keyNames := make([]string, keys)
	for i := range keyNames {
		keyNames[i] = "bench-key-" + strconv.Itoa(i)
	}
	type limiterFunc func(ctx context.Context, key string) (bool, error)
	type impl struct {
		name string
		make func(c *redis.Client, deny bool) limiterFunc
	}
	impls := []impl{
		{"RateCheck", func(c *redis.Client, deny bool) limiterFunc {
			p := admission.RatePolicy{PerSecond: 1e6, Burst: 1e6}
			if deny {
				p = admission.RatePolicy{PerSecond: 1.0 / 3600, Burst: 1}
			}
			check, err := NewRateCheck(c, rcPrefix(), p)
			if err != nil {
				b.Fatal(err)
			}
			return func(ctx context.Context, key string) (bool, error) {
				d, err := check(ctx, key)
				return d.Allowed, err
			}
		}},
		{"redis_rate", func(c *redis.Client, deny bool) limiterFunc {
			lim := redis_rate.NewLimiter(c)
			l := redis_rate.Limit{Rate: 1e6, Burst: 1e6, Period: time.Second}
			if deny {
				l = redis_rate.PerHour(1)
			}
			prefix := rcPrefix()
			return func(ctx context.Context, key string) (bool, error) {
				r, err := lim.Allow(ctx, prefix+key, l)
				if err != nil {
					return false, err
				}
				return r.Allowed > 0, nil
			}
		}},
	}
	for _, path := range []string{"admit", "deny"} {
		for _, goroutines := range []int{1, 64} {
			for _, im := range impls {
				b.Run(fmt.Sprintf("%s/%s/goroutines=%d", path, im.name, goroutines), func(b *testing.B) {
					c := redis.NewClient(&redis.Options{Addr: s.Addr(), PoolSize: 64, ContextTimeoutEnabled: true})
					defer c.Close()
					f := im.make(c, path == "deny")
					ctx := context.Background()
					// Warm up: load the script, open connections, and for the
					// deny path empty every bucket.
					for _, k := range keyNames {
						if _, err := f(ctx, k); err != nil {
							b.Fatal(err)
						}
					}
					var want atomic.Int64 // calls that got the expected answer
					var next atomic.Int64
					n := int64(b.N)
					if err := c.ConfigResetStat(ctx).Err(); err != nil {
						b.Fatal(err)
					}
					b.ResetTimer()
					var wg sync.WaitGroup
					for g := range goroutines {
						wg.Go(func() {
							for i := next.Add(1); i <= n; i = next.Add(1) {
								ok, err := f(ctx, keyNames[(int(i)+g)%keys])
								if err != nil {
									b.Error(err)
									return
								}
								if ok == (path == "admit") {
									want.Add(1)
								}
							}
						})
					}
					wg.Wait()
					b.StopTimer()
					if got := want.Load(); got != n {
						b.Fatalf("%d of %d calls did not %s", n-got, n, path)
					}
					// Server-side figures: commands per call (1 is one round
					// trip) and the script's own time, which client-side
					// scheduling noise does not reach.
					calls, usec := rcScriptStats(b, c)
					b.ReportMetric(float64(calls)/float64(n), "cmds/op")
					b.ReportMetric(float64(usec)/float64(n), "redis-µs/op")
				})
			}
		}
	}
}

// rcScriptStats reads INFO commandstats for EVALSHA and EVAL: how many ran
// and their total time in microseconds, commands run inside the scripts
// included. Nested commands have lines of their own, which are not counted,
// so calls counts round trips.
func rcScriptStats(b *testing.B, c *redis.Client) (calls, usec int64) {
	b.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				calls += n
			case "usec":
				usec += n
			}
		}
	}
	return calls, usec
}
