package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/cmd/budgetctl/internal/clitext"
	"github.com/runbudget/runbudget/cmd/budgetctl/internal/demo"
	"github.com/runbudget/runbudget/internal/childproc"
	"github.com/spf13/cobra"
)

// The demo's commands: their help, flags and exit codes. What they do is
// in package demo.

// workerCommandName is the command a demo host runs: the demo starts this
// program again with it.
const workerCommandName = "worker"

func (a *app) demoCommand() *cobra.Command {
	var flags demo.Flags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run a simulated copy job over several processes, with and without a shared budget",
		Long: `demo runs a copy job spread over --hosts worker processes (this binary,
started again as "worker") with --lanes lanes each, copying --objects
objects over HTTP from a simulated provider that enforces its own quota:
--quota requests per second (a token bucket holding a fifth of a second's
worth) and at most --max-concurrent requests at once. Over either it
answers 503 SlowDown with a Retry-After, and the refusal is not free: it
costs the provider --refusal-cost of a request from the same bucket (which
may go a bucket into debt), so hammering it lowers what it serves. The
provider runs in this process, so its quota covers every host, and it
measures everything from its side.

The budget lives in an embedded Redis (miniredis, on loopback) unless
--redis names a real one (REDIS_URL is not used here). Each object takes a
HEAD and a GET; hosts share listing pages through a counter in Redis.

Every lane's client retries like an SDK's (the AWS SDKs' standard mode):
at most --attempts attempts per request, full-jitter exponential backoff
between them (base 1s after a 503, 100ms after other failures, doubling,
capped at 20s), or the provider's Retry-After when that is longer. An
object whose attempts run out is lost; a listing page is listed again.

Two runs, the second for comparison (skip it with --no-baseline):
  shared budget   every attempt first acquires from one budget in Redis,
                  through httpbudget.Transport (--rps, --burst, in-flight
                  ceilings per class, --bodies, --memory per host); a 503
                  is reported to it, so all hosts slow down together
  per-lane limits each lane keeps the same limits for itself alone, as a
                  lane tuned in isolation would: a rate limiter at --rps and
                  one request at a time (so in-flight ceilings never bind).
                  Load multiplies by lanes.

The report compares, from the provider's side: objects copied and failed,
duration, requests received, refused and served, the share of the quota
used (served / quota x time), and the peak in flight per class against
the budget's ceilings. Progress shows as bars on a terminal, as periodic
lines otherwise; with --json the report is JSON on stdout and progress
goes to stderr.`,
		Args: exactArgs(),
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			cfg, err := flags.Resolve(cmd.Flags())
			if err != nil {
				return usageError("%v", err)
			}
			// Only --redis, never $REDIS_URL: the demo writes to no Redis
			// the command line did not name.
			if cfg.RedisURL = a.redisURL; cfg.RedisURL != "" {
				a.secrets = append(a.secrets, urlSecrets(cfg.RedisURL)...)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			progress := a.stdout
			if a.json {
				progress = a.stderr
			}
			rep, err := demo.Run(ctx, cfg, demo.Env{
				Progress: progress,
				Connect: func(ctx context.Context, url string) (*redis.Client, error) {
					ctx, cancel := a.opContext(ctx)
					defer cancel()
					return a.dial(ctx, url)
				},
				Redact:   a.redact,
				HostArgs: []string{workerCommandName},
				Timeout:  a.timeout,
			})
			if err != nil {
				return err
			}
			if a.json {
				return clitext.JSON(a.stdout, rep)
			}
			fmt.Fprintln(a.stdout)
			return demo.RenderReport(a.stdout, rep)
		}),
	}
	flags.Register(cmd.Flags())
	return cmd
}

func (a *app) workerCommand() *cobra.Command {
	var flags demo.WorkerFlags
	cmd := &cobra.Command{
		Use:   workerCommandName + " --provider URL [--redis URL]",
		Short: "Run one host of the demo's copy job (the demo starts these; so does docker-compose)",
		Long: `worker is one host of the demo's copy job. It claims listing pages from a
counter in Redis, so any number of workers share one run without knowing of
each other, and copies their objects from the provider with --lanes lanes.
Every provider request first acquires from the budget --budget in Redis
(through httpbudget.Transport); a 503 is reported to the budget, which
slows every host down together. With --no-budget each lane limits itself
instead (see the demo's help). Either way each lane's client retries like
an SDK's, at most --attempts attempts per request, and gives an object up
when they run out.

It prints one JSON line per --progress interval and a last one with
"type":"done". It exits 0 when the run's work is done, 1 on failure.`,
		Args: exactArgs(),
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			cfg, err := flags.Resolve(cmd.Flags())
			if err != nil {
				return usageError("%v", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if flags.ExitOnStdinEOF {
				// The demo holds our stdin open; EOF means it died, even if
				// the kernel's parent-death signal did not reach us.
				var cancel context.CancelFunc
				ctx, cancel = childproc.UntilEOF(ctx, a.stdin)
				defer cancel()
			}
			cctx, cancel := a.opContext(ctx)
			rdb, err := a.connect(cctx)
			cancel()
			if err != nil {
				return err
			}
			defer rdb.Close()
			if err := demo.RunWorker(ctx, cfg, rdb, a.stdout); err != nil {
				if ctx.Err() != nil {
					return failure("host %s: interrupted", cfg.Host)
				}
				return failure("host %s: %v", cfg.Host, err)
			}
			return nil
		}),
	}
	flags.Register(cmd.Flags())
	return cmd
}

func (a *app) providerCommand() *cobra.Command {
	var flags demo.ProviderFlags
	cmd := &cobra.Command{
		Use:   "provider",
		Short: "Serve the demo's simulated provider (for docker-compose)",
		Long: `provider serves the simulated object store the demo copies from: --objects
objects, a quota of --quota requests per second (a token bucket holding
--quota/5) and at most --max-concurrent requests at once. Over its quota it
answers 503 SlowDown with Retry-After (seconds) and Retry-After-Ms; each
refusal costs it --refusal-cost of a request from the same bucket. It logs
what it saw every --log-every while requests arrive, and serves its
counters as JSON at /stats. The demo runs the same code in its own process; this
command is for running it as a service, e.g. in docker-compose.`,
		Args: exactArgs(),
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			cfg, listen, every, err := flags.Resolve()
			if err != nil {
				return usageError("%v", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return demo.ServeProvider(ctx, cfg, listen, every, a.stdout, a.stderr)
		}),
	}
	flags.Register(cmd.Flags())
	return cmd
}
