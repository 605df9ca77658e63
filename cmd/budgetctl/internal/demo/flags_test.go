package demo

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/runbudget/runbudget/budget"
	"github.com/spf13/pflag"
)

// TestHostArgsRoundTrip: the command line the demo gives a host reads back,
// through the worker's own flags, as the configuration it was made from.
func TestHostArgsRoundTrip(t *testing.T) {
	for _, want := range []WorkerConfig{
		{Provider: "http://127.0.0.1:1234", Budget: "a budget", Host: "host-3", Lanes: 5, Attempts: 4, Progress: 250 * time.Millisecond,
			Limits: budget.Limits{RequestsPerSecond: 12.5, Burst: 3, OpenBodies: 7, MemoryBytes: 3<<20 + 1,
				InFlight: map[budget.OpClass]int{budget.OpList: 1, budget.OpHead: 2, budget.OpGet: 3, budget.OpCopySourceRead: 4}}},
		{Provider: "http://p", Budget: "demo", Host: "h", Lanes: 1, Attempts: 1, NoBudget: true, Progress: time.Second,
			Limits: budget.Limits{RequestsPerSecond: 1, Burst: 1}},
	} {
		want.LeaseTTL = 5 * time.Second // the worker's default, which the demo leaves alone
		var w WorkerFlags
		f := pflag.NewFlagSet("worker", pflag.ContinueOnError)
		w.Register(f)
		if err := f.Parse(hostArgs(want)); err != nil {
			t.Fatal(err)
		}
		got, err := w.Resolve(f)
		if err != nil {
			t.Fatal(err)
		}
		norm, err := want.Limits.Normalize()
		if err != nil {
			t.Fatal(err)
		}
		want.Limits = norm
		if !w.ExitOnStdinEOF {
			t.Error("a host started by the demo does not watch its stdin")
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("hostArgs(%+v)\nreads back as %+v", want, got)
		}
	}
}

func TestDemoFlags(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		rps        float64
		burst      int
		wantErr    string
		wantLimits bool // the error wraps budget.ErrInvalidLimits
	}{
		{args: nil, rps: 180, burst: 20},
		{args: []string{"--quota", "100"}, rps: 90, burst: 10},
		{args: []string{"--quota", "100", "--rps", "50"}, rps: 50, burst: 10},
		{args: []string{"--quota", "100", "--burst", "3"}, rps: 90, burst: 3},
		{args: []string{"--hosts", "0"}, wantErr: "must be positive"},
		{args: []string{"--attempts", "0"}, wantErr: "must be positive"},
		{args: []string{"--refusal-cost", "1.5"}, wantErr: "between 0 and 1"},
		{args: []string{"--objects", "1000000"}, wantErr: "at most 999999"},
		{args: []string{"--memory", "1KiB"}, wantErr: "below the largest object (48.0KiB)"},
		{args: []string{"--bodies", "-1"}, wantErr: "OpenBodies -1 is negative", wantLimits: true},
	} {
		var d Flags
		f := pflag.NewFlagSet("demo", pflag.ContinueOnError)
		d.Register(f)
		if err := f.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg, err := d.Resolve(f)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || errors.Is(err, budget.ErrInvalidLimits) != tc.wantLimits {
				t.Errorf("%v: error %v, want one with %q", tc.args, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case cfg.Limits.RequestsPerSecond != tc.rps || cfg.Limits.Burst != tc.burst:
			t.Errorf("%v: rps %v burst %d, want %v and %d", tc.args, cfg.Limits.RequestsPerSecond, cfg.Limits.Burst, tc.rps, tc.burst)
		}
	}
}

// TestRefusalCostFlag: --refusal-cost 0 makes refusals free, which a
// ProviderConfig says with a negative cost (its zero is the default).
func TestRefusalCostFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		cost float64 // ProviderConfig.RefusalCost after fill
	}{
		{nil, DefaultRefusalCost},
		{[]string{"--refusal-cost", "0"}, 0},
		{[]string{"--refusal-cost", "1"}, 1},
	} {
		var d Flags
		f := pflag.NewFlagSet("demo", pflag.ContinueOnError)
		d.Register(f)
		if err := f.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg, err := d.Resolve(f)
		if err != nil {
			t.Fatal(err)
		}
		if got := newProvider(ProviderConfig{Quota: 1, Objects: 1, Size: 1, RefusalCost: cfg.RefusalCost}).cfg.RefusalCost; got != tc.cost {
			t.Errorf("%v: the provider's refusal cost is %v, want %v", tc.args, got, tc.cost)
		}
		var p ProviderFlags
		f = pflag.NewFlagSet("provider", pflag.ContinueOnError)
		p.Register(f)
		if err := f.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		pc, _, _, err := p.Resolve()
		if err != nil {
			t.Fatal(err)
		}
		if got := newProvider(pc).cfg.RefusalCost; got != tc.cost {
			t.Errorf("provider %v: refusal cost %v, want %v", tc.args, got, tc.cost)
		}
	}
}
