package redistest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHelperProcessSentinelOrphans is not a test: TestNoSentinelOrphans
// runs the test binary again with this test selected, then kills it.
func TestHelperProcessSentinelOrphans(t *testing.T) {
	if os.Getenv("REDISTEST_HELPER") != "sentinel-orphans" {
		t.Skip("runs only as TestNoSentinelOrphans's subprocess")
	}
	sn := StartSentinel(t, 1)
	var pids []string
	for _, s := range append(sn.Nodes(), sn.Sentinels()...) {
		pids = append(pids, strconv.Itoa(s.Pid()))
	}
	fmt.Printf("PIDS %s\n", strings.Join(pids, " "))
	_, _ = io.ReadAll(os.Stdin) // hold the processes until killed
}

// TestNoSentinelOrphans guards against a master, replica or sentinel
// outliving a test binary that was killed, where no cleanup runs.
func TestNoSentinelOrphans(t *testing.T) {
	t.Parallel()
	Require(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHelperProcessSentinelOrphans$", "-test.count=1")
	cmd.Env = append(os.Environ(), "REDISTEST_HELPER=sentinel-orphans")
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
	line, err := bufio.NewReader(stdout).ReadString('\n')
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), "PIDS ")
	if err != nil || !ok {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("subprocess said %q (%v)", line, err)
	}
	var pids []int
	for _, f := range strings.Fields(rest) {
		pid, err := strconv.Atoi(f)
		if err != nil || !alive(pid) {
			t.Fatalf("process %q not running while its test runs", f)
		}
		pids = append(pids, pid)
	}
	if len(pids) != 2+sentinelCount {
		t.Fatalf("subprocess named %d processes, want a master, a replica and %d sentinels", len(pids), sentinelCount)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()

	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("process %d survived its killed test binary", pid)
			}
			time.Sleep(10 * time.Millisecond) // nothing signals another process's death to us
		}
	}
}
