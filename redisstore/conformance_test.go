package redisstore_test

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/budget/budgettest"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// go-redis keeps a pool reaper per client only while the client is
		// open; clients here close at test cleanup, but miniredis servers of
		// parallel packages do not matter: this checks our own goroutines.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
		// A dial go-redis's pool started for a call that gave up (a
		// renewal stopped by Close, say) finishes on its own, into the
		// pool of a client that is still open.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).queuedNewConn.func2"),
	)
	os.Exit(0)
}

var budgetSeq atomic.Int64

// harness builds the suite's budgets as hosts of one Redis budget with a
// unique name per test, each host with its own store.
func harness(client func(t testing.TB) redis.UniversalClient, slack time.Duration, storeOpts ...redisstore.Option) budgettest.Harness {
	return budgettest.Harness{
		Open: func(t testing.TB) func(budget.Limits, ...budget.Option) (*budget.Budget, error) {
			c := client(t)
			name := fmt.Sprintf("conformance/%s/%d", t.Name(), budgetSeq.Add(1))
			return func(l budget.Limits, opts ...budget.Option) (*budget.Budget, error) {
				s, err := redisstore.New(c, name, append([]redisstore.Option{redisstore.WithLeaseTTL(3 * time.Second)}, storeOpts...)...)
				if err != nil {
					return nil, err
				}
				return budget.New(l, append([]budget.Option{budget.WithStore(s)}, opts...)...)
			}
		},
		ClockSlack: slack,
		// The server side of pooled connections, when the server runs in
		// this process (miniredis): not ours, and alive until the pool closes.
		LeakOptions: []goleak.Option{
			goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer"),
			goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer.func2"),
			goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).queuedNewConn.func2"),
		},
	}
}

func TestConformanceMiniredis(t *testing.T) {
	mr := miniredis.RunT(t)
	budgettest.Run(t, harness(func(t testing.TB) redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return c
	}, 20*time.Millisecond))
}

func TestConformanceRedis(t *testing.T) {
	srv := redistest.Start(t)
	budgettest.Run(t, harness(func(t testing.TB) redis.UniversalClient { return srv.Client(t) }, 20*time.Millisecond))
}

// TestConformanceRedisEval runs the suite on Redis 7 with the scripts sent
// by EVALSHA, as on a server where the function library cannot be loaded.
func TestConformanceRedisEval(t *testing.T) {
	srv := redistest.Start(t)
	budgettest.Run(t, harness(func(t testing.TB) redis.UniversalClient { return srv.Client(t) }, 20*time.Millisecond, redisstore.WithEvalOnly()))
}

func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster start takes a few seconds")
	}
	cl := redistest.StartCluster(t, 3, 0)
	budgettest.Run(t, harness(func(t testing.TB) redis.UniversalClient { return cl.Client(t) }, 20*time.Millisecond))
}

// The suite again with a shard key that puts every domain in a group of
// its own, except those the suite's requests name together: FIFO,
// atomicity and every ceiling must hold as they do in one group, with the
// state of a test's domains spread over groups (and, on the cluster, over
// masters).
var spread = redisstore.WithShardKey(budgettest.ColocateShardKey)

func TestConformanceShardedMiniredis(t *testing.T) {
	mr := miniredis.RunT(t)
	budgettest.Run(t, harness(func(t testing.TB) redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return c
	}, 20*time.Millisecond, spread))
}

func TestConformanceShardedRedis(t *testing.T) {
	srv := redistest.Start(t)
	budgettest.Run(t, harness(func(t testing.TB) redis.UniversalClient { return srv.Client(t) }, 20*time.Millisecond, spread))
}

func TestConformanceShardedCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster start takes a few seconds")
	}
	cl := redistest.StartCluster(t, 3, 0)
	budgettest.Run(t, harness(func(t testing.TB) redis.UniversalClient { return cl.Client(t) }, 20*time.Millisecond, spread))
}
