package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/runbudget/runbudget/cmd/budgetctl/internal/clitext"
	"github.com/runbudget/runbudget/redisstore"
	"github.com/spf13/cobra"
)

func (a *app) librariesCommand() *cobra.Command {
	var prune, yes bool
	cmd := &cobra.Command{
		Use:   "libraries [--prune [--yes]]",
		Short: "List the runbudget function libraries in Redis; --prune deletes those of other builds",
		Long: `On Redis 7 each build of runbudget loads its scripts as one function
library, named runbudget_<hash of the scripts>, and leaves it there. libraries
lists them, marking the one of this build of budgetctl. A Redis that served
several versions of runbudget holds one library for each.

--prune deletes every runbudget library but this build's. That is safe while
hosts run: a host whose library is gone loads it again on its next call, at
the cost of one round trip. It asks first (y/N from the terminal; refused
with exit 4 when stdin is not a terminal) unless --yes is given.

With --json it prints a JSON array of {name, current, functions}, or with
--prune {deleted: [names]}.`,
		Args: exactArgs(),
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if yes && !prune {
				return usageError("--yes goes with --prune")
			}
			ctx, adm, done, err := a.opAdmin(cmd)
			if err != nil {
				return err
			}
			defer done()
			libs, err := adm.Libraries(ctx)
			if errors.Is(err, redisstore.ErrNoFunctions) {
				if a.json {
					return clitext.JSON(a.stdout, []redisstore.Library{})
				}
				_, err := fmt.Fprintln(a.stdout, "this Redis does not support function libraries; budgets here run their scripts by EVALSHA")
				return err
			}
			if err != nil {
				return err
			}
			if !prune {
				if a.json {
					return clitext.JSON(a.stdout, libs)
				}
				if len(libs) == 0 {
					_, err := fmt.Fprintln(a.stdout, "no runbudget function libraries in this Redis")
					return err
				}
				tw := clitext.Table(a.stdout)
				fmt.Fprintln(tw, "LIBRARY\tFUNCTIONS\tBUILD")
				for _, l := range libs {
					build := "other"
					if l.Current {
						build = "this one"
					}
					fmt.Fprintf(tw, "%s\t%d\t%s\n", l.Name, l.Functions, build)
				}
				return tw.Flush()
			}
			var others []string
			for _, l := range libs {
				if !l.Current {
					others = append(others, l.Name)
				}
			}
			if len(others) == 0 {
				if a.json {
					return clitext.JSON(a.stdout, map[string]any{"deleted": []string{}})
				}
				_, err := fmt.Fprintln(a.stdout, "no runbudget libraries of other builds; nothing to prune")
				return err
			}
			if !yes {
				if err := a.confirm(fmt.Sprintf("Delete %d runbudget librar%s of other builds (%s)? Hosts still running them load them again.",
					len(others), plural(len(others), "y", "ies"), strings.Join(others, ", "))); err != nil {
					return err
				}
			}
			pctx, pcancel := a.opContext(cmd.Context())
			defer pcancel()
			deleted, err := adm.PruneLibraries(pctx)
			if err != nil {
				return err
			}
			if a.json {
				if deleted == nil {
					deleted = []string{}
				}
				return clitext.JSON(a.stdout, map[string]any{"deleted": deleted})
			}
			_, err = fmt.Fprintf(a.stdout, "deleted %d librar%s: %s\n", len(deleted), plural(len(deleted), "y", "ies"), strings.Join(deleted, ", "))
			return err
		}),
	}
	cmd.Flags().BoolVar(&prune, "prune", false, "delete the runbudget libraries of other builds")
	cmd.Flags().BoolVar(&yes, "yes", false, "with --prune: do not ask for confirmation")
	return cmd
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
