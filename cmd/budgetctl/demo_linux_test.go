package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestDemoHostsDieWithIt: the demo's worker processes end when the demo is
// interrupted (it stops them) and when it is killed outright (the kernel's
// parent-death signal, or their stdin closing, stops them).
func TestDemoHostsDieWithIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
	}{{"SIGINT", syscall.SIGINT}, {"SIGKILL", syscall.SIGKILL}} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(budgetctlBin(t), "demo", "--hosts", "2", "--lanes", "2", "--objects", "20000", "--quota", "50")
			cmd.Env = testEnv()
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			// The first status line means the hosts are up and copying.
			sc := bufio.NewScanner(stdout)
			for sc.Scan() && !strings.Contains(sc.Text(), "copied") {
			}
			go func() {
				for sc.Scan() {
				}
			}()
			hosts := children(t, cmd.Process.Pid)
			if len(hosts) != 2 {
				t.Fatalf("the demo has %d child processes, want 2 hosts", len(hosts))
			}
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			err = cmd.Wait()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("demo after %v: %v", tc.sig, err)
			}
			if tc.sig == syscall.SIGINT && (exit.ExitCode() != exitFailed || !strings.Contains(stderr.String(), "interrupted")) {
				t.Errorf("demo after SIGINT: exit %d, stderr:\n%s", exit.ExitCode(), stderr.String())
			}
			// Nothing reports the death of a process we are not the parent
			// of: poll /proc, with a bound.
			waitFor(t, "the hosts to exit", func() bool {
				for _, pid := range hosts {
					if alive(pid) {
						return false
					}
				}
				return true
			})
		})
	}
}

// children returns the PIDs of pid's child processes, from /proc.
func children(t *testing.T, pid int) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after it.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
			out = append(out, child)
		}
	}
	return out
}

// alive reports whether pid runs; a zombie (exited, not yet reaped by
// whoever inherited it) counts as gone.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}
