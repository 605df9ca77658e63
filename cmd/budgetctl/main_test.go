package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// The built binary, for the tests that drive it: built on first use, once.
var (
	binDir   string
	binOnce  sync.Once
	binPath  string
	binError error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		// Everything the in-process tests started (workers, providers,
		// budgets, views) must have stopped.
		if err := goleak.Find(
			goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
			goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// budgetctlBin returns the path of budgetctl built from this package.
func budgetctlBin(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binError = os.MkdirTemp("", "budgetctl-test-"); binError != nil {
			return
		}
		binPath = filepath.Join(binDir, "budgetctl")
		goTool, err := exec.LookPath("go")
		if err != nil {
			binError = fmt.Errorf("the tests build budgetctl and need the go command: %v", err)
			return
		}
		if out, err := exec.Command(goTool, "build", "-o", binPath, ".").CombinedOutput(); err != nil {
			binError = fmt.Errorf("building budgetctl: %v\n%s", err, out)
		}
	})
	if binError != nil {
		t.Fatal(binError)
	}
	return binPath
}

// result is what one run of the binary produced.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s--- stderr:\n%s", r.code, r.stdout, r.stderr)
}

// cli runs the built binary with args; env entries are added to a copy of
// the test's environment without REDIS_URL. Stdin is empty (/dev/null).
func cli(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return cliIn(t, env, nil, args...)
}

func cliIn(t *testing.T, env []string, stdin *os.File, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, budgetctlBin(t), args...)
	cmd.Env = append(testEnv(), env...)
	if stdin != nil {
		cmd.Stdin = stdin
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	default:
		t.Fatalf("budgetctl %s: %v", strings.Join(args, " "), err)
	}
	return r
}

func testEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REDIS_URL=") {
			env = append(env, kv)
		}
	}
	return env
}

// want fails the test unless r exited with code and its output (stdout and
// stderr together) holds every one of wants.
func want(t *testing.T, r result, code int, wants ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\n%s", r.code, code, r)
	}
	all := r.stdout + r.stderr
	for _, w := range wants {
		if !strings.Contains(all, w) {
			t.Errorf("output lacks %q\n%s", w, r)
		}
	}
}

// inProcess runs budgetctl's run in this process, for what needs no real
// binary (help, usage errors).
func inProcess(args ...string) result {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(""), &stdout, &stderr)
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

func TestHelpAndUsageErrors(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	for _, tc := range []struct {
		args  []string
		code  int
		wants []string
	}{
		{nil, exitOK, []string{"Exit codes", "Operator commands", "demo"}},
		{[]string{"--help"}, exitOK, []string{"REDIS_URL", "never printed"}},
		{[]string{"limits", "--help"}, exitOK, []string{"copy_source_read=N", "bodies=N", "each host\nbounds its own"}},
		{[]string{"nosuch"}, exitUsage, []string{"unknown command", "--help"}},
		{[]string{"list", "--nosuch"}, exitUsage, []string{"unknown flag"}},
		{[]string{"inspect"}, exitUsage, []string{"inspect takes 1 argument"}},
		{[]string{"inspect", "a", "b"}, exitUsage, []string{"got 2"}},
		{[]string{"list"}, exitUsage, []string{"pass --redis URL or set REDIS_URL"}},
		{[]string{"throttle", "x", "--domain", "nocolon"}, exitUsage, []string{"has no colon"}},
		{[]string{"throttle", "x", "--redis", "redis://127.0.0.1:1/0"}, exitUsage, []string{"needs --domain"}},
		{[]string{"throttle", "x", "--domain", "1:a", "--retry-after", "-1s", "--redis", "redis://127.0.0.1:1/0"}, exitUsage, []string{"negative"}},
		{[]string{"drop-leases", "x", "--redis", "redis://127.0.0.1:1/0"}, exitUsage, []string{"exactly one of --consumer C and --all"}},
		{[]string{"drop-leases", "x", "--all", "--consumer", "c", "--redis", "redis://127.0.0.1:1/0"}, exitUsage, []string{"exactly one"}},
		{[]string{"limits", "x", "--set", "gett=1", "--redis", "redis://127.0.0.1:1/0"}, exitUsage, []string{`unknown key "gett"`}},
		{[]string{"demo", "--hosts", "0"}, exitUsage, []string{"must be positive"}},
		{[]string{"demo", "--memory", "1KiB"}, exitUsage, []string{"below the largest object"}},
		{[]string{"demo", "--bodies", "-1"}, exitUsage, []string{"OpenBodies -1 is negative"}},
		{[]string{"worker"}, exitUsage, []string{"needs --provider"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			want(t, inProcess(tc.args...), tc.code, tc.wants...)
		})
	}
}
