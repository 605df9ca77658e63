// Package httpbudget runs every request of an http.Client through a
// budget.Budget, so that all hosts of a run share one provider quota.
package httpbudget
