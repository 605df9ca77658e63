package redistest

import (
	"time"

	"golang.org/x/sys/unix"
)

// sStop is SSTOP from <sys/proc.h>: the process is stopped by a signal.
const sStop = 4

// waitStopped waits, for at most a second, until the kernel reports pid
// stopped or the process has exited. SIGSTOP takes effect when the target
// next runs kernel code, not when kill(2) returns.
func waitStopped(pid int, done <-chan struct{}) {
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return
		default:
		}
		kp, err := unix.SysctlKinfoProc("kern.proc.pid", pid)
		if err != nil || kp.Proc.P_stat == sStop {
			return
		}
		time.Sleep(time.Millisecond) // no event announces another process's stop
	}
}
