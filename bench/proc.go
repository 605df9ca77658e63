package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/runbudget/runbudget/internal/childproc"
)

// envWorker carries a worker's spec (JSON). A process started with it set
// is a worker: this same program, re-executed, so that the measurements
// that need separate OS processes (wake handoffs, lanes on several hosts)
// get them without a second binary.
const envWorker = "RUNBUDGET_BENCH_WORKER"

// live holds the IDs of the redis-server processes this program started
// and has not yet waited for; workers are listed by childproc.Running. The
// test checks that a run leaves neither behind.
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

// livePids returns every process the run started that has not been waited
// for: redis-servers and workers.
func livePids() []int {
	live.Lock()
	defer live.Unlock()
	out := childproc.Running()
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
	Ops   int64   `json:"ops,omitempty"`   // script operations sent so far (budget lanes)
	CPU   int64   `json:"cpu,omitempty"`   // the worker's own CPU time so far, user and system, ns
	Waits int64   `json:"waits,omitempty"` // the worker's voluntary context switches so far (ownCPU)
	Times []int64 `json:"times,omitempty"` // when each kept lease was granted, as the lane saw it, Unix ns
	Err   string  `json:"err,omitempty"`
	// The scale section's Cluster workers: which budget a "go" runs on,
	// and what a pause reports: admissions per shard group and script
	// calls sent per first key.
	Config int              `json:"config,omitempty"`
	Groups []int64          `json:"groups,omitempty"`
	Calls  map[string]int64 `json:"calls,omitempty"`
}

// replyTimeout bounds how long the parent waits for any one reply: a worker
// that hangs fails the run instead of stalling it.
const replyTimeout = 60 * time.Second

// worker is the parent's handle on one worker process.
type worker struct {
	name   string
	p      *childproc.Proc
	stderr *tailBuffer
}

// startWorker starts this program as a worker with spec and waits for it to
// say it is ready.
func startWorker(ctx context.Context, name string, spec workerSpec) (*worker, error) {
	js, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	w := &worker{name: name, stderr: &tailBuffer{max: 8 << 10}}
	// Not ended by ctx: the parent ends its workers with close, which a
	// worker sees as the end of its stdin, also when the run is interrupted.
	w.p, err = childproc.Start(context.WithoutCancel(ctx), childproc.Config{
		Name:    name,
		Env:     []string{envWorker + "=" + string(js)},
		Stderr:  w.stderr,
		MaxLine: 64 << 20, // a stop reply lists every kept lease's time
	})
	if err != nil {
		return nil, err
	}
	if _, err := w.recv(ctx); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

func (w *worker) send(m msg) error {
	b, _ := json.Marshal(m)
	if err := w.p.Send(b); err != nil {
		return fmt.Errorf("%w%s", err, w.tail())
	}
	return nil
}

// recv waits for the worker's next reply.
func (w *worker) recv(ctx context.Context) (msg, error) {
	return readReply(ctx, w.p, w.name, w.tail, replyTimeout, func(m msg) string { return m.Err })
}

// readReply waits up to timeout for the next line of worker p (called
// name) and decodes it, as JSON, into a T; errOf is the error a reply
// carries. tail gives the worker's stderr, added to errors of its exit and
// of a missing reply.
func readReply[T any](ctx context.Context, p *childproc.Proc, name string, tail func() string,
	timeout time.Duration, errOf func(T) string) (T, error) {
	var zero T
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case line, ok := <-p.Lines():
		if !ok {
			// Its stdout ended: it exited, or is about to.
			select {
			case <-p.Done():
			case <-t.C:
			}
			return zero, fmt.Errorf("%s exited: %s%s", name, p.State(), tail())
		}
		var r T
		if err := json.Unmarshal(line, &r); err != nil {
			return zero, fmt.Errorf("%s: unreadable reply: %s", name, line)
		}
		if e := errOf(r); e != "" {
			return r, fmt.Errorf("%s: %s", name, e)
		}
		return r, nil
	case <-t.C:
		return zero, fmt.Errorf("%s: no reply within %v%s", name, timeout, tail())
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

func (w *worker) tail() string {
	if s := strings.TrimSpace(w.stderr.String()); s != "" {
		return "\n" + w.name + " stderr:\n" + s
	}
	return ""
}

// close ends the worker: its stdin closes, which it takes as the order to
// exit; after five seconds it is killed. Later calls do nothing.
func (w *worker) close() { w.p.Close() }

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

func countOps(ms []msg) int64 {
	var n int64
	for _, m := range ms {
		n += m.Ops
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
