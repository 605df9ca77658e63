package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/redisstore"
)

func TestRenderInspection(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	d := budget.Domain{Version: 2, ID: "evil\x1b[2J\nline"}
	in := redisstore.Inspection{
		Name: "b\x1b]0;title\a", Now: now, Created: now.Add(-90 * time.Second),
		Limits: budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 4}, MemoryBytes: 64 << 20},
		Domains: []redisstore.DomainState{{Domain: d, InFlight: map[budget.OpClass]int{budget.OpGet: 3}, OpenBodies: 1,
			RateFactor: 0.5, Throttled: true, Paused: 1500 * time.Millisecond, Waiters: 2}},
		Leases: []redisstore.LeaseState{{ID: "l1", Consumer: "host\x1b[31m", Domains: []budget.Domain{d}, Class: budget.OpGet,
			Parts: "body+memory", Age: 2500 * time.Millisecond, ExpiresIn: 12 * time.Second}},
		Truncated: true,
	}
	var buf bytes.Buffer
	renderInspection(&buf, in)
	out := buf.String()
	for _, w := range []string{
		`budget "b\x1b]0;title\a" at 2026-01-02T03:04:05Z (Redis time); limits stored 1m30s ago`,
		"rate -;  in flight list - head - get 4 copy_source_read - put - delete -;  open bodies -\n",
		`v2:"evil\x1b[2J\nline"`, "3/4", "1/-", "0.50 throttled", "1.5s",
		`"host\x1b[31m"`, "body+memory", "2.5s", "12.0s",
		"waiters: 0", "raise --max",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	// Memory is each host's: an inspection of Redis shows none.
	for _, w := range []string{"memory", "MEMORY", "MiB"} {
		if strings.Contains(strings.ReplaceAll(out, "body+memory", ""), w) {
			t.Errorf("output shows memory (%q):\n%s", w, out)
		}
	}
	// No raw control character from Redis may reach the terminal.
	if strings.ContainsAny(out, "\x1b\a") || strings.Contains(out, "evil\x1b") {
		t.Errorf("output holds raw control characters:\n%q", out)
	}

	buf.Reset()
	renderInspection(&buf, redisstore.Inspection{Name: "idle", Now: now, Limits: budget.Limits{RequestsPerSecond: 5, Burst: 5}})
	if out := buf.String(); !strings.Contains(out, "domains: none") || !strings.Contains(out, "leases: 0") {
		t.Errorf("idle budget:\n%s", out)
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "-", 500 * time.Microsecond: "<1ms", 1234567 * time.Microsecond: "1.2s", 5 * time.Millisecond: "5ms",
		59 * time.Second: "59.0s", 61500 * time.Millisecond: "1m2s", -2 * time.Second: "-2.0s",
	} {
		if got := formatDuration(d); got != want {
			t.Errorf("formatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestDockerCompose validates docker-compose.yml with `docker-compose
// config -q` (Debian's docker-compose package) or `docker compose config
// -q`. Neither needs a running engine. The issue asks for this check only
// where the tool is available, so a missing tool skips the test even under
// CI=true: the suite must not depend on Docker.
func TestDockerCompose(t *testing.T) {
	file, err := filepath.Abs(filepath.Join("..", "..", "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatal(err)
	}
	var tool []string
	if p, err := exec.LookPath("docker-compose"); err == nil {
		tool = []string{p}
	} else if p, err := exec.LookPath("docker"); err == nil && exec.Command(p, "compose", "version").Run() == nil {
		tool = []string{p, "compose"}
	} else {
		t.Skip("neither docker-compose nor docker compose is installed (Debian: apt-get install docker-compose)")
	}
	for _, profile := range []string{"", "tools"} {
		args := append(tool[1:], "-f", file)
		if profile != "" {
			args = append(args, "--profile", profile)
		}
		cmd := exec.Command(tool[0], append(args, "config", "-q")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
		}
		cmd = exec.Command(tool[0], append(args, "config", "--services")...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(cmd.Args, " "), err)
		}
		// docker-compose 1.x lists profiled services too; v2 does not.
		services := " " + strings.Join(strings.Fields(string(out)), " ") + " "
		for _, s := range []string{"redis", "provider", "worker"} {
			if !strings.Contains(services, " "+s+" ") {
				t.Errorf("profile %q: no service %q in %s", profile, s, services)
			}
		}
		if profile == "tools" && !strings.Contains(services, " inspect ") {
			t.Errorf("profile tools: no inspect service in %s", services)
		}
	}
}
