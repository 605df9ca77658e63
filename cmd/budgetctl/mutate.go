package main

import (
	"bufio"
	"fmt"
	"strings"
	"time"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/cmd/budgetctl/internal/clitext"
	"github.com/spf13/cobra"
)

const domainHelp = `A domain is V:ID: the version, an integer, before the first colon, and
the ID after it, taken byte for byte (it may hold colons): 1:acct-42,
1:s3:eu-west-1:acct-42. The quoted form budgetctl prints, v1:"acct-42", is
accepted too; an ID that starts with a double quote must be one Go-quoted
string.`

// domainFlag is a pflag value that parses V:ID as it is set, so a malformed
// domain is a usage error naming the problem.
type domainFlag struct {
	d   budget.Domain
	set bool
}

func (f *domainFlag) String() string {
	if !f.set {
		return ""
	}
	return f.d.String()
}
func (f *domainFlag) Type() string { return "V:ID" }
func (f *domainFlag) Set(s string) error {
	d, err := parseDomain(s)
	if err != nil {
		return err
	}
	f.d, f.set = d, true
	return nil
}

func (a *app) throttleCommand() *cobra.Command {
	var (
		dom        domainFlag
		retryAfter time.Duration
	)
	cmd := &cobra.Command{
		Use:   "throttle NAME --domain V:ID [--retry-after D]",
		Short: "Report a provider throttle on a domain, as a host would",
		Long: `throttle tells the budget that the provider throttled a request on the
domain: every host slows down together (the domain's rate factor drops and
recovers on its own), and with --retry-after no new request starts on the
domain until that much time has passed.

` + domainHelp,
		Args: exactArgs("NAME"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if !dom.set {
				return usageError("throttle needs --domain V:ID")
			}
			if retryAfter < 0 {
				return usageError("--retry-after %v is negative", retryAfter)
			}
			ctx, adm, done, err := a.opAdmin(cmd)
			if err != nil {
				return err
			}
			defer done()
			if err := adm.Throttle(ctx, args[0], dom.d, retryAfter); err != nil {
				return err
			}
			if a.json {
				return clitext.JSON(a.stdout, map[string]any{"budget": args[0], "domain": dom.d, "retry_after": retryAfter})
			}
			_, err = fmt.Fprintf(a.stdout, "throttled %s in budget %s (retry-after %s)\n", dom.d, clitext.Quote(args[0]), formatDuration(retryAfter))
			return err
		}),
	}
	cmd.Flags().Var(&dom, "domain", "the throttled domain, V:ID")
	cmd.Flags().DurationVar(&retryAfter, "retry-after", 0, "pause new starts on the domain this long (0: slow down only)")
	return cmd
}

func (a *app) resetCommand() *cobra.Command {
	var dom domainFlag
	cmd := &cobra.Command{
		Use:   "reset NAME --domain V:ID",
		Short: "Clear a domain's throttle state (rate factor back to 1, no pause)",
		Long: `reset clears what throttles left on the domain: the rate factor returns
to 1 and any pause ends. Use it when a throttle was reported in error.

` + domainHelp,
		Args: exactArgs("NAME"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if !dom.set {
				return usageError("reset needs --domain V:ID")
			}
			ctx, adm, done, err := a.opAdmin(cmd)
			if err != nil {
				return err
			}
			defer done()
			had, err := adm.ResetThrottle(ctx, args[0], dom.d)
			if err != nil {
				return err
			}
			if a.json {
				return clitext.JSON(a.stdout, map[string]any{"budget": args[0], "domain": dom.d, "had_state": had})
			}
			if !had {
				_, err = fmt.Fprintf(a.stdout, "%s in budget %s had no throttle state\n", dom.d, clitext.Quote(args[0]))
				return err
			}
			_, err = fmt.Fprintf(a.stdout, "reset the throttle state of %s in budget %s\n", dom.d, clitext.Quote(args[0]))
			return err
		}),
	}
	cmd.Flags().Var(&dom, "domain", "the domain to reset, V:ID")
	return cmd
}

