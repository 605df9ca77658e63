//go:build !unix

package childproc

import "os"

// interrupt kills p: without Unix signals, another process cannot be asked
// to stop, only ended (os.Process.Signal supports only os.Kill here).
func interrupt(p *os.Process) error { return p.Kill() }
