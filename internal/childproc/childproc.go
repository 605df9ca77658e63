// Package childproc starts child processes that end with the program that
// started them. Most are this same program started again as a helper (the
// demo's worker hosts, the bench's workers): what needs separate OS
// processes (separate heaps, schedulers and Redis pools, hosts that can be
// killed) gets them without a second binary.
//
// A helper's lifeline is its stdin: the parent holds the write end, and the
// helper exits when it reads EOF, which comes when the parent closes it or
// dies, on every OS. On Linux the kernel's parent-death signal backs it up
// (DieWithParent), for a helper that stops reading.
package childproc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sync"
	"time"
)

// Config describes one helper.
type Config struct {
	// Name names the helper in errors, e.g. "host-2".
	Name string
	// Args are the arguments after the program's name: a subcommand and its
	// flags, or none when Env tells the helper what to be.
	Args []string
	// Env is added to this process's environment.
	Env []string
	// Stderr receives the helper's stderr; nil discards it.
	Stderr io.Writer
	// Grace is how long Close, or the end of Start's ctx, gives the helper
	// to exit after asking it to, before killing it. Default 5s: long
	// enough to release what it holds in Redis, short enough that a stuck
	// helper does not hold up its parent.
	Grace time.Duration
	// MaxLine is the longest line the helper may write on stdout; a longer
	// one ends Lines, and the rest of the output is discarded. Default
	// bufio.MaxScanTokenSize (64 KiB).
	MaxLine int
}

// Proc is a running helper: this program, started again with Config.Args
// and Config.Env. Its methods are safe for concurrent use.
type Proc struct {
	name  string
	cmd   *exec.Cmd
	grace time.Duration

	sendMu sync.Mutex
	stdin  io.WriteCloser

	lines chan []byte
	quit  chan struct{} // closed by Close: lines nobody will read are dropped
	done  chan struct{} // closed once the process has been waited for
	err   error         // Wait's result, readable once done is closed

	closeOnce sync.Once
}

// defaultGrace is Config.Grace's default.
const defaultGrace = 5 * time.Second

// Start starts this program (os.Executable) again as a helper. When ctx
// ends before the helper exits, the helper is asked to stop (SIGTERM where
// the OS has it, a kill elsewhere) and killed Grace later. On failure
// nothing is left running.
func Start(ctx context.Context, cfg Config) (*Proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this program to start %s: %w", cfg.Name, err)
	}
	if cfg.Grace <= 0 {
		cfg.Grace = defaultGrace
	}
	if cfg.MaxLine <= 0 {
		cfg.MaxLine = bufio.MaxScanTokenSize
	}
	cmd := exec.CommandContext(ctx, exe, cfg.Args...)
	cmd.Env = append(os.Environ(), cfg.Env...)
	cmd.Cancel = func() error { return interrupt(cmd.Process) }
	cmd.WaitDelay = cfg.Grace
	cmd.Stderr = cfg.Stderr
	DieWithParent(cmd)
	p := &Proc{name: cfg.Name, cmd: cmd, grace: cfg.Grace,
		lines: make(chan []byte, 16), quit: make(chan struct{}), done: make(chan struct{})}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", cfg.Name, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		p.stdin.Close()
		return nil, fmt.Errorf("starting %s: %w", cfg.Name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", cfg.Name, err)
	}
	track(cmd.Process.Pid)
	go p.read(stdout, cfg.MaxLine)
	return p, nil
}

// read passes the helper's stdout on line by line, then reaps the process.
// Reading to the end before Wait is what exec requires of a StdoutPipe.
func (p *Proc) read(stdout io.Reader, maxLine int) {
	defer close(p.done)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 0, min(maxLine, 64<<10)), maxLine)
	for sc.Scan() {
		line := slices.Clone(sc.Bytes())
		select {
		case p.lines <- line:
		case <-p.quit:
		}
	}
	close(p.lines)
	io.Copy(io.Discard, stdout) // after an over-long line: the helper must not block on a full pipe
	p.err = p.cmd.Wait()
	untrack(p.cmd.Process.Pid)
}

// Name is the helper's name from its Config.
func (p *Proc) Name() string { return p.name }

// Pid is the helper's process ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Lines delivers each line the helper writes on stdout, without its
// newline. It is closed when the helper's stdout ends: it exited, or is
// about to. Lines not read by the time Close is called are dropped.
func (p *Proc) Lines() <-chan []byte { return p.lines }

// Send writes line and a newline to the helper's stdin. It fails once the
// helper has exited or Close has been called.
func (p *Proc) Send(line []byte) error {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if _, err := p.stdin.Write(append(slices.Clip(line), '\n')); err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	return nil
}

// Done is closed once the helper has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Wait waits for the helper to exit and returns how it ended, as
// exec.Cmd.Wait does: nil for exit status 0, an *exec.ExitError otherwise.
// Every call returns the same.
func (p *Proc) Wait() error {
	<-p.done
	return p.err
}

// State describes how the helper ended ("exit status 1", "signal:
// killed"), or says it still runs.
func (p *Proc) State() string {
	select {
	case <-p.done:
		return p.cmd.ProcessState.String()
	default:
		return "running"
	}
}

// Close ends the helper: it closes its stdin, the helper's order to exit,
// and kills it if it has not exited Grace later. It returns Wait's result.
// Later calls only wait and return the same.
func (p *Proc) Close() error {
	p.closeOnce.Do(func() {
		close(p.quit)
		p.sendMu.Lock()
		p.stdin.Close()
		p.sendMu.Unlock()
		t := time.NewTimer(p.grace)
		defer t.Stop()
		select {
		case <-p.done:
		case <-t.C:
			// An error means it exited meanwhile; Wait returns either way.
			_ = p.cmd.Process.Kill()
		}
	})
	return p.Wait()
}

// live holds the IDs of helpers started and not yet reaped.
var live = struct {
	sync.Mutex
	pids map[int]bool
}{pids: map[int]bool{}}

func track(pid int) {
	live.Lock()
	live.pids[pid] = true
	live.Unlock()
}

func untrack(pid int) {
	live.Lock()
	delete(live.pids, pid)
	live.Unlock()
}

// Running returns the process IDs of the helpers this program started that
// have not been reaped yet, in ascending order: a test checks it is empty
// after a run, to prove that nothing was left behind.
func Running() []int {
	live.Lock()
	defer live.Unlock()
	out := make([]int, 0, len(live.pids))
	for pid := range live.pids {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

// UntilEOF is the helper's side of the lifeline: the returned context is
// cancelled when stdin (the helper's own, held open by its parent) reaches
// EOF or fails, because the parent closed it or died. The goroutine that
// reads stdin ends then; it cannot be stopped sooner, since a read from a
// pipe does not watch a context, so give it the process's stdin, whose end
// is at the latest the process's end. Read nothing else from stdin.
func UntilEOF(ctx context.Context, stdin io.Reader) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		io.Copy(io.Discard, stdin)
		cancel()
	}()
	return ctx, cancel
}
