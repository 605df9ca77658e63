package redistest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestHelperProcessOrphan is not a test: TestNoOrphanAfterCrash runs the test
// binary again with this test selected, then kills it.
func TestHelperProcessOrphan(t *testing.T) {
	if os.Getenv("REDISTEST_HELPER") != "orphan" {
		t.Skip("runs only as TestNoOrphanAfterCrash's subprocess")
	}
	s := Start(t)
	fmt.Printf("PID %d\n", s.Pid())
	_, _ = io.ReadAll(os.Stdin) // hold the server until killed
}

// TestNoOrphanAfterCrash guards against redis-server outliving a test binary
// that was killed, where no cleanup runs.
func TestNoOrphanAfterCrash(t *testing.T) {
	t.Parallel()
	Require(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHelperProcessOrphan$", "-test.count=1")
	cmd.Env = append(os.Environ(), "REDISTEST_HELPER=orphan")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if _, serr := fmt.Sscanf(line, "PID %d", &pid); err != nil || serr != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("subprocess said %q (%v)", line, err)
	}
	if !alive(pid) {
		t.Fatalf("redis-server %d not running while its test runs", pid)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()

	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("redis-server %d survived its killed test binary", pid)
		}
		time.Sleep(10 * time.Millisecond) // nothing signals another process's death to us
	}
}

// alive reports whether pid is a live process; a zombie (dead, not yet reaped
// by its new parent) counts as dead.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}
