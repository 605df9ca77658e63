package budgetprom_test

import (
	"crypto/rand"
	"encoding/hex"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// families gathers g, failing the test on a gathering error.
func families(t testing.TB, g prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// find returns the metric of family name whose labels include every
// name=value pair given, or nil.
func find(mfs map[string]*dto.MetricFamily, name string, pairs ...string) *dto.Metric {
	mf := mfs[name]
	if mf == nil {
		return nil
	}
next:
	for _, m := range mf.GetMetric() {
		for i := 0; i+1 < len(pairs); i += 2 {
			if label(m, pairs[i]) != pairs[i+1] {
				continue next
			}
		}
		return m
	}
	return nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// value returns the value of a gauge or counter, or the sample count of a
// histogram, failing the test when the series is absent.
func value(t testing.TB, mfs map[string]*dto.MetricFamily, name string, pairs ...string) float64 {
	t.Helper()
	m := find(mfs, name, pairs...)
	switch {
	case m == nil:
		t.Fatalf("no series %s%v", name, pairs)
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	t.Fatalf("series %s%v has no value", name, pairs)
	return 0
}

// labelValues returns the sorted values label takes in family name.
func labelValues(mfs map[string]*dto.MetricFamily, name, label string) []string {
	seen := map[string]bool{}
	for _, m := range mfs[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				seen[l.GetValue()] = true
			}
		}
	}
	var out []string
	for v := range seen {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// lint fails the test on every promlint problem in what g gathers.
func lint(t testing.TB, g prometheus.Gatherer) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatalf("promlint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// randomName returns a budget name no other test uses.
func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// hasPrefixFamily reports whether any family name starts with prefix.
func hasPrefixFamily(mfs map[string]*dto.MetricFamily, prefix string) bool {
	for n := range mfs {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}

type familiesMap = map[string]*dto.MetricFamily
