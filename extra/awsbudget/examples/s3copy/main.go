// Command s3copy is a copy job: N hosts x M lanes copy the objects of one
// bucket to another, first with the plain SDK and then with every host on
// one shared runbudget budget, and print for each run the objects copied
// and failed, the 503s drawn and the wall time.
//
// By default it runs against an in-process fake provider (gofakes3 behind a
// throttle with S3's behaviour under overload: a read and a write rate and a
// concurrency ceiling per bucket, 503 SlowDown over them) and an embedded
// Redis, so the whole story runs with one command:
//
//	go run ./examples/s3copy
//
// With --endpoint it copies between real buckets of an S3-compatible server
// (credentials from the usual AWS environment and files), and with --redis
// the hosts share a real Redis, as hosts on separate machines would:
//
//	go run ./examples/s3copy --endpoint http://127.0.0.1:9000 --src photos --dst photos-copy \
//	    --redis redis://127.0.0.1:6379 --rate 3000 --run budget
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/extra/awsbudget"
	"github.com/runbudget/runbudget/extra/awsbudget/internal/copyjob"
	"github.com/runbudget/runbudget/extra/awsbudget/internal/s3fake"
	"github.com/runbudget/runbudget/redisstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "s3copy:", err)
		os.Exit(1)
	}
}

type flags struct {
	endpoint, region, src, dst, prefix, redisURL, runs, copyMode string
	hosts, lanes, objects, maxKiB, inFlight                      int
	rate                                                         float64
}

func run(ctx context.Context, args []string, out io.Writer) error {
	var f flags
	fs := flag.NewFlagSet("s3copy", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&f.endpoint, "endpoint", "", "S3-compatible endpoint URL (default: an in-process fake provider)")
	fs.StringVar(&f.region, "region", "us-east-1", "region of the buckets")
	fs.StringVar(&f.src, "src", "src", "source bucket")
	fs.StringVar(&f.dst, "dst", "dst", "destination bucket (with the fake, each run gets its own: <dst>-plain, <dst>-budget)")
	fs.StringVar(&f.prefix, "prefix", "", "copy only the source keys under this prefix")
	fs.StringVar(&f.redisURL, "redis", "", "Redis URL shared by the hosts (default: an embedded Redis)")
	fs.StringVar(&f.runs, "run", "", "which runs: both, plain or budget (default: both with the fake, budget with --endpoint)")
	fs.StringVar(&f.copyMode, "copy", "mixed", "how objects are copied: client (GetObject + PutObject), server (CopyObject) or mixed")
	fs.IntVar(&f.hosts, "hosts", 4, "simulated hosts, each with its own SDK client and Budget")
	fs.IntVar(&f.lanes, "lanes", 8, "concurrent copies per host")
	fs.IntVar(&f.objects, "objects", 300, "objects seeded into the fake's source bucket")
	fs.IntVar(&f.maxKiB, "max-kib", 128, "largest seeded object, KiB (the smallest is 16)")
	fs.Float64Var(&f.rate, "rate", 60, "budget: requests per second per bucket (the fake allows 60 writes and 100 reads)")
	fs.IntVar(&f.inFlight, "in-flight", 8, "budget: requests per class in flight per bucket, and open GET bodies (the fake allows 8)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.hosts < 1 || f.lanes < 1 || f.objects < 1 || f.rate <= 0 || f.inFlight < 1 {
		return errors.New("--hosts, --lanes, --objects, --rate and --in-flight must be positive")
	}
	if f.runs == "" {
		f.runs = "both"
		if f.endpoint != "" {
			f.runs = "budget"
		}
	}
	if f.runs != "both" && f.runs != "plain" && f.runs != "budget" {
		return fmt.Errorf("--run %q: want both, plain or budget", f.runs)
	}
	serverSide, err := copyMode(f.copyMode)
	if err != nil {
		return err
	}

	env, err := newEnv(ctx, f, out)
	if err != nil {
		return err
	}
	defer env.close()

	for _, budgeted := range []bool{false, true} {
		if (budgeted && f.runs == "plain") || (!budgeted && f.runs == "budget") {
			continue
		}
		if err := env.copyRun(ctx, f, budgeted, serverSide, out); err != nil {
			return err
		}
	}
	return nil
}

func copyMode(m string) (func(string) bool, error) {
	switch m {
	case "client":
		return nil, nil
	case "server":
		return func(string) bool { return true }, nil
	case "mixed":
		// Keys ending in 0, 3, 6 or 9 go server-side.
		return func(k string) bool { return k != "" && k[len(k)-1]%3 == 0 }, nil
	}
	return nil, fmt.Errorf("--copy %q: want client, server or mixed", m)
}

// env is where the runs happen: the provider, its credentials, and Redis.
type env struct {
	fake     *s3fake.Server // nil with --endpoint
	endpoint string
	creds    aws.CredentialsProvider
	sums     map[string][32]byte // the fake's seeded objects
	redis    redis.UniversalClient
	closers  []func()
}

