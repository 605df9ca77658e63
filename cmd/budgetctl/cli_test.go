package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
)

// opsFixture is a live budget in a real redis-server: one lease held by
// consumer "host-a" and one waiter, "host-b", queued behind it.
type opsFixture struct {
	srv     *redistest.Server
	env     []string // REDIS_URL for the binary
	name    string
	domain  budget.Domain
	b       *budget.Budget
	granted chan struct{} // closed when host-b's waiter is admitted
}

func newOpsFixture(t *testing.T) *opsFixture {
	t.Helper()
	srv := redistest.Start(t)
	f := &opsFixture{
		srv:  srv,
		env:  []string{"REDIS_URL=" + srv.URL()},
		name: "ops {test}",
		// A colon and a newline: the ID must print quoted, and parse back.
		domain:  budget.Domain{Version: 1, ID: "acct:42\nx"},
		granted: make(chan struct{}),
	}
	f.b = openBudget(t, srv.Client(t), f.name, budget.Limits{
		RequestsPerSecond: 50, InFlight: map[budget.OpClass]int{budget.OpGet: 1}, OpenBodies: 2, MemoryBytes: 1 << 20,
	})
	ctx := context.Background()
	l, err := f.b.Acquire(ctx, budget.Request{Domains: []budget.Domain{f.domain}, Class: budget.OpGet,
		MemoryBytes: 1000, OpensBody: true, Consumer: "host-a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Release)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l, err := f.b.Acquire(wctx, budget.Request{Domains: []budget.Domain{f.domain}, Class: budget.OpGet, Consumer: "host-b"})
		if err != nil {
			return
		}
		close(f.granted)
		<-wctx.Done()
		l.Release()
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "host-b to queue", func() bool {
		u, err := f.b.Usage(ctx)
		return err == nil && u.Waiters == 1
	})
	return f
}

func openBudget(t *testing.T, c redis.UniversalClient, name string, l budget.Limits) *budget.Budget {
	t.Helper()
	s, err := redisstore.New(c, name, redisstore.WithLeaseTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b, err := budget.New(l, budget.WithStore(s))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// waitFor polls cond, which watches another process or Redis, where no
// event tells us of the change.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *opsFixture) inspect(t *testing.T) redisstore.Inspection {
	t.Helper()
	r := cli(t, f.env, "inspect", f.name, "--json")
	want(t, r, exitOK)
	var in redisstore.Inspection
	if err := json.Unmarshal([]byte(r.stdout), &in); err != nil {
		t.Fatalf("inspect --json: %v\n%s", err, r)
	}
	return in
}

// TestOperatorCommands drives the built binary against a real redis-server
// holding a live budget, through every operator command in turn.
func TestOperatorCommands(t *testing.T) {
	f := newOpsFixture(t)
	quotedDomain := `v1:"acct:42\nx"`

	t.Run("list", func(t *testing.T) {
		want(t, cli(t, f.env, "list"), exitOK, "NAME", "GROUPS", "DOMAINS", `"ops {test}"`)
		r := cli(t, f.env, "list", "--json")
		want(t, r, exitOK)
		var list []redisstore.BudgetSummary
		if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
			t.Fatal(err, r)
		}
		if len(list) != 1 || list[0] != (redisstore.BudgetSummary{Name: f.name, Groups: 1, Domains: 1, Leases: 1, Waiters: 1}) {
			t.Errorf("list --json = %+v", list)
		}
	})

	t.Run("inspect", func(t *testing.T) {
		r := cli(t, f.env, "inspect", f.name)
		want(t, r, exitOK, `budget "ops {test}"`, "rate 50/s burst 50", "get 1", "head -", "open bodies 2",
			quotedDomain, "GET", "1/1", "1/2", "leases: 1", `"host-a"`, "request+body",
			"waiters: 1", `"host-b"`)
		if strings.Contains(r.stdout, "acct:42\nx") {
			t.Errorf("inspect printed the domain ID unquoted:\n%s", r)
		}
		in := f.inspect(t)
		if in.Name != f.name || len(in.Domains) != 1 || in.Domains[0].Domain != f.domain || in.Domains[0].InFlight[budget.OpGet] != 1 ||
			len(in.Leases) != 1 || in.Leases[0].Consumer != "host-a" || in.Leases[0].ExpiresIn <= 0 ||
			len(in.Waiters) != 1 || in.Waiters[0].Consumer != "host-b" {
			t.Errorf("inspect --json = %+v", in)
		}
	})

	t.Run("throttle and reset", func(t *testing.T) {
		want(t, cli(t, f.env, "throttle", f.name, "--domain", "1:acct:42\nx", "--retry-after", "30s"), exitOK,
			"throttled "+quotedDomain)
		d := f.inspect(t).Domains[0]
		if d.RateFactor >= 1 || !d.Throttled || d.Paused < 25*time.Second {
			t.Errorf("after throttle: %+v", d)
		}
		if r := cli(t, f.env, "inspect", f.name); !regexp.MustCompile(`[0-9.]+ throttled +(29|30)\.[0-9]s `).MatchString(r.stdout) {
			t.Errorf("inspect does not show the throttle and the pause:\n%s", r)
		}
		// The printed form is accepted back.
		want(t, cli(t, f.env, "reset", f.name, "--domain", quotedDomain), exitOK, "reset the throttle state of "+quotedDomain)
		d = f.inspect(t).Domains[0]
		if d.RateFactor != 1 || d.Throttled || d.Paused != 0 {
			t.Errorf("after reset: %+v", d)
		}
		r := cli(t, f.env, "reset", f.name, "--domain", "7:never-seen", "--json")
		want(t, r, exitOK, `"had_state":false`)
	})

	t.Run("limits", func(t *testing.T) {
		want(t, cli(t, f.env, "limits", f.name), exitOK, "limits of budget", "as --set: rps=50,burst=50,list=0,head=0,get=1")
		want(t, cli(t, f.env, "limits", f.name, "--set", "get=3,memory=2MiB"), exitUsage, "memory is each host's own")
		r := cli(t, f.env, "limits", f.name, "--set", "get=3", "--set", "head=5", "--json")
		want(t, r, exitOK)
		var l budget.Limits
		if err := json.Unmarshal([]byte(r.stdout), &l); err != nil {
			t.Fatal(err, r)
		}
		wantL := budget.Limits{RequestsPerSecond: 50, Burst: 50, OpenBodies: 2,
			InFlight: map[budget.OpClass]int{budget.OpGet: 3, budget.OpHead: 5}}
		if in := f.inspect(t); !in.Limits.Equal(wantL) || !l.Equal(wantL) {
			t.Errorf("after limits --set: printed %+v, stored %+v, want %+v", l, in.Limits, wantL)
		}
		// With get=3 the waiter fits now: limits take effect at once.
		select {
		case <-f.granted:
		case <-time.After(10 * time.Second):
			t.Error("the waiter was not admitted after get was raised to 3")
		}
		want(t, cli(t, f.env, "limits", f.name, "--set", "gett=1"), exitUsage, `unknown key "gett"`)
		want(t, cli(t, f.env, "limits", f.name, "--set", "rps=0,burst=5"), exitUsage, "Burst 5 is set without RequestsPerSecond")
		if in := f.inspect(t); !in.Limits.Equal(wantL) {
			t.Errorf("a refused --set changed the limits: %+v", in.Limits)
		}
	})

	t.Run("libraries", func(t *testing.T) {
		// A library left by another build of runbudget.
		const other = "runbudget_000000000000"
		if err := f.srv.Client(t).FunctionLoad(context.Background(),
			"#!lua name="+other+"\nredis.register_function('rb_000000000000_noop', function() return 1 end)").Err(); err != nil {
			t.Fatal(err)
		}
		want(t, cli(t, f.env, "libraries"), exitOK, "LIBRARY", other, "other", "this one")
		r := cli(t, f.env, "libraries", "--json")
		want(t, r, exitOK)
		var libs []redisstore.Library
		if err := json.Unmarshal([]byte(r.stdout), &libs); err != nil {
			t.Fatal(err, r)
		}
		if len(libs) != 2 || libs[0].Name != other || libs[0].Current || !libs[1].Current || libs[1].Functions < 10 {
			t.Fatalf("libraries --json = %+v", libs)
		}
		want(t, cli(t, f.env, "libraries", "--yes"), exitUsage, "--yes goes with --prune")
		want(t, cli(t, f.env, "libraries", "--prune"), exitDeclined, "pass --yes")
		if n := len(f.srv.Client(t).FunctionList(context.Background(), redis.FunctionListQuery{}).Val()); n != 2 {
			t.Fatalf("libraries after a refused prune: %d, want 2", n)
		}
		want(t, cli(t, f.env, "libraries", "--prune", "--yes"), exitOK, "deleted 1 library: "+other)
		left := f.srv.Client(t).FunctionList(context.Background(), redis.FunctionListQuery{}).Val()
		if len(left) != 1 || left[0].Name == other {
			t.Fatalf("libraries after the prune: %+v", left)
		}
		want(t, cli(t, f.env, "libraries", "--prune", "--yes", "--json"), exitOK, `"deleted":[]`)
		// The budget's hosts still run on the library that stayed.
		if _, err := f.b.Usage(context.Background()); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("drop-leases", func(t *testing.T) {
		// Not a terminal and no --yes: refused, nothing dropped.
		want(t, cli(t, f.env, "drop-leases", f.name, "--consumer", "host-a"), exitDeclined, "pass --yes")
		if n := len(f.inspect(t).Leases); n != 2 {
			t.Fatalf("leases after a refused drop: %d, want 2", n)
		}
		if ptyAvailable(t) {
			want(t, cliTTY(t, f.env, "n\n", "drop-leases", f.name, "--consumer", "host-a"), exitDeclined,
				`Drop the leases of consumer "host-a" in budget "ops {test}" (1 now held)?`, "[y/N]", "not confirmed")
			want(t, cliTTY(t, f.env, "y\n", "drop-leases", f.name, "--consumer", "host-a"), exitOK, "dropped 1 lease(s)")
		} else {
			want(t, cli(t, f.env, "drop-leases", f.name, "--consumer", "host-a", "--yes"), exitOK, "dropped 1 lease(s)")
		}
		leases := f.inspect(t).Leases
		if len(leases) != 1 || leases[0].Consumer != "host-b" {
			t.Fatalf("leases after dropping host-a's: %+v", leases)
		}
		want(t, cli(t, f.env, "drop-leases", f.name, "--consumer", "host-a", "--yes"), exitOK, "nothing to drop")
		want(t, cli(t, f.env, "drop-leases", f.name, "--all", "--yes", "--json"), exitOK, `"dropped":1`)
		if n := len(f.inspect(t).Leases); n != 0 {
			t.Errorf("leases after --all: %d", n)
		}
	})

	t.Run("unknown budget", func(t *testing.T) {
		for _, args := range [][]string{
			{"inspect", "nope"},
			{"inspect", "nope", "--json"},
			{"watch", "nope"},
			{"throttle", "nope", "--domain", "1:a"},
			{"reset", "nope", "--domain", "1:a"},
			{"limits", "nope"},
			{"limits", "nope", "--set", "get=1"},
			{"drop-leases", "nope", "--all", "--yes"},
		} {
			want(t, cli(t, f.env, args...), exitNoBudget, `no such budget: "nope"`)
		}
	})

	t.Run("malformed domain", func(t *testing.T) {
		for arg, msg := range map[string]string{
			"acct-42":   "has no colon",
			"one:acct":  "not an integer",
			"1:":        "empty ID",
			`1:"open`:   "not one quoted string",
			"1:\xffbad": "serialization",
		} {
			for _, cmd := range []string{"throttle", "reset"} {
				want(t, cli(t, f.env, cmd, f.name, "--domain", arg), exitUsage, "invalid argument", msg)
			}
		}
	})
}

func TestWatch(t *testing.T) {
	f := newOpsFixture(t)
	for _, tc := range []struct {
		name  string
		args  []string
		frame func(line string) bool
	}{
		{"tables", nil, func(l string) bool { return strings.HasPrefix(l, `budget "ops {test}" at `) }},
		{"json", []string{"--json"}, func(l string) bool {
			var in redisstore.Inspection
			return json.Unmarshal([]byte(l), &in) == nil && in.Name == f.name && len(in.Leases) == 1
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(budgetctlBin(t), append([]string{"watch", f.name, "--interval", "50ms"}, tc.args...)...)
			cmd.Env = append(testEnv(), f.env...)
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var frames atomic.Int64
			twoFrames := make(chan struct{})
			readDone := make(chan struct{})
			go func() {
				defer close(readDone)
				sc := bufio.NewScanner(stdout)
				sc.Buffer(nil, 1<<20)
				for sc.Scan() {
					if tc.frame(sc.Text()) && frames.Add(1) == 2 {
						close(twoFrames)
					}
				}
			}()
			select {
			case <-twoFrames:
			case <-time.After(20 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("watch drew %d frames in 20s; stderr: %s", frames.Load(), stderr.String())
			}
			if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			<-readDone
			if err := cmd.Wait(); err != nil {
				t.Fatalf("watch after SIGINT: %v; stderr: %s", err, stderr.String())
			}
			if n := frames.Load(); n < 2 {
				t.Errorf("watch drew %d frames, want at least 2", n)
			}
		})
	}
}

// TestConnectionErrors: each way of pointing at the wrong Redis fails with
// its own exit code and a message that names the problem, and no output
// ever holds the password.
func TestConnectionErrors(t *testing.T) {
	const good, bad = "right-Pa55word", "wr0ng-Pa55word"
	srv := redistest.Start(t, redistest.WithConfig("requirepass "+good))
	deadPort := freePort(t)
	addr := srv.Addr()
	for _, tc := range []struct {
		name  string
		env   []string
		args  []string
		code  int
		wants []string
	}{
		{"no url", nil, []string{"list"}, exitUsage, []string{"pass --redis URL or set REDIS_URL"}},
		{"no scheme", nil, []string{"list", "--redis", ":" + bad + "@" + addr}, exitUsage, []string{"bad Redis URL", "no scheme"}},
		{"bad scheme", nil, []string{"list", "--redis", "http://:" + bad + "@" + addr}, exitUsage, []string{`scheme "http"`}},
		{"bad port", nil, []string{"list", "--redis", "redis://:" + bad + "@127.0.0.1:port/0"}, exitUsage, []string{"does not parse"}},
		{"bad db", nil, []string{"list", "--redis", "redis://:" + bad + "@" + addr + "/zero"}, exitUsage, []string{"database number"}},
		{"dead port", nil, []string{"list", "--redis", "redis://:" + bad + "@127.0.0.1:" + strconv.Itoa(deadPort) + "/0"}, exitFailed,
			[]string{"cannot reach Redis at 127.0.0.1:" + strconv.Itoa(deadPort)}},
		{"dead port from env", []string{"REDIS_URL=redis://:" + bad + "@127.0.0.1:" + strconv.Itoa(deadPort) + "/0"}, []string{"inspect", "x"},
			exitFailed, []string{"cannot reach Redis"}},
		{"wrong password", nil, []string{"list", "--redis", "redis://:" + bad + "@" + addr + "/0"}, exitFailed,
			[]string{"Redis at " + addr + " refused the credentials"}},
		{"wrong user and password", nil, []string{"inspect", "x", "--redis", "redis://someone:" + bad + "@" + addr + "/0"}, exitFailed,
			[]string{"refused the credentials"}},
		{"no password", nil, []string{"list", "--redis", "redis://" + addr + "/0"}, exitFailed, []string{"needs a password"}},
		{"right password", nil, []string{"list", "--redis", srv.URL()}, exitOK, []string{"no budgets"}},
		{"right password from env", []string{"REDIS_URL=" + srv.URL()}, []string{"inspect", "x"}, exitNoBudget, []string{"no such budget"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := cli(t, tc.env, tc.args...)
			want(t, r, tc.code, tc.wants...)
			for _, pw := range []string{good, bad} {
				if strings.Contains(r.stdout+r.stderr, pw) {
					t.Errorf("output shows a password:\n%s", r)
				}
			}
		})
	}
}

// freePort returns a loopback port that nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// cliTTY runs the binary with a terminal as its stdin, typing input into it.
func cliTTY(t *testing.T, env []string, input string, args ...string) result {
	t.Helper()
	master, slave := openPTY(t)
	if _, err := master.WriteString(input); err != nil {
		t.Fatal(err)
	}
	r := cliIn(t, env, slave, args...)
	return r
}
