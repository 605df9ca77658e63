package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ctxTimeout is a context for one command against a live server.
func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestStartPingStop(t *testing.T) {
	t.Parallel()
	s := Start(t)
	host, _, err := net.SplitHostPort(s.Addr())
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("Addr() = %q, want 127.0.0.1:port", s.Addr())
	}
	c := s.Client(t)
	if err := c.Ping(ctxTimeout(t, 2*time.Second)).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}

	opt, err := redis.ParseURL(s.URL())
	if err != nil {
		t.Fatalf("ParseURL(%q): %v", s.URL(), err)
	}
	if opt.Addr != s.Addr() || opt.DB != 0 || opt.Password != "" {
		t.Fatalf("ParseURL(%q) = addr %q db %d password %q", s.URL(), opt.Addr, opt.DB, opt.Password)
	}
	if s.Pid() <= 0 {
		t.Fatalf("Pid() = %d", s.Pid())
	}

	s.Stop()
	if !s.current().exited() {
		t.Fatal("process still running after Stop")
	}
	if err := c.Ping(ctxTimeout(t, time.Second)).Err(); err == nil {
		t.Fatal("PING succeeded after Stop")
	}
	// Repeated and mixed calls on a stopped server do nothing.
	s.Stop()
	s.Kill()
	s.Pause()
	s.Resume()
}

func TestWithConfigApplies(t *testing.T) {
	t.Parallel()
	s := Start(t, WithConfig("maxmemory 10mb", "maxmemory-policy noeviction\nappendonly yes"))
	c := s.Client(t)
	ctx := ctxTimeout(t, 2*time.Second)
	want := map[string]string{
		"bind":             "127.0.0.1",
		"protected-mode":   "yes",
		"maxmemory":        "10485760",
		"maxmemory-policy": "noeviction",
		"appendonly":       "yes", // the caller's line overrides the harness default
		"save":             "",
	}
	for k, v := range want {
		got, err := c.ConfigGet(ctx, k).Result()
		if err != nil {
			t.Fatalf("CONFIG GET %s: %v", k, err)
		}
		if got[k] != v {
			t.Errorf("CONFIG GET %s = %q, want %q", k, got[k], v)
		}
	}
	dir, err := c.ConfigGet(ctx, "dir").Result()
	if err != nil || dir["dir"] != s.Dir() {
		t.Errorf("CONFIG GET dir = %q (%v), want %q", dir["dir"], err, s.Dir())
	}
}

// TestStartInDirWithSpaces checks that the generated config quotes its paths.
// It is not parallel: it points TMPDIR, which t.TempDir uses, at a directory
// whose name needs quoting.
func TestStartInDirWithSpaces(t *testing.T) {
	tmp := filepath.Join(t.TempDir(), `with space and "quote"`)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", tmp)
	// A subtest, because t.TempDir reuses the directory a test made first.
	t.Run("server", func(t *testing.T) {
		s := Start(t, WithConfig("appendonly yes"))
		if !strings.HasPrefix(s.Dir(), tmp) {
			t.Fatalf("Dir() = %q, want it under %q", s.Dir(), tmp)
		}
		if err := s.Client(t).Set(ctxTimeout(t, 2*time.Second), "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(s.Dir(), "redis.log")); err != nil {
			t.Fatalf("log not in Dir(): %v", err)
		}
	})
}

func TestRequirePass(t *testing.T) {
	t.Parallel()
	s := Start(t, WithConfig(`requirepass "s3cret"`))
	if err := s.Client(t).Ping(ctxTimeout(t, 2*time.Second)).Err(); err != nil {
		t.Fatalf("PING with the password: %v", err)
	}
	if !strings.Contains(s.URL(), ":s3cret@") {
		t.Fatalf("URL() = %q, want the password in it", s.URL())
	}
	opt, err := redis.ParseURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	viaURL := redis.NewClient(opt)
	defer viaURL.Close()
	if err := viaURL.Ping(ctxTimeout(t, 2*time.Second)).Err(); err != nil {
		t.Fatalf("PING via URL: %v", err)
	}
	anon := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer anon.Close()
	if err := anon.Ping(ctxTimeout(t, 2*time.Second)).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("PING without password: %v, want NOAUTH", err)
	}
}

