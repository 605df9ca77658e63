//go:build unix

package childproc

import (
	"os"
	"syscall"
)

// interrupt asks p to stop with SIGTERM, which a helper may catch to end
// cleanly (release its leases, report its last progress).
func interrupt(p *os.Process) error { return p.Signal(syscall.SIGTERM) }
