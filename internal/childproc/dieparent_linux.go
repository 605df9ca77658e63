package childproc

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes the kernel SIGKILL cmd's process when this one dies,
// so that a crashed or killed parent leaves no helper or server behind.
// Call it before cmd.Start; it replaces cmd.SysProcAttr.
//
// Linux ties the signal to the OS thread that started the child, not to
// the process. The Go runtime ends a thread only when a goroutine that
// locked it (runtime.LockOSThread) exits without unlocking, so do not start
// children from such a goroutine. Helpers also watch their stdin, which
// covers that case and every other OS.
func DieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
