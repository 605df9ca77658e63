// Package budgetprom turns runbudget into Prometheus metrics, so operators
// can graph and alert on waiting lanes, throttles and lost leases instead of
// watching budgetctl. It lives in its own module so that users of the budget
// alone never download client_golang.
//
// Three kinds of collector:
//
//   - HostCollector, one per Budget in a process: a budget.Observer that
//     counts Acquire outcomes and wait times, throttles, lost leases and
//     store errors, plus gauges of what this host holds.
//   - ConcurrencyCollector and RateCollector, for the admission middleware's
//     snapshots.
//   - Exporter, which reads every budget in a Redis through redisstore.Admin
//     on each scrape; cmd/runbudget-exporter serves it over HTTP.
//
// Domain labels carry budget.Domain.String() (v1:"acct-42"), the form
// budgetctl prints and accepts back. Every name follows the Prometheus
// conventions and is checked by promlint in the tests.
package budgetprom
