//go:build unix

package redistest

import (
	"os"
	"syscall"
)

// The signals that stop, pause and resume a server.
var sigTerm, sigStop, sigCont os.Signal = syscall.SIGTERM, syscall.SIGSTOP, syscall.SIGCONT

// errPlatform is nil: Unix-like systems have everything the harness needs.
var errPlatform error
