package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/luascripts"
)

func TestP9Kind(t *testing.T) {
	for key, want := range map[string]string{
		"rb:{6162}:w:x.1":           "other", // layout 2's waiter records, gone with it
		"rb:{6162}:wexp":            "other",
		"rb:{6162.6430}:q:1.6430":   "waiter",
		"rb:{6162}:lx:17:p.1":       "lease",
		"rb:{6162}:lxz":             "other",
		"rb:{6162}:sexp":            "session",
		"rb:{6162}:sd:p.1":          "session",
		"rb:{6162}:sgone":           "session",
		"rb:{6162}:cfg":             "other",
		"rb:{6162}:d:1.6430":        "other",
		"rb:{6162}:groups":          "other",
		"rb:{6162.6430}:wexpansion": "other", // no prefix of a kind's name is that kind
	} {
		if got := p9Kind(key); got != want {
			t.Errorf("p9Kind(%q) = %q, want %q", key, got, want)
		}
	}
}

// TestP9ScriptNames: the hook names every call of the store's scripts,
// by function (FCALL) and by SHA (EVALSHA, with or without shebang).
func TestP9ScriptNames(t *testing.T) {
	_, _, fns := luascripts.Library()
	for script, fn := range fns {
		if got := p9CallName(redis.NewCmd(context.Background(), "fcall", fn, 1, "k")); got != "script."+script {
			t.Errorf("FCALL %s counted as %q, want script.%s", fn, got, script)
		}
	}
	for _, src := range []string{luascripts.Source("groups"), luascripts.WithoutShebang(luascripts.Source("groups"))} {
		sha := redis.NewScript(src).Hash()
		if got := p9CallName(redis.NewCmd(context.Background(), "evalsha", sha, 1, "k")); got != "script.groups" {
			t.Errorf("EVALSHA of groups counted as %q", got)
		}
	}
	if got := p9CallName(redis.NewCmd(context.Background(), "info", "cpu")); got != "cmd.info" {
		t.Errorf("INFO counted as %q", got)
	}
}

// TestMergeResults: a run with an opt-in section keeps the earlier run's
// other figures and drops its figures of that section.
func TestMergeResults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.json")
	old := &Report{Started: time.Date(2026, 11, 30, 18, 0, 0, 0, time.UTC),
		Figures: []*Figure{{ID: "P1a.x", Note: "exact"}, {ID: "P9.g1.adm_s"}, {ID: "P9.g1.gone"}, {ID: "P3.rate"}},
		Targets: []*Target{{ID: "P1a.d1"}, {ID: "P9"}},
		Notes:   []string{"scale: something", "P9 P9.g1: ran 10 hosts", "P9: no Cluster"}}
	if err := writeJSON(path, old); err != nil {
		t.Fatal(err)
	}
	rep := &Report{Figures: []*Figure{{ID: "P9.g1.adm_s", Note: "new"}, {ID: "P3.rate", Note: "new"}}}
	if err := mergeResults(path, rep, []string{"P9"}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, f := range rep.Figures {
		ids = append(ids, f.ID+"="+f.Note)
	}
	want := "P9.g1.adm_s=new P3.rate=new P1a.x=exact; from the run of 2026-11-30 18:00 UTC"
	if got := strings.Join(ids, " "); got != want {
		t.Errorf("figures after the merge:\n got %s\nwant %s", got, want)
	}
	if len(rep.Targets) != 1 || rep.Targets[0].ID != "P1a.d1" {
		t.Errorf("targets after the merge: %+v", rep.Targets)
	}
	if len(rep.Notes) != 2 || rep.Notes[0] != "scale: something" || !strings.HasPrefix(rep.Notes[1], "kept 2 ") {
		t.Errorf("notes after the merge: %q", rep.Notes)
	}
	// No earlier file: nothing to keep, no error.
	if err := mergeResults(filepath.Join(t.TempDir(), "none.json"), rep, []string{"P9"}); err != nil {
		t.Error(err)
	}
}

// TestP9Tiny runs P9 end to end at a tiny size (4 hosts of 4 lanes, both
// configurations, about 15 s), only when RUNBUDGET_BENCH_P9 is set: the
// section is not part of CI, whose short run of the bench stays short.
func TestP9Tiny(t *testing.T) {
	if os.Getenv("RUNBUDGET_BENCH_P9") == "" {
		t.Skip("set RUNBUDGET_BENCH_P9=1 to run P9 at a tiny size")
	}
	redistest.Require(t)
	saved := p9Flags
	t.Cleanup(func() { p9Flags = saved })
	p9Flags = p9Config{hosts: 4, lanes: 4, procs: 2, pool: 2, domains: 4, inFlight: 1, rate: 20,
		ttl: 1500 * time.Millisecond, measure: 1500 * time.Millisecond, holdMin: 50 * time.Millisecond, holdMax: 150 * time.Millisecond}
	path := filepath.Join(t.TempDir(), "results.json")
	if err := writeJSON(path, &Report{Figures: []*Figure{{ID: "P1a.kept", Rounds: []Round{{V: 1}}}}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := run(ctx, config{only: "P9", redisServer: "auto", jsonPath: path, progress: logWriter{t}}, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	for _, pid := range livePids() {
		t.Errorf("process %d started by the run is still running", pid)
	}
	figs := map[string]*Figure{}
	for _, f := range rep.Figures {
		figs[f.ID] = f
	}
	for _, id := range []string{"P9.g1.adm_s", "P9.g4.adm_s"} {
		if f := figs[id]; f == nil || f.Median <= 0 {
			t.Errorf("%s: %+v", id, f)
		}
	}
	for _, id := range []string{"P9.g1.lane_errors", "P9.g4.lane_errors"} {
		if f := figs[id]; f == nil || f.Median != 0 {
			t.Errorf("%s: %+v", id, f)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	kept := false
	for _, f := range back.Figures {
		kept = kept || f.ID == "P1a.kept"
	}
	if !kept {
		t.Error("the earlier run's figure was not kept in the results file")
	}
}
