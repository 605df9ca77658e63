//go:build !unix

package redistest

import (
	"fmt"
	"os"
	"runtime"
)

// noSignal stands for a signal this OS does not have; sending it fails.
type noSignal string

func (s noSignal) String() string { return string(s) }
func (noSignal) Signal()          {}

// The signals that stop, pause and resume a server do not exist here; the
// harness refuses to start a server (errPlatform) before any is sent.
var sigTerm, sigStop, sigCont os.Signal = noSignal("SIGTERM"), noSignal("SIGSTOP"), noSignal("SIGCONT")

// errPlatform says why redis-server tests cannot run on this OS.
var errPlatform = fmt.Errorf("%w: the harness stops, pauses and resumes servers with SIGTERM, SIGSTOP and "+
	"SIGCONT, which %s lacks (run them under WSL or in a Linux container)", errUnfitOS, runtime.GOOS)
