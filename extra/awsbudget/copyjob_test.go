package awsbudget_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/extra/awsbudget"
	"github.com/runbudget/runbudget/extra/awsbudget/internal/copyjob"
	"github.com/runbudget/runbudget/extra/awsbudget/internal/s3fake"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
)

const (
	region  = "us-east-1"
	hosts   = 4
	lanes   = 8
	objects = 300
)

var creds = credentials.NewStaticCredentialsProvider("AKIDFAKE", "fake-secret", "")

// fakeLimits is the provider of the copy test: per bucket, 60 writes and
// 100 reads a second, and 8 requests of a class at once.
var fakeLimits = s3fake.Limits{
	ReadRate:  100,
	WriteRate: 60,
	Burst:     10,
	InFlight:  map[string]int{s3fake.List: 4, s3fake.Head: 8, s3fake.Get: 8, s3fake.Put: 8, s3fake.Delete: 8},
}

// budgetLimits match the provider's: every domain (one per bucket) starts
// at most as many requests as the bucket's lower rate admits, and each class
// holds no more slots than the provider serves at once. A GET's slot counts
// until its body is closed (OpenBodies), as the provider counts it until the
// body is drained.
var budgetLimits = budget.Limits{
	RequestsPerSecond: fakeLimits.WriteRate,
	Burst:             5,
	InFlight: map[budget.OpClass]int{
		budget.OpList: 4, budget.OpHead: 8, budget.OpGet: 8, budget.OpPut: 8, budget.OpDelete: 8,
	},
	OpenBodies: 8,
}

// serverSide copies the objects whose key ends in 0, 3, 6 or 9 (40%) with
// CopyObject, the rest with
// GetObject and PutObject, so both ways of charging a copy are exercised.
func serverSide(key string) bool { return key[len(key)-1]%3 == 0 }

