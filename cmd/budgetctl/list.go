package main

import (
	"fmt"

	"github.com/runbudget/runbudget/cmd/budgetctl/internal/clitext"
	"github.com/runbudget/runbudget/redisstore"
	"github.com/spf13/cobra"
)

func (a *app) listCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the budgets in Redis, with domain, lease and waiter counts",
		Long: `list finds every budget in the Redis and prints, for each, how many
shard groups it has (1 unless its hosts use a shard key), how many domains
it tracks and how many leases and waiters it holds, over all its groups.
Counts may include entries that expired but were not yet reclaimed.

With --json it prints one JSON array of {name, groups, domains, leases, waiters}.`,
		Args: exactArgs(),
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			ctx, adm, done, err := a.opAdmin(cmd)
			if err != nil {
				return err
			}
			defer done()
			list, err := adm.List(ctx)
			if err != nil {
				return err
			}
			if a.json {
				if list == nil {
					list = []redisstore.BudgetSummary{}
				}
				return clitext.JSON(a.stdout, list)
			}
			if len(list) == 0 {
				_, err := fmt.Fprintln(a.stdout, "no budgets in this Redis")
				return err
			}
			tw := clitext.Table(a.stdout)
			fmt.Fprintln(tw, "NAME\tGROUPS\tDOMAINS\tLEASES\tWAITERS")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", clitext.Quote(s.Name), s.Groups, s.Domains, s.Leases, s.Waiters)
			}
			return tw.Flush()
		}),
	}
}
