package childproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// envRole makes the test binary a helper instead of running tests.
const envRole = "CHILDPROC_TEST_ROLE"

func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role != "" {
		os.Exit(helper(role))
	}
	os.Exit(m.Run())
}

// helper is what the test binary does when started as a helper.
func helper(role string) int {
	switch role {
	case "echo": // answers every line, exits at EOF
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			fmt.Println("echo: " + sc.Text())
		}
		return 0
	case "chatty": // writes more lines than anyone reads, then waits for EOF
		for i := range 1000 {
			fmt.Println("line", i)
		}
		io.Copy(io.Discard, os.Stdin)
		return 0
	case "fail": // says goodbye and exits 2
		fmt.Println("bye")
		return 2
	case "stubborn": // ignores its stdin: only a kill ends it
		fmt.Println("ready")
		time.Sleep(time.Hour)
		return 0
	}
	return helperOS(role)
}

// start starts the test binary as a helper in role, and closes it when the
// test ends.
func start(t *testing.T, ctx context.Context, role string, grace time.Duration) *Proc {
	t.Helper()
	p, err := Start(ctx, Config{Name: role, Args: []string{"-test.run=^$"}, Env: []string{envRole + "=" + role}, Grace: grace})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// next returns the helper's next stdout line, failing the test if none
// comes within a minute (a hung helper must not hang the suite).
func next(t *testing.T, p *Proc) (string, bool) {
	t.Helper()
	select {
	case line, ok := <-p.Lines():
		return string(line), ok
	case <-time.After(time.Minute):
		t.Fatalf("%s: no line within a minute", p.Name())
		return "", false
	}
}

func TestSendAndLines(t *testing.T) {
	p := start(t, t.Context(), "echo", 0)
	for _, s := range []string{"one", "two", ""} {
		if err := p.Send([]byte(s)); err != nil {
			t.Fatal(err)
		}
		if line, ok := next(t, p); !ok || line != "echo: "+s {
			t.Fatalf("reply to %q: %q, %v", s, line, ok)
		}
	}
	if !slices.Contains(Running(), p.Pid()) {
		t.Errorf("Running() = %v lacks the running helper %d", Running(), p.Pid())
	}
	// Closing stdin is the order to exit: the helper ends on its own, with
	// status 0, and is no longer listed.
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v (%s)", err, p.State())
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, ok := next(t, p); ok {
		t.Error("Lines still open after the helper exited")
	}
	if slices.Contains(Running(), p.Pid()) {
		t.Errorf("Running() = %v still lists the reaped helper %d", Running(), p.Pid())
	}
	if err := p.Send([]byte("late")); err == nil {
		t.Error("Send after Close succeeded")
	}
}

func TestExitStatus(t *testing.T) {
	p := start(t, t.Context(), "fail", 0)
	if line, ok := next(t, p); !ok || line != "bye" {
		t.Fatalf("first line %q, %v", line, ok)
	}
	if _, ok := next(t, p); ok {
		t.Fatal("Lines not closed after the helper's last line")
	}
	var exit *exec.ExitError
	if err := p.Wait(); !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("Wait = %v, want exit status 2", err)
	}
	if p.State() != "exit status 2" {
		t.Errorf("State() = %q", p.State())
	}
}

// TestCloseUnreadLines: a helper whose output nobody reads still ends on
// Close; the reader must not stay blocked on a full channel.
func TestCloseUnreadLines(t *testing.T) {
	p := start(t, t.Context(), "chatty", 0)
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close did not return within a minute with unread lines")
	}
}

// TestCloseKillsAHelperThatStaysOn: one that ignores its stdin is killed
// after the grace period.
func TestCloseKillsAHelperThatStaysOn(t *testing.T) {
	p := start(t, t.Context(), "stubborn", 100*time.Millisecond)
	if line, ok := next(t, p); !ok || line != "ready" {
		t.Fatalf("first line %q, %v", line, ok)
	}
	begin := time.Now()
	if err := p.Close(); err == nil {
		t.Fatal("Close of a killed helper returned nil")
	}
	if took := time.Since(begin); took < 100*time.Millisecond {
		t.Errorf("killed after %v, before its grace", took)
	}
	if runtime.GOOS != "windows" && !strings.Contains(p.State(), "killed") {
		t.Errorf("State() = %q, want killed", p.State())
	}
}

func TestStartFailsCleanly(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	before := len(Running())
	if _, err := Start(ctx, Config{Name: "never"}); err == nil {
		t.Fatal("Start with a cancelled context succeeded")
	}
	if n := len(Running()); n != before {
		t.Errorf("a failed Start left %d helpers listed", n-before)
	}
}

func TestUntilEOF(t *testing.T) {
	r, w := io.Pipe()
	ctx, cancel := UntilEOF(t.Context(), r)
	defer cancel()
	if _, err := w.Write([]byte("still here\n")); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("cancelled before EOF")
	}
	w.Close()
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("not cancelled within a minute of EOF")
	}
}

func pidLine(t *testing.T, p *Proc) int {
	t.Helper()
	line, ok := next(t, p)
	pid, err := strconv.Atoi(strings.TrimPrefix(line, "pid "))
	if !ok || err != nil {
		t.Fatalf("%s said %q", p.Name(), line)
	}
	return pid
}