func newEnv(ctx context.Context, f flags, out io.Writer) (*env, error) {
	e := &env{endpoint: f.endpoint}
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()
	if f.endpoint == "" {
		e.fake = s3fake.Start(s3fake.Limits{
			ReadRate: 100, WriteRate: 60, Burst: 10,
			InFlight: map[string]int{s3fake.List: 4, s3fake.Head: 8, s3fake.Get: 8, s3fake.Put: 8, s3fake.Delete: 8},
		})
		e.closers = append(e.closers, e.fake.Close)
		e.endpoint = e.fake.URL
		e.creds = credentials.NewStaticCredentialsProvider("AKIDFAKE", "fake-secret", "")
		if err := e.fake.CreateBucket(f.src); err != nil {
			return nil, err
		}
		direct, closeDirect := copyjob.NewClient(e.fake.DirectURL, f.region, e.creds, nil)
		defer closeDirect()
		fmt.Fprintf(out, "fake provider at %s: per bucket 100 reads/s, 60 writes/s, 8 requests of a class at once\n", e.fake.URL)
		sums, err := copyjob.Seed(ctx, direct, f.src, f.objects, f.maxKiB<<10, 1)
		if err != nil {
			return nil, err
		}
		e.sums = sums
		fmt.Fprintf(out, "seeded %d objects into %s\n", len(sums), f.src)
	} else {
		cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion(f.region))
		if err != nil {
			return nil, fmt.Errorf("AWS config: %w", err)
		}
		e.creds = cfg.Credentials
	}
	if f.redisURL == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return nil, fmt.Errorf("embedded Redis: %w", err)
		}
		e.closers = append(e.closers, mr.Close)
		e.redis = redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	} else {
		opt, err := redis.ParseURL(f.redisURL)
		if err != nil {
			// ParseURL's error never repeats the URL, so no password leaks.
			return nil, fmt.Errorf("--redis: %w", err)
		}
		opt.ContextTimeoutEnabled = true
		e.redis = redis.NewClient(opt)
	}
	e.closers = append(e.closers, func() { e.redis.Close() })
	ok = true
	return e, nil
}

func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// copyRun runs the job once, with or without the budget, and prints its
// result.
func (e *env) copyRun(ctx context.Context, f flags, budgeted bool, serverSide func(string) bool, out io.Writer) error {
	name, dst := "plain SDK", f.dst
	if budgeted {
		name = "budget"
	}
	if e.fake != nil {
		dst = f.dst + "-plain"
		if budgeted {
			dst = f.dst + "-budget"
		}
		if err := e.fake.CreateBucket(dst); err != nil {
			return err
		}
		e.fake.ResetStats() // each run meets a provider with full buckets
	}
	limits := budget.Limits{
		RequestsPerSecond: f.rate,
		Burst:             5,
		OpenBodies:        f.inFlight,
		InFlight:          map[budget.OpClass]int{},
	}
	for _, c := range []budget.OpClass{budget.OpList, budget.OpHead, budget.OpGet, budget.OpPut, budget.OpDelete} {
		limits.InFlight[c] = f.inFlight
	}
	var counter copyjob.Counter
	var clients []*s3.Client
	for h := range f.hosts {
		var opts []func(*s3.Options)
		if budgeted {
			// One Budget per host, all on the same Redis budget name.
			st, err := redisstore.New(e.redis, "s3copy")
			if err != nil {
				return err
			}
			b, err := budget.New(limits, budget.WithStore(st), budget.WithReplaceLimits())
			if err != nil {
				return err
			}
			defer b.Close()
			opts = append(opts, awsbudget.WithBudget(b, awsbudget.WithConsumer(fmt.Sprintf("s3copy-host-%d", h))))
		}
		c, closeIdle := copyjob.NewClient(e.endpoint, f.region, e.creds, &counter, opts...)
		defer closeIdle()
		clients = append(clients, c)
	}
	res := copyjob.Run(ctx, copyjob.Job{Hosts: clients, Lanes: f.lanes, Src: f.src, Dst: dst, Prefix: f.prefix, ServerSide: serverSide})
	if err := ctx.Err(); err != nil {
		return err
	}

	var b strings.Builder
	fmt.Fprintf(&b, "%-9s %d hosts x %d lanes: copied %d, failed %d of %d listed; %d of %d responses were 503/429; %v",
		name+":", f.hosts, f.lanes, res.Copied, res.Failed, res.Listed, counter.Throttled.Load(), counter.Responses.Load(),
		res.Duration.Round(time.Millisecond))
	if e.fake != nil {
		direct, closeDirect := copyjob.NewClient(e.fake.DirectURL, f.region, e.creds, nil)
		defer closeDirect()
		intact, err := copyjob.Verify(ctx, direct, dst, e.sums)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "; %d of %d intact in %s", intact, len(e.sums), dst)
	}
	fmt.Fprintln(out, b.String())
	for i, err := range res.Errors {
		if i == 2 {
			break
		}
		fmt.Fprintf(out, "  e.g. %v\n", err)
	}
	return nil
}