func TestKillRestartKeepsPortAndData(t *testing.T) {
	t.Parallel()
	s := Start(t, WithConfig("appendonly yes", "appendfsync always"))
	c := s.Client(t)
	if err := c.Set(ctxTimeout(t, 2*time.Second), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	addr, pid := s.Addr(), s.Pid()

	s.Kill()
	if err := c.Ping(ctxTimeout(t, time.Second)).Err(); err == nil {
		t.Fatal("PING succeeded after Kill")
	}

	s.Restart(t)
	if s.Addr() != addr {
		t.Fatalf("Addr after Restart = %s, want %s", s.Addr(), addr)
	}
	if s.Pid() == pid {
		t.Fatalf("Pid after Restart = %d, the old process", pid)
	}
	// The same client reconnects: the address did not change, and the AOF in
	// the same directory brought the key back.
	got, err := c.Get(ctxTimeout(t, 2*time.Second), "k").Result()
	if err != nil || got != "v" {
		t.Fatalf("GET k after Kill+Restart = %q, %v; want v", got, err)
	}

	// Restart of a running server stops it first.
	s.Restart(t)
	if got, err := c.Get(ctxTimeout(t, 2*time.Second), "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET k after Restart = %q, %v; want v", got, err)
	}
}

func isDeadline(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := s.Client(t)
	if err := c.Ping(ctxTimeout(t, 2*time.Second)).Err(); err != nil {
		t.Fatal(err)
	}

	s.Pause()
	start := time.Now()
	err := c.Ping(ctxTimeout(t, 200*time.Millisecond)).Err()
	elapsed := time.Since(start)
	if !isDeadline(err) {
		t.Fatalf("PING on a paused server = %v, want a deadline error", err)
	}
	if elapsed > 2*time.Second {
		t.Fatalf("PING with a 200ms deadline took %v", elapsed)
	}

	s.Resume()
	if err := c.Ping(ctxTimeout(t, 2*time.Second)).Err(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}

	// Stop reaches a paused server: SIGTERM is followed by SIGCONT.
	s.Pause()
	done := make(chan struct{})
	go func() { s.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop on a paused server did not return")
	}
}

