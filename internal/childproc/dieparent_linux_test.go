package childproc

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func helperLinux(role string) int {
	if role != "parent" {
		fmt.Fprintln(os.Stderr, "unknown helper role", role)
		return 100
	}
	// Starts a helper that ignores its stdin, says its PID, and waits to be
	// killed: only the parent-death signal can end the grandchild then.
	p, err := Start(context.Background(), Config{Name: "grandchild", Args: []string{"-test.run=^$"},
		Env: []string{envRole + "=stubborn"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	<-p.Lines() // "ready"
	fmt.Printf("pid %d\n", p.Pid())
	time.Sleep(time.Hour)
	return 0
}

// TestDieWithParent: a helper that ignores its stdin still dies when its
// parent is killed, by the kernel's parent-death signal.
func TestDieWithParent(t *testing.T) {
	p := start(t, t.Context(), "parent", 10*time.Millisecond)
	pid := pidLine(t, p)
	// A pidfd reports the exit of a process that is not our child, with no
	// polling; opened before the kill, it cannot name a reused PID.
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open(%d): %v", pid, err)
	}
	defer unix.Close(fd)
	p.Close() // kills the parent, which ignores its stdin too
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int((30 * time.Second).Milliseconds()))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			unix.Kill(pid, unix.SIGKILL)
			t.Fatalf("grandchild %d outlived its killed parent by 30s", pid)
		}
		return
	}
}