func (a *app) limitsCommand() *cobra.Command {
	var sets []string
	cmd := &cobra.Command{
		Use:   "limits NAME [--set key=value,...]",
		Short: "Show a budget's stored limits, or replace some of them",
		Long: `Without --set, limits prints the budget's stored limits (with --json, as
JSON). With --set it replaces the limits named and keeps the others, then
prints the result. Running hosts enforce the new limits from their next
call; a host that starts later with different limits of its own is refused
(ErrLimitsConflict) unless it replaces them.

Keys (several per --set, comma separated, or several --set flags):
  rps=F                requests per second per domain
  burst=N              starts that may bunch together (0: one second's worth)
  ` + classKeys() + `
                       requests in flight per class per domain
  bodies=N             open response bodies per domain
A value of 0 (or -) makes that dimension unbounded. Setting rps without
burst resets burst to its default. Memory is not among them: each host
bounds its own buffers (Limits.MemoryBytes of its Budget), and Redis
stores no memory limit.

Example: budgetctl limits demo --set rps=100,burst=10,get=8,list=4,head=0,copy_source_read=2,bodies=16`,
		Args: exactArgs("NAME"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			// Parse before connecting, so a typo is a usage error even when
			// Redis is down.
			if _, err := applyLimitSet(budget.Limits{}, sets); err != nil {
				return err
			}
			ctx, adm, done, err := a.opAdmin(cmd)
			if err != nil {
				return err
			}
			defer done()
			in, err := adm.Inspect(ctx, args[0], 1)
			if err != nil {
				return err
			}
			l := in.Limits
			if len(sets) > 0 {
				if l, err = applyLimitSet(in.Limits, sets); err != nil {
					return err
				}
				if l, err = l.Normalize(); err != nil {
					return err
				}
				if err := adm.ReplaceLimits(ctx, args[0], l); err != nil {
					return err
				}
			}
			if a.json {
				return clitext.JSON(a.stdout, l)
			}
			verb := "limits of"
			if len(sets) > 0 {
				verb = "new limits of"
			}
			_, err = fmt.Fprintf(a.stdout, "%s budget %s: %s\n  as --set: %s\n", verb, clitext.Quote(args[0]), clitext.SharedLimits(l), limitsSetString(l))
			return err
		}),
	}
	cmd.Flags().StringArrayVar(&sets, "set", nil, "key=value[,key=value...] to replace (see above)")
	return cmd
}

func (a *app) dropLeasesCommand() *cobra.Command {
	var (
		consumer string
		all, yes bool
	)
	cmd := &cobra.Command{
		Use:   "drop-leases NAME (--consumer C | --all) [--yes]",
		Short: "Free the leases of a dead host at once, instead of waiting for them to expire",
		Long: `drop-leases returns the leases held by one consumer (--consumer, matched
exactly; hosts of the demo use their host name), or every lease (--all),
as if they had expired. Their slots free at once, even if the holder is in
fact alive, so it asks first: it reads y/N from the terminal, and when stdin
is not a terminal it refuses (exit 4) unless --yes is given.`,
		Args: exactArgs("NAME"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if all == (consumer != "") {
				return usageError("drop-leases needs exactly one of --consumer C and --all")
			}
			name := args[0]
			ctx, adm, done, err := a.opAdmin(cmd)
			if err != nil {
				return err
			}
			defer done()
			in, err := adm.Inspect(ctx, name, 0)
			if err != nil {
				return err
			}
			n := 0
			for _, l := range in.Leases {
				if all || l.Consumer == consumer {
					n++
				}
			}
			what, whose := "every lease", ""
			if !all {
				what, whose = "the leases of consumer "+clitext.Quote(consumer), " of consumer "+clitext.Quote(consumer)
			}
			if n == 0 && !in.Truncated {
				if a.json {
					return clitext.JSON(a.stdout, map[string]any{"budget": name, "dropped": 0})
				}
				_, err := fmt.Fprintf(a.stdout, "budget %s holds no leases%s; nothing to drop\n", clitext.Quote(name), whose)
				return err
			}
			if !yes {
				if err := a.confirm(fmt.Sprintf("Drop %s in budget %s (%d now held)? Their slots free at once, even if the holder is alive.", what, clitext.Quote(name), n)); err != nil {
					return err
				}
			}
			// The prompt may have waited a long time: give the drop its own
			// --timeout.
			dctx, dcancel := a.opContext(cmd.Context())
			defer dcancel()
			dropped, err := adm.DropLeases(dctx, name, consumer, all)
			if err != nil {
				return err
			}
			if a.json {
				return clitext.JSON(a.stdout, map[string]any{"budget": name, "dropped": dropped})
			}
			_, err = fmt.Fprintf(a.stdout, "dropped %d lease(s) from budget %s\n", dropped, clitext.Quote(name))
			return err
		}),
	}
	cmd.Flags().StringVar(&consumer, "consumer", "", "drop the leases of this consumer")
	cmd.Flags().BoolVar(&all, "all", false, "drop every lease of the budget")
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	return cmd
}

// confirm asks question on stderr and reads y/N from stdin. It refuses
// when stdin is not a terminal: a script must say --yes, not pipe a "y".
func (a *app) confirm(question string) error {
	if !clitext.IsTerminal(a.stdin) {
		return &cmdError{code: exitDeclined, err: fmt.Errorf("not confirmed: stdin is not a terminal; pass --yes to go ahead without asking")}
	}
	fmt.Fprintf(a.stderr, "%s [y/N] ", question)
	line, _ := bufio.NewReader(a.stdin).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return &cmdError{code: exitDeclined, err: fmt.Errorf("not confirmed; nothing changed")}
}

// classKeys is the class keys of a --set list for help: one per class of
// budget's table, "list=N head=N ...".
func classKeys() string {
	var b strings.Builder
	for i, c := range budget.Classes() {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(string(c) + "=N")
	}
	return b.String()
}