func TestStartRetriesLostPortRace(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := busy.Addr().(*net.TCPAddr).Port
	calls := 0
	pick := func(cluster bool) (int, error) {
		calls++
		if calls == 1 {
			return busyPort, nil // another process got there first
		}
		return freePort(cluster)
	}
	s := Start(t, withPortPicker(pick))
	if s.Port() == busyPort || calls != 2 {
		t.Fatalf("port %d after %d picks; want a second, different port", s.Port(), calls)
	}
	if err := s.Client(t).Ping(ctxTimeout(t, 2*time.Second)).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestStartErrorCarriesLogTail(t *testing.T) {
	t.Parallel()
	bin := requireTool(t, "redis-server")
	s, err := newServer(t, bin, config{lines: []string{"maxmemory not-a-size"}})
	if err != nil {
		t.Fatal(err)
	}
	err = s.startFresh(freePort)
	if err == nil {
		t.Fatal("start with a bad config line succeeded")
	}
	for _, want := range []string{"exited before answering PING", "maxmemory not-a-size"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

func TestCheckLines(t *testing.T) {
	t.Parallel()
	tests := []struct {
		lines    []string
		password string
		wantErr  bool
	}{
		{lines: []string{"maxmemory 10mb", "# port 1", ""}},
		{lines: []string{"requirepass s3cret"}, password: "s3cret"},
		{lines: []string{`requirepass "s 3\"c"`}, password: `s 3"c`},
		{lines: []string{"requirepass a", "REQUIREPASS b"}, password: "b"},
		{lines: []string{"port 6379"}, wantErr: true},
		{lines: []string{"BIND 0.0.0.0"}, wantErr: true},
		{lines: []string{"  dir /tmp"}, wantErr: true},
		{lines: []string{"daemonize\tyes"}, wantErr: true},
		{lines: []string{"logfile x"}, wantErr: true},
		{lines: []string{"cluster-port 1"}, wantErr: true},
		{lines: []string{"include /etc/redis/redis.conf"}, wantErr: true},
	}
	for _, tt := range tests {
		pw, err := checkLines(tt.lines)
		if (err != nil) != tt.wantErr || pw != tt.password {
			t.Errorf("checkLines(%q) = %q, %v; want %q, error %v", tt.lines, pw, err, tt.password, tt.wantErr)
		}
	}
}

func TestSlot(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key  string
		want int
	}{
		{"foo", 12182},
		{"bar", 5061},
		{"123456789", 0x31C3}, // the CRC-16/XMODEM check value
		{"{user1000}.following", Slot("user1000")},
		{"foo{bar}{zap}", Slot("bar")},
		{"foo{}{bar}", int(crc16("foo{}{bar}") % clusterSlots)}, // empty tag: whole key
		{"foo{{bar}}zap", Slot("{bar")},
		{"{", int(crc16("{") % clusterSlots)},
	}
	for _, tt := range tests {
		if got := Slot(tt.key); got != tt.want {
			t.Errorf("Slot(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
}

func TestClusterThreeMasters(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := StartCluster(t, 3, 0)
	t.Logf("3-master cluster ok after %v", time.Since(start))
	if n := len(c.Nodes()); n != 3 {
		t.Fatalf("%d nodes, want 3", n)
	}
	cc := c.Client(t)
	ctx := ctxTimeout(t, 5*time.Second)

	owners := map[*Server][]string{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		if err := cc.Set(ctx, k, "v-"+k, 0).Err(); err != nil {
			t.Fatalf("SET %s (slot %d): %v", k, Slot(k), err)
		}
		if got, err := cc.ClusterKeySlot(ctx, k).Result(); err != nil || int(got) != Slot(k) {
			t.Fatalf("CLUSTER KEYSLOT %s = %d, %v; Slot says %d", k, got, err, Slot(k))
		}
		n := c.NodeForKey(t, k)
		owners[n] = append(owners[n], k)
		// The key is on the node NodeForKey names.
		if got, err := n.Client(t).Get(ctx, k).Result(); err != nil || got != "v-"+k {
			t.Fatalf("GET %s on %s = %q, %v", k, n.Addr(), got, err)
		}
	}
	if len(owners) != 3 {
		t.Fatalf("keys landed on %d masters, want 3: %v", len(owners), owners)
	}
	// Keys sharing a hash tag can be used together.
	if err := cc.MSet(ctx, "{t}x", 1, "{t}y", 2).Err(); err != nil {
		t.Fatalf("MSET with one hash tag: %v", err)
	}
}

func TestClusterWithReplicasFailsOver(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := StartCluster(t, 3, 1)
	t.Logf("3-master 1-replica cluster ok after %v", time.Since(start))
	roles := map[string]int{}
	for _, n := range c.Nodes() {
		info, err := n.Client(t).Info(ctxTimeout(t, 2*time.Second), "replication").Result()
		if err != nil {
			t.Fatal(err)
		}
		roles[infoFields(info)["role"]]++
	}
	if roles["master"] != 3 || roles["slave"] != 3 {
		t.Fatalf("roles %v, want 3 masters and 3 replicas", roles)
	}
	cc := c.Client(t)
	if err := cc.Set(ctxTimeout(t, 2*time.Second), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}

	// The harness's short node timeout makes a failover quick enough for
	// tests: kill the key's master and the cluster serves it again.
	old := c.NodeForKey(t, "k")
	old.Kill()
	killed := time.Now()
	ctx := ctxTimeout(t, 15*time.Second)
	for c.NodeForKey(t, "k") == old {
		if ctx.Err() != nil {
			t.Fatal("no failover within 15s")
		}
		time.Sleep(50 * time.Millisecond) // the cluster gives no event to wait on
	}
	t.Logf("failover: a replica took over %v after the master was killed", time.Since(killed))
	// See Cluster.Client: a dead master does not make go-redis reload, and
	// one reload can read the slot map from a node that has not heard of
	// the failover yet, so every failed write asks for another.
	for {
		cc.ReloadState(ctx)
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		err := cc.Set(wctx, "k", "v2", 0).Err()
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("writes fail after the failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("failover: writes succeed %v after the master was killed", time.Since(killed))
	if n := c.NodeForKey(t, "k"); n == old {
		t.Fatalf("key still served by the killed node %s", old.Addr())
	}
}

// TestHelperProcessRequire is not a test: TestRequire runs the test binary
// again with this test selected and a changed environment.
func TestHelperProcessRequire(t *testing.T) {
	if os.Getenv("REDISTEST_HELPER") != "require" {
		t.Skip("runs only as TestRequire's subprocess")
	}
	Require(t)
	t.Log("Require returned")
}

func TestRequire(t *testing.T) {
	t.Parallel()
	if errPlatform != nil {
		t.Skipf("Require skips here whatever PATH holds: %v", errPlatform)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		ci       string // "" leaves CI unset
		wantFail bool
		want     string
	}{
		{ci: "true", wantFail: true, want: "--- FAIL"},
		{ci: "1", wantFail: true, want: "--- FAIL"},
		{ci: "", want: "--- SKIP"},
		{ci: "false", want: "--- SKIP"},
	}
	for _, tt := range tests {
		t.Run("CI="+tt.ci, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(exe, "-test.run=^TestHelperProcessRequire$", "-test.v", "-test.count=1")
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "PATH=") && !strings.HasPrefix(kv, "CI=") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			// An empty directory as PATH: no redis-server to find.
			cmd.Env = append(cmd.Env, "PATH="+t.TempDir(), "REDISTEST_HELPER=require")
			if tt.ci != "" {
				cmd.Env = append(cmd.Env, "CI="+tt.ci)
			}
			out, err := cmd.CombinedOutput()
			var exitErr *exec.ExitError
			switch {
			case tt.wantFail && !(errors.As(err, &exitErr) && exitErr.ExitCode() == 1):
				t.Fatalf("subprocess: %v, want exit status 1\n%s", err, out)
			case !tt.wantFail && err != nil:
				t.Fatalf("subprocess: %v, want success\n%s", err, out)
			}
			for _, want := range []string{tt.want, `"redis-server": executable file not found`} {
				if !strings.Contains(string(out), want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if strings.Contains(string(out), "Require returned") {
				t.Errorf("Require returned without redis-server:\n%s", out)
			}
		})
	}
}

// TestVerdict: a missing tool fails under CI and skips elsewhere; an OS the
// harness cannot run on skips in both cases, and every message says why.
func TestVerdict(t *testing.T) {
	missing := &exec.Error{Name: "redis-server", Err: exec.ErrNotFound}
	unfit := fmt.Errorf("%w: no SIGSTOP here", errUnfitOS)
	for _, tc := range []struct {
		err      error
		ci, fail bool
		want     string
	}{
		{missing, false, false, "with CI=true this is a failure"},
		{missing, true, true, "CI is set, so a missing redis-server fails the test"},
		{unfit, false, false, "no SIGSTOP here; skipping (also under CI"},
		{unfit, true, false, "no SIGSTOP here; skipping (also under CI"},
	} {
		fail, msg := verdict(tc.err, "redis-server", tc.ci)
		if fail != tc.fail || !strings.Contains(msg, tc.want) {
			t.Errorf("verdict(%v, CI=%v) = %v, %q; want %v and a message with %q", tc.err, tc.ci, fail, msg, tc.fail, tc.want)
		}
	}
}
