package budgetprom

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/runbudget/runbudget/budget"
)

// OtherDomain is the domain label value that domains past the bound are
// counted under. Real values are budget.Domain.String() texts, which all
// start with "v" and a digit, so none can be mistaken for it.
const OtherDomain = "other"

// domainSeries are the children of one domain label value.
type domainSeries struct {
	acq       *cellTable
	throttles prometheus.Counter
}

// domainSet maps domains to their series, giving at most limit domains a
// label value of their own. Lookups of known domains take no lock: the map
// is replaced, never changed, and there are at most limit replacements.
type domainSet struct {
	limit int
	folds prometheus.Counter
	other *domainSeries
	make  func(value string) *domainSeries

	known atomic.Pointer[map[budget.Domain]*domainSeries]
	full  atomic.Bool // limit reached: unknown domains fold without the lock
	mu    sync.Mutex  // serializes additions
}

func newDomainSet(limit int, folds prometheus.Counter, mk func(string) *domainSeries) *domainSet {
	s := &domainSet{limit: limit, folds: folds, other: mk(OtherDomain), make: mk}
	m := map[budget.Domain]*domainSeries{}
	s.known.Store(&m)
	return s
}

// series returns d's series, adding d while there is room and mayAdd is
// set; otherwise it counts a fold and returns the "other" series.
func (s *domainSet) series(d budget.Domain, mayAdd bool) *domainSeries {
	if ds, ok := (*s.known.Load())[d]; ok {
		return ds
	}
	if !mayAdd || s.full.Load() {
		s.folds.Inc()
		return s.other
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := *s.known.Load()
	if ds, ok := cur[d]; ok { // added while this call waited for the lock
		return ds
	}
	if len(cur) >= s.limit {
		s.full.Store(true)
		s.folds.Inc()
		return s.other
	}
	next := make(map[budget.Domain]*domainSeries, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	ds := s.make(d.String())
	next[d] = ds
	s.known.Store(&next)
	return ds
}
