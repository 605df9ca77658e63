package redistest

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// waitStopped waits, for at most a second, until /proc reports pid stopped
// (state T) or the process has exited. SIGSTOP takes effect when the target
// next runs kernel code, not when kill(2) returns.
func waitStopped(pid int, done <-chan struct{}) {
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return
		default:
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return
		}
		// The state follows the parenthesized command name, which may itself
		// contain ") ".
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'T' {
			return
		}
		time.Sleep(time.Millisecond) // no event announces another process's stop
	}
}
