package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runbudget/runbudget/internal/redistest"
)

// TestMain lets the test binary serve as the program's workers: the short
// run re-executes os.Args[0], which here is this binary.
func TestMain(m *testing.M) {
	if isWorker() {
		os.Exit(workerMain())
	}
	os.Exit(m.Run())
}

// logWriter sends the program's progress lines to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestShort runs the whole program in its short mode, so that it cannot
// rot: every section runs, every figure gets its rounds, the JSON file reads
// back, the claims that do not depend on the machine's speed hold, and no
// process it started is left behind. The speed targets are not checked
// here: a short run on a loaded CI machine proves nothing about them.
func TestShort(t *testing.T) {
	redistest.Require(t)
	path := filepath.Join(t.TempDir(), "results.json")
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	rep, err := run(ctx, config{short: true, redisServer: "auto", jsonPath: path, progress: logWriter{t}}, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	t.Logf("short run took %v", time.Since(start))
	t.Log("\n" + out.String())

	// A PID leaves the list only once its process has been waited for, so
	// an empty list means every redis-server and worker has exited.
	for _, pid := range livePids() {
		t.Errorf("process %d started by the run is still running", pid)
	}

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("results JSON: %v", err)
	}
	if len(back.Figures) != len(rep.Figures) || len(back.Targets) != len(rep.Targets) {
		t.Errorf("JSON has %d figures and %d targets, the run %d and %d", len(back.Figures), len(back.Targets), len(rep.Figures), len(rep.Targets))
	}
	for _, f := range back.Figures {
		want := back.Rounds
		if strings.HasPrefix(f.ID, "mem.") {
			want = 1 // exact, measured once
		}
		if len(f.Rounds) != want {
			t.Errorf("figure %s has %d rounds, want %d", f.ID, len(f.Rounds), want)
		}
		if math.IsNaN(f.Median) || math.IsInf(f.Median, 0) {
			t.Errorf("figure %s: median %v", f.ID, f.Median)
		}
	}
	targets := map[string]*Target{}
	for _, tg := range back.Targets {
		targets[tg.ID] = tg
		if tg.Skipped {
			t.Errorf("target %s was not measured", tg.ID)
		}
	}
	for _, id := range []string{"P1a.d1", "P1b.d1", "P1c.d1", "P1a.d4", "P2a", "P2b", "P3", "P3r", "P4a", "P4b", "P4c",
		"P5", "P5b", "P6.g1", "P6.g64", "P7a", "P7b", "P8a", "P8b", "scale", "Scale.cpu_flat", "Scale.cmds_flat", "Scale.local", "Scale.errors"} {
		if targets[id] == nil {
			t.Errorf("target %s is missing", id)
		}
	}
	// Claims about correctness, not speed: they hold on any machine.
	for _, id := range []string{"P1a.d1", "P1a.d4", "P8a", "Scale.local", "Scale.errors"} {
		if tg := targets[id]; tg != nil && !tg.Met {
			t.Errorf("%s (%s): measured %v, want %s %v", id, tg.Claim, tg.Measured, tg.Op, tg.Limit)
		}
	}
}

func TestWindowExcess(t *testing.T) {
	for _, tc := range []struct {
		name        string
		times       []float64
		burst, rate float64
		worst       float64
		over        int
	}{
		{"none", nil, 2, 1, 0, 0},
		{"burst at once", []float64{0, 0}, 2, 1, 0, 0},
		{"one too many at once", []float64{0, 0, 0}, 2, 1, 1, 1},
		{"paced", []float64{0, 0, 1, 2, 3}, 2, 1, 0, 0},
		{"early", []float64{0, 0, 1, 1.5}, 2, 1, 0.5, 1},
		{"late window", []float64{0, 10, 10, 10}, 2, 1, 1, 1},
	} {
		worst, over := windowExcess(tc.times, tc.burst, tc.rate, 1e-9)
		if math.Abs(worst-tc.worst) > 1e-9 || over != tc.over {
			t.Errorf("%s: windowExcess = %v, %d; want %v, %d", tc.name, worst, over, tc.worst, tc.over)
		}
	}
}

func TestQuantileAndMedian(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i))
	}
	if q := quantile(s, 0.5); q != 50 {
		t.Errorf("p50 = %v, want 50", q)
	}
	if q := quantile(s, 0.99); q != 99 {
		t.Errorf("p99 = %v, want 99", q)
	}
	if m := median([]float64{3, 1, 2, 10}); m != 2.5 {
		t.Errorf("median = %v, want 2.5", m)
	}
}

func TestStatsSince(t *testing.T) {
	before := stats{"evalsha": {Calls: 10, Usec: 100}, "info": {Calls: 4}}
	after := stats{"evalsha": {Calls: 14, Usec: 180}, "info": {Calls: 5}, "hset": {Calls: 8}}
	d := after.since(before)
	if got := d.scripts(); got.Calls != 4 || got.Usec != 80 {
		t.Errorf("scripts = %+v, want 4 calls, 80 usec", got)
	}
	if _, ok := d["info"]; ok {
		t.Errorf("the INFO that took the snapshot is counted: %+v", d)
	}
	if d.total() != 12 {
		t.Errorf("total = %d, want 12", d.total())
	}
}

func TestScriptOps(t *testing.T) {
	for _, tc := range []struct {
		args []any
		want int64
	}{
		{[]any{"ping"}, 0},
		{[]any{"evalsha", "abc", 1, "k"}, 1},
		{[]any{"fcall", "rb_x_acquire", 1, "k", "PUBLISH", "1000", ""}, 1},
		{[]any{"fcall", "rb_x_batch", 1, "k", "retire", 2, "a", "b", "acquire", 3, "a", "b", "c"}, 2},
		{[]any{"fcall", "rb_x_batch_oom", 1, "k", "cancel", "1", "a"}, 1},
	} {
		if got := scriptOps(tc.args); got != tc.want {
			t.Errorf("scriptOps(%v) = %d, want %d", tc.args, got, tc.want)
		}
	}
}
