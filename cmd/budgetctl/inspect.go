package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/cmd/budgetctl/internal/clitext"
	"github.com/runbudget/runbudget/redisstore"
	"github.com/spf13/cobra"
)

const inspectLong = `For each domain it shows requests in flight per class against their
ceilings ("-" is unbounded), open bodies, the rate bucket's tokens against
its burst, the rate factor (1 when the provider has not throttled; lower
while the budget backs off), how long new starts stay paused by a
provider's retry-after, and the waiters queued. Then every lease (consumer,
class, parts still held, age, time until it expires unless renewed) and
waiter. Domain IDs, budget names and consumers print quoted. Memory is not
shown: each host bounds its own, and Redis holds none of it.`

func (a *app) inspectCommand() *cobra.Command {
	var most int
	cmd := &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show one budget: limits, per-domain usage, leases and waiters",
		Long: "inspect prints a budget as it stands at one instant of Redis time.\n\n" + inspectLong +
			"\n\nWith --json it prints the whole inspection as one JSON document (durations in nanoseconds).",
		Args: exactArgs("NAME"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			ctx, adm, done, err := a.opAdmin(cmd)
			if err != nil {
				return err
			}
			defer done()
			in, err := adm.Inspect(ctx, args[0], most)
			if err != nil {
				return err
			}
			if a.json {
				return clitext.JSON(a.stdout, in)
			}
			var buf bytes.Buffer
			renderInspection(&buf, in)
			_, err = a.stdout.Write(buf.Bytes())
			return err
		}),
	}
	cmd.Flags().IntVar(&most, "max", 100, "list at most this many leases and waiters")
	return cmd
}

func (a *app) watchCommand() *cobra.Command {
	var (
		most     int
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "watch NAME",
		Short: "Show a budget like inspect, refreshed in place until interrupted",
		Long: "watch redraws what inspect shows every --interval until SIGINT or SIGTERM,\n" +
			"then exits 0. On a terminal it redraws in place; otherwise it prints one\n" +
			"frame after another. With --json it prints one JSON document per line per\n" +
			"refresh. If the first read fails, watch exits with that error's code; later\n" +
			"failures are shown and retried.\n\n" + inspectLong,
		Args: exactArgs("NAME"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if interval <= 0 {
				return usageError("--interval must be positive")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			cctx, cancel := a.opContext(ctx)
			adm, done, err := a.admin(cctx)
			cancel()
			if err != nil {
				return err
			}
			defer done()
			return a.watch(ctx, adm, args[0], most, interval)
		}),
	}
	cmd.Flags().IntVar(&most, "max", 100, "list at most this many leases and waiters")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between refreshes")
	return cmd
}

// watch draws frames until ctx ends. Only the first frame's error ends it:
// after that, a Redis blip or an expired budget is shown and retried, since
// watching through trouble is what watch is for.
func (a *app) watch(ctx context.Context, adm *redisstore.Admin, name string, most int, interval time.Duration) error {
	redraw := clitext.IsTerminal(a.stdout) && !a.json
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for frame := 0; ; frame++ {
		cctx, cancel := a.opContext(ctx)
		in, err := adm.Inspect(cctx, name, most)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && frame == 0 {
			return err
		}
		var buf bytes.Buffer
		switch {
		case a.json && err != nil:
			fmt.Fprintln(a.stderr, "budgetctl: watch: "+a.redact(err.Error()))
		case a.json:
			if err := clitext.JSON(&buf, in); err != nil {
				return err
			}
		default:
			if redraw {
				buf.WriteString("\x1b[H\x1b[2J")
			} else if frame > 0 {
				buf.WriteString("\n")
			}
			if err != nil {
				fmt.Fprintf(&buf, "budget %s at %s: %s\n", clitext.Quote(name), time.Now().Format(time.RFC3339), a.redact(err.Error()))
			} else {
				renderInspection(&buf, in)
			}
		}
		if _, err := a.stdout.Write(buf.Bytes()); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// renderInspection prints an inspection as aligned tables.
func renderInspection(w io.Writer, in redisstore.Inspection) {
	fmt.Fprintf(w, "budget %s at %s (Redis time)", clitext.Quote(in.Name), in.Now.UTC().Format(time.RFC3339))
	if in.Groups > 1 {
		fmt.Fprintf(w, "; %d shard groups", in.Groups)
	}
	if !in.Created.IsZero() {
		fmt.Fprintf(w, "; limits stored %s ago", formatDuration(in.Now.Sub(in.Created)))
	}
	// Memory is each host's own: Redis holds no memory limit or use.
	fmt.Fprintf(w, "\nlimits:  %s\n", clitext.SharedLimits(in.Limits))

	fmt.Fprintln(w)
	if len(in.Domains) == 0 {
		fmt.Fprintln(w, "domains: none with anything held, queued or throttled")
	} else {
		tw := clitext.Table(w)
		fmt.Fprint(tw, "DOMAIN")
		for _, c := range budget.Classes() {
			fmt.Fprintf(tw, "\t%s", upper(string(c)))
		}
		fmt.Fprintln(tw, "\tBODIES\tTOKENS\tFACTOR\tPAUSED\tWAITERS")
		for _, d := range in.Domains {
			fmt.Fprint(tw, d.Domain.String())
			for _, c := range budget.Classes() {
				fmt.Fprintf(tw, "\t%d/%s", d.InFlight[c], clitext.Ceiling(in.Limits.InFlight[c]))
			}
			tokens := "-"
			if d.Rate > 0 {
				tokens = strconv.FormatFloat(d.Tokens, 'f', 1, 64) + "/" + strconv.FormatFloat(d.Burst, 'f', 1, 64)
			}
			factor := strconv.FormatFloat(d.RateFactor, 'f', 2, 64)
			if d.Throttled {
				factor += " throttled"
			}
			fmt.Fprintf(tw, "\t%d/%s\t%s\t%s\t%s\t%d\n", d.OpenBodies, clitext.Ceiling(in.Limits.OpenBodies),
				tokens, factor, formatDuration(d.Paused), d.Waiters)
		}
		tw.Flush()
	}

	fmt.Fprintf(w, "\nleases: %d\n", len(in.Leases))
	if len(in.Leases) > 0 {
		tw := clitext.Table(w)
		fmt.Fprintln(tw, "CONSUMER\tCLASS\tHELD\tDOMAINS\tAGE\tEXPIRES IN\tID")
		for _, l := range in.Leases {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", clitext.Quote(l.Consumer), l.Class, l.Parts, formatDomains(l.Domains),
				formatDuration(l.Age), formatDuration(l.ExpiresIn), clitext.Quote(l.ID))
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "\nwaiters: %d\n", len(in.Waiters))
	if len(in.Waiters) > 0 {
		tw := clitext.Table(w)
		fmt.Fprintln(tw, "CONSUMER\tCLASS\tDOMAINS\tWAITING\tEXPIRES IN\tID")
		for _, wt := range in.Waiters {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", clitext.Quote(wt.Consumer), wt.Class, formatDomains(wt.Domains),
				formatDuration(wt.Waiting), formatDuration(wt.ExpiresIn), clitext.Quote(wt.ID))
		}
		tw.Flush()
	}
	if in.Truncated {
		fmt.Fprintln(w, "\n(more leases or waiters than shown; raise --max)")
	}
}

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}
