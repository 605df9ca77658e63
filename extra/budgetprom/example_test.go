package budgetprom_test

import (
	"context"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/extra/budgetprom"
)

// A host's metrics: the collector observes the Budget it is given to, and
// reads the Budget's own counts at scrape time once attached.
func ExampleNewHost() {
	c, err := budgetprom.NewHost(budgetprom.HostOpts{Budget: "copy-job"})
	if err != nil {
		fmt.Println(err)
		return
	}
	b, err := budget.New(budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 8}}, budget.WithObserver(c))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	c.Attach(b)
	prometheus.MustRegister(c) // or any registry served by promhttp
	defer prometheus.Unregister(c)

	l, err := b.Acquire(context.Background(), budget.Request{Domains: []budget.Domain{{Version: 1, ID: "bucket"}}, Class: budget.OpGet})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Release()
	page, err := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, "runbudget_host_leases_held")
	if err != nil {
		fmt.Println(err)
		return
	}
	os.Stdout.Write(page)
	// Output:
	// # HELP runbudget_host_leases_held Leases granted on this host that their holders have not yet released in full.
	// # TYPE runbudget_host_leases_held gauge
	// runbudget_host_leases_held{budget="copy-job"} 1
}
