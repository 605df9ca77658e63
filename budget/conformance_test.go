package budget_test

import (
	"testing"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/budget/budgettest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance runs the store suite on the in-process store, in virtual
// time, so its rate and throttle checks are exact.
func TestConformance(t *testing.T) {
	budgettest.Run(t, budgettest.Harness{
		Open: func(testing.TB) func(budget.Limits, ...budget.Option) (*budget.Budget, error) {
			s := budget.NewLocalStore() // one state, shared by every host built below
			return func(l budget.Limits, opts ...budget.Option) (*budget.Budget, error) {
				return budget.New(l, append([]budget.Option{budget.WithStore(s)}, opts...)...)
			}
		},
		Synctest: true,
	})
}
