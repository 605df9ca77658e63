package budgetprom_test

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/runbudget/runbudget/admission"
	"github.com/runbudget/runbudget/extra/budgetprom"
)

// TestConcurrencyCollector holds two permits of three in running
// endpoints, is refused once full and once cancelled, and checks every
// value against Snapshot.
func TestConcurrencyCollector(t *testing.T) {
	c, err := admission.NewConcurrency(2)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := budgetprom.NewConcurrencyCollector(c, budgetprom.AdmissionOpts{Limiter: "objects"})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(cc)

	entered, release := make(chan struct{}), make(chan struct{})
	ep := c.Middleware(func(ctx context.Context, req any) (any, error) {
		entered <- struct{}{}
		<-release
		return nil, nil
	})
	done := make(chan error, 2)
	for range 2 {
		go func() { _, err := ep(context.Background(), nil); done <- err }()
		<-entered
	}
	if _, err := ep(context.Background(), nil); err == nil {
		t.Fatal("third call admitted past capacity 2")
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ep(cancelled, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call = %v", err)
	}
	if err := c.SetCapacity(3); err != nil {
		t.Fatal(err)
	}

	s := c.Snapshot()
	mfs := families(t, reg)
	for name, want := range map[string]float64{
		"runbudget_admission_concurrency_capacity":       float64(s.Capacity),
		"runbudget_admission_concurrency_in_flight":      float64(s.InFlight),
		"runbudget_admission_concurrency_admitted_total": float64(s.Admitted),
		"runbudget_admission_concurrency_rejected_total": float64(s.Rejected),
		"runbudget_admission_concurrency_canceled_total": float64(s.Canceled),
	} {
		checkGauge(t, mfs, name, want, "limiter", "objects")
	}
	if s.Capacity != 3 || s.InFlight != 2 || s.Admitted != 2 || s.Rejected != 1 || s.Canceled != 1 {
		t.Errorf("Snapshot = %+v", s)
	}
	close(release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	checkGauge(t, families(t, reg), "runbudget_admission_concurrency_in_flight", 0)
}

func TestRateCollector(t *testing.T) {
	r, err := admission.NewRate(admission.RatePolicy{PerSecond: 2.5, Burst: 4})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := budgetprom.NewRateCollector(r, budgetprom.AdmissionOpts{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(rc)
	mfs := families(t, reg)
	checkGauge(t, mfs, "runbudget_admission_rate_per_second", 2.5)
	checkGauge(t, mfs, "runbudget_admission_rate_burst", 4)
	checkGauge(t, mfs, "runbudget_admission_rate_policy_version", 1)

	if err := r.SetPolicy(admission.RatePolicy{PerSecond: 10, Burst: 20}); err != nil {
		t.Fatal(err)
	}
	p, v := r.Policy()
	mfs = families(t, reg)
	checkGauge(t, mfs, "runbudget_admission_rate_per_second", p.PerSecond)
	checkGauge(t, mfs, "runbudget_admission_rate_burst", float64(p.Burst))
	checkGauge(t, mfs, "runbudget_admission_rate_policy_version", float64(v))
	if v != 2 {
		t.Errorf("policy version after one change = %d, want 2", v)
	}
}

func TestAdmissionCollectorsRefuseNil(t *testing.T) {
	if _, err := budgetprom.NewConcurrencyCollector(nil, budgetprom.AdmissionOpts{}); err == nil {
		t.Error("NewConcurrencyCollector(nil) accepted")
	}
	if _, err := budgetprom.NewRateCollector(nil, budgetprom.AdmissionOpts{}); err == nil {
		t.Error("NewRateCollector(nil) accepted")
	}
}
