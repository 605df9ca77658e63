package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// envWorker carries a worker's spec (JSON). A process started with it set
// is a worker: this same program, re-executed, so that the measurements
// that need separate OS processes (wake handoffs, lanes on several hosts)
// get them without a second binary.
const envWorker = "RUNBUDGET_BENCH_WORKER"

// live holds the IDs of the processes this program started and has not yet
// waited for; the test checks that a run leaves none behind.
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

func livePids() []int {
	live.Lock()
	defer live.Unlock()
	var out []int
	for p := range live.pids {
		out = append(out, p)
	}
	return out
}

// msg is one line between the parent and a worker, either way.
type msg struct {
	Op    string  `json:"op,omitempty"`
	Lanes int     `json:"lanes,omitempty"` // go: how many lanes to run
	Keep  bool    `json:"keep,omitempty"`  // go: keep every lease until release
	Ready bool    `json:"ready,omitempty"`
	T     int64   `json:"t,omitempty"`     // a moment, Unix ns
	N     int64   `json:"n,omitempty"`     // admissions (or calls) so far
	Times []int64 `json:"times,omitempty"` // when each kept lease was granted, as the lane saw it, Unix ns
	Err   string  `json:"err,omitempty"`
}

// replyTimeout bounds how long the parent waits for any one reply: a worker
// that hangs fails the run instead of stalling it.
const replyTimeout = 60 * time.Second

// worker is the parent's handle on one worker process.
type worker struct {
	name    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	replies chan msg
	done    chan struct{} // closed once the process has been waited for
	stderr  *tailBuffer
	once    sync.Once
}

// startWorker starts this program as a worker with spec and waits for it to
// say it is ready.
func startWorker(ctx context.Context, name string, spec workerSpec) (*worker, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this program to start %s: %w", name, err)
	}
	js, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envWorker+"="+string(js))
	// The kernel kills the worker if this process dies; a worker also exits
	// when its stdin closes, which covers the thread caveat of Pdeathsig.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	w := &worker{name: name, cmd: cmd, replies: make(chan msg, 16), done: make(chan struct{}), stderr: &tailBuffer{max: 8 << 10}}
	cmd.Stderr = w.stderr
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	track(cmd.Process.Pid)
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 64<<20)
		for sc.Scan() {
			var m msg
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				m = msg{Err: "unreadable reply: " + sc.Text()}
			}
			w.replies <- m
		}
		io.Copy(io.Discard, stdout)
		cmd.Wait()
		untrack(cmd.Process.Pid)
	}()
	if _, err := w.recv(ctx); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

func (w *worker) send(m msg) error {
	b, _ := json.Marshal(m)
	if _, err := w.stdin.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("%s: %w%s", w.name, err, w.tail())
	}
	return nil
}

// recv waits for the worker's next reply.
func (w *worker) recv(ctx context.Context) (msg, error) {
	t := time.NewTimer(replyTimeout)
	defer t.Stop()
	select {
	case m := <-w.replies:
		if m.Err != "" {
			return m, fmt.Errorf("%s: %s", w.name, m.Err)
		}
		return m, nil
	case <-w.done:
		// Replies sent just before exiting are still in the channel.
		select {
		case m := <-w.replies:
			if m.Err != "" {
				return m, fmt.Errorf("%s: %s", w.name, m.Err)
			}
			return m, nil
		default:
		}
		return msg{}, fmt.Errorf("%s exited: %v%s", w.name, w.cmd.ProcessState, w.tail())
	case <-t.C:
		return msg{}, fmt.Errorf("%s: no reply within %v%s", w.name, replyTimeout, w.tail())
	case <-ctx.Done():
		return msg{}, ctx.Err()
	}
}

func (w *worker) call(ctx context.Context, m msg) (msg, error) {
	if err := w.send(m); err != nil {
		return msg{}, err
	}
	return w.recv(ctx)
}

func (w *worker) tail() string {
	if s := strings.TrimSpace(w.stderr.String()); s != "" {
		return "\n" + w.name + " stderr:\n" + s
	}
	return ""
}

// close ends the worker: its stdin closes, which it takes as the order to
// exit; after five seconds it is killed. Later calls do nothing.
func (w *worker) close() {
	w.once.Do(func() {
		w.stdin.Close()
		select {
		case <-w.done:
		case <-time.After(5 * time.Second):
			w.cmd.Process.Kill()
			<-w.done
		}
	})
}

// crew is a set of workers driven together.
type crew []*worker

// startCrew starts n workers with the same spec, in parallel.
func startCrew(ctx context.Context, n int, name string, spec workerSpec) (crew, error) {
	c := make(crew, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			s := spec
			s.Host = fmt.Sprintf("%s-%d", name, i+1)
			c[i], errs[i] = startWorker(ctx, s.Host, s)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// each sends m to every worker, then collects one reply from each.
func (c crew) each(ctx context.Context, m msg) ([]msg, error) {
	for _, w := range c {
		if err := w.send(m); err != nil {
			return nil, err
		}
	}
	out := make([]msg, len(c))
	var errs []error
	for i, w := range c {
		var err error
		if out[i], err = w.recv(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// count sums the N of replies.
func count(ms []msg) int64 {
	var n int64
	for _, m := range ms {
		n += m.N
	}
	return n
}

func (c crew) close() {
	var wg sync.WaitGroup
	for _, w := range c {
		if w != nil {
			wg.Go(w.close)
		}
	}
	wg.Wait()
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