// TestCopyJob4Hosts8Lanes is the measurement: 4 hosts x 8 lanes copy
// 300 objects through a throttling provider, first with the plain SDK and
// then with every host on one budget in one real Redis. The budgeted run must
// copy every object intact with 503s at most 1% of its requests; both runs'
// wall times, 503s and lost objects are logged as FIGURE lines.
func TestCopyJob4Hosts8Lanes(t *testing.T) {
	if testing.Short() {
		t.Skip("copies 600 objects through a throttled fake; skipped with -short")
	}
	srv := redistest.Start(t)
	fake := s3fake.Start(fakeLimits)
	t.Cleanup(fake.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()

	direct, closeDirect := copyjob.NewClient(fake.DirectURL, region, creds, nil)
	defer closeDirect()
	if err := fake.CreateBucket("src"); err != nil {
		t.Fatal(err)
	}
	sums, err := copyjob.Seed(ctx, direct, "src", objects, 128<<10, 14)
	if err != nil {
		t.Fatal(err)
	}

	// The plain SDK: standard retry mode, no budget.
	plainHosts, closePlain := clients(fake.URL, hosts, nil)
	defer closePlain()
	plain := run(t, ctx, fake, plainHosts, "plain")
	plainLost := objects - intact(t, ctx, direct, "plain", sums)

	// The same job with every host on one shared budget.
	budgets := make([]*budget.Budget, hosts)
	for i := range budgets {
		budgets[i] = openBudget(t, srv.Client(t), "awsbudget-copy")
	}
	budgetHosts, closeBudget := clients(fake.URL, hosts, budgets)
	defer closeBudget()
	got := run(t, ctx, fake, budgetHosts, "budget")

	t.Logf("FIGURE plain-sdk: wall=%v requests=%d 503s=%d lost=%d (failed=%d) peak-in-flight=%v",
		plain.res.Duration.Round(time.Millisecond), plain.stats.Requests, plain.stats.Throttled, plainLost, plain.res.Failed, plain.stats.PeakInFlight)
	t.Logf("FIGURE budget: wall=%v requests=%d 503s=%d lost=%d (failed=%d) peak-in-flight=%v",
		got.res.Duration.Round(time.Millisecond), got.stats.Requests, got.stats.Throttled, objects-got.res.Copied, got.res.Failed, got.stats.PeakInFlight)
	t.Logf("FIGURE budget/plain wall time: %.2fx", got.res.Duration.Seconds()/plain.res.Duration.Seconds())

	if got.res.Listed != objects || got.res.Copied != objects || got.res.Failed != 0 {
		t.Errorf("budgeted run: listed %d, copied %d, failed %d of %d; first errors: %v",
			got.res.Listed, got.res.Copied, got.res.Failed, objects, got.res.Errors)
	}
	if n := intact(t, ctx, direct, "budget", sums); n != objects {
		t.Errorf("budgeted run: %d of %d objects intact at the destination", n, objects)
	}
	if limit := got.stats.Requests / 100; got.stats.Throttled > limit {
		t.Errorf("budgeted run drew %d 503s in %d requests, over 1%% (%d)", got.stats.Throttled, got.stats.Requests, limit)
	}
	// Not a timing bar (that is the FIGURE above): only a guard against a
	// budget that serializes the run, far beyond any scheduling noise.
	if bound := 3*plain.res.Duration + 10*time.Second; got.res.Duration > bound {
		t.Errorf("budgeted run took %v, more than 3x the plain SDK's %v + 10s", got.res.Duration, plain.res.Duration)
	}
	// A host's last Release may ride its store's next call; each host's
	// Usage waits for its own, so every host is read once before any is
	// judged.
	for i, b := range budgets {
		if _, err := b.Usage(ctx); err != nil {
			t.Fatalf("host %d: Usage: %v", i, err)
		}
	}
	for i, b := range budgets {
		u, err := b.Usage(ctx)
		if err != nil {
			t.Fatalf("host %d: Usage: %v", i, err)
		}
		for _, d := range u.Domains {
			if len(d.InFlight) != 0 || d.OpenBodies != 0 || d.Waiters != 0 {
				t.Errorf("host %d: %s still holds %v in flight, %d bodies, %d waiters after the job", i, d.Domain, d.InFlight, d.OpenBodies, d.Waiters)
			}
		}
	}
}

type runResult struct {
	res   copyjob.Result
	stats s3fake.Stats
}

func run(t *testing.T, ctx context.Context, fake *s3fake.Server, hostClients []*s3.Client, dst string) runResult {
	t.Helper()
	if err := fake.CreateBucket(dst); err != nil {
		t.Fatal(err)
	}
	fake.ResetStats()
	res := copyjob.Run(ctx, copyjob.Job{Hosts: hostClients, Lanes: lanes, Src: "src", Dst: dst, ServerSide: serverSide})
	return runResult{res: res, stats: fake.Stats()}
}

// clients builds one SDK client per host, each on its own connection pool,
// and with budgets[i] when budgets is not nil.
func clients(endpoint string, n int, budgets []*budget.Budget) ([]*s3.Client, func()) {
	var cs []*s3.Client
	var closers []func()
	for i := range n {
		var opts []func(*s3.Options)
		if budgets != nil {
			opts = append(opts, awsbudget.WithBudget(budgets[i], awsbudget.WithConsumer(fmt.Sprintf("host-%d", i))))
		}
		c, closeIdle := copyjob.NewClient(endpoint, region, creds, nil, opts...)
		cs = append(cs, c)
		closers = append(closers, closeIdle)
	}
	return cs, func() {
		for _, f := range closers {
			f()
		}
	}
}

func openBudget(t *testing.T, c redis.UniversalClient, name string) *budget.Budget {
	t.Helper()
	st, err := redisstore.New(c, name)
	if err != nil {
		t.Fatalf("redisstore.New: %v", err)
	}
	b, err := budget.New(budgetLimits, budget.WithStore(st))
	if err != nil {
		t.Fatalf("budget.New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func intact(t *testing.T, ctx context.Context, c *s3.Client, bucket string, sums map[string][32]byte) int {
	t.Helper()
	n, err := copyjob.Verify(ctx, c, bucket, sums)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
