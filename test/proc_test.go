//go:build linux

package test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/redisstore"
)

// Worker processes are this test binary run again with a role. They talk to
// the parent through stdout lines ("HELD <id>", "GRANTED", "LOST", ...) and,
// for held resources, to a referee over TCP.

const envFault = "RUNBUDGET_FAULT"

// faultEnv is what a worker is told through its environment.
type faultEnv struct {
	Role     string        // hold, wait, lanes
	Redis    string        // address
	Name     string        // budget name
	TTL      time.Duration // lease TTL
	Slots    int           // get slots per domain (the limits every host registers)
	Domains  int           // lanes spread over this many domains
	Lanes    int           // lanes (role lanes)
	For      time.Duration // how long lanes run
	Hold     time.Duration // how long a lane holds each lease
	Referee  string        // address, for lanes
	Consumer string
}

func (f faultEnv) encode() string {
	return strings.Join([]string{f.Role, f.Redis, f.Name, f.TTL.String(), strconv.Itoa(f.Slots), strconv.Itoa(f.Domains),
		strconv.Itoa(f.Lanes), f.For.String(), f.Hold.String(), f.Referee, f.Consumer}, "|")
}

func decodeFaultEnv(s string) (faultEnv, error) {
	p := strings.Split(s, "|")
	if len(p) != 11 {
		return faultEnv{}, fmt.Errorf("malformed %s", envFault)
	}
	var f faultEnv
	var err error
	f.Role, f.Redis, f.Name, f.Referee, f.Consumer = p[0], p[1], p[2], p[9], p[10]
	durs := []*time.Duration{&f.TTL, &f.For, &f.Hold}
	for i, s := range []string{p[3], p[7], p[8]} {
		if *durs[i], err = time.ParseDuration(s); err != nil {
			return f, err
		}
	}
	ints := []*int{&f.Slots, &f.Domains, &f.Lanes}
	for i, s := range []string{p[4], p[5], p[6]} {
		if *ints[i], err = strconv.Atoi(s); err != nil {
			return f, err
		}
	}
	return f, nil
}

// laneMemory is what each lane's request reserves, so that the run-global
// memory ceiling (slots x laneMemory per domain, for the whole run) binds
// as tightly as the per-domain ceilings.
const laneMemory = 100

func faultLimits(slots int) budget.Limits {
	return budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: slots}}
}

// laneLimits bound everything a lane holds: its request slot and open body
// per domain, and its buffer across the run.
func laneLimits(slots, domains int) budget.Limits {
	return budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: slots}, OpenBodies: slots,
		MemoryBytes: int64(slots * max(1, domains) * laneMemory)}
}

func faultDomain(i int) budget.Domain { return budget.Domain{Version: 1, ID: "d" + strconv.Itoa(i)} }

// runFaultWorker is the worker side, called from TestMain.
func runFaultWorker(spec string) error {
	f, err := decodeFaultEnv(spec)
	if err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: f.Redis, ContextTimeoutEnabled: true, DialTimeout: time.Second,
		ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer c.Close()
	s, err := redisstore.New(c, f.Name, redisstore.WithLeaseTTL(f.TTL))
	if err != nil {
		return err
	}
	lim := faultLimits(f.Slots)
	if f.Role == "lanes" {
		lim = laneLimits(f.Slots, f.Domains)
	}
	b, err := budget.New(lim, budget.WithStore(s), budget.WithUnavailableGrace(time.Hour))
	if err != nil {
		return err
	}
	defer b.Close()
	out := &syncWriter{w: os.Stdout}
	// The parent closing our stdin means: release and exit.
	stdinClosed := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stdinClosed) }()
	req := budget.Request{Domains: []budget.Domain{faultDomain(0)}, Class: budget.OpGet, Consumer: f.Consumer}

	switch f.Role {
	case "hold":
		l, err := b.Acquire(context.Background(), req)
		if err != nil {
			return err
		}
		out.line("HELD " + l.ID())
		select {
		case <-l.Lost():
			out.line("LOST")
			<-stdinClosed
		case <-stdinClosed:
		}
		l.Release()
		return nil
	case "wait":
		out.line("WAITING")
		l, err := b.Acquire(context.Background(), req)
		if err != nil {
			return err
		}
		out.line("GRANTED " + l.ID())
		<-stdinClosed
		l.Release()
		return nil
	case "lanes":
		return runLanes(b, f, out, stdinClosed)
	}
	return fmt.Errorf("unknown role %q", f.Role)
}

// runLanes runs lanes that acquire, report to the referee, hold, report,
// and release, until f.For has passed or stdin closes. A lane whose lease is
// lost stops at once and starts nothing new: that is what Lost() is for.
func runLanes(b *budget.Budget, f faultEnv, out *syncWriter, stop <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), f.For)
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, f.Lanes)
	for lane := range f.Lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ref, err := dialReferee(f.Referee, fmt.Sprintf("%s/%d", f.Consumer, lane))
			if err != nil {
				errs <- err
				return
			}
			defer ref.Close()
			d := faultDomain(lane % max(1, f.Domains))
			// The three parts a lease holds, each reported to the referee
			// and retired at its own moment: the request when the call
			// returns, the body when drained, the buffer when written.
			parts := []struct {
				res    string
				retire func(*budget.Lease)
			}{
				{d.ID + "/get", (*budget.Lease).CompleteRequest},
				{d.ID + "/body", (*budget.Lease).CloseBody},
				// Memory is each host's own: its ceiling binds per process.
				{"memory/" + f.Consumer, (*budget.Lease).ReleaseMemory},
			}
			for ctx.Err() == nil {
				if err := ref.arrive(); err != nil {
					errs <- err
					return
				}
				l, err := b.Acquire(ctx, budget.Request{Domains: []budget.Domain{d}, Class: budget.OpGet,
					OpensBody: true, MemoryBytes: laneMemory, Consumer: f.Consumer})
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				for _, p := range parts {
					if err := ref.start(p.res); err != nil {
						errs <- err
						return
					}
				}
				for _, p := range parts {
					select {
					case <-l.Lost():
					case <-time.After(f.Hold):
					}
					if err := ref.end(p.res); err != nil {
						errs <- err
						return
					}
					p.retire(l)
				}
				select {
				case <-l.Lost():
					out.line("LOST")
					l.Release()
					return
				default:
				}
				l.Release()
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) line(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintln(s.w, msg)
}

// proc is a running worker process seen from the parent.
type proc struct {
	t     testing.TB
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	exit  chan struct{} // closed when the process has exited
	err   error         // its exit status, once exit is closed
}

// startWorker starts a worker process for f.
func startWorker(t testing.TB, f faultEnv) *proc {
	t.Helper()
	return startWorkerCmd(t, f, os.Args[0], "-test.run=^$")
}

// startWorkerCmd starts a worker for f with the given command line (the
// test binary itself, possibly behind a wrapper such as ip netns exec).
func startWorkerCmd(t testing.TB, f faultEnv, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), envFault+"="+f.encode())
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &proc{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 1024), exit: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
		close(w.lines)
		w.err = cmd.Wait()
		close(w.exit)
	}()
	t.Cleanup(func() {
		w.signal(syscall.SIGCONT)
		w.stdin.Close()
		select {
		case <-w.exit:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-w.exit
		}
	})
	return w
}

// expect waits for a line starting with prefix and returns the rest.
func (w *proc) expect(prefix string, within time.Duration) (string, error) {
	deadline := time.After(within)
	for {
		select {
		case l, ok := <-w.lines:
			if !ok {
				return "", fmt.Errorf("worker exited before %q", prefix)
			}
			if rest, found := strings.CutPrefix(l, prefix); found {
				return strings.TrimSpace(rest), nil
			}
		case <-deadline:
			return "", fmt.Errorf("no %q within %v", prefix, within)
		}
	}
}

func (w *proc) signal(sig syscall.Signal) { w.cmd.Process.Signal(sig) }

// finish asks the worker to release and exit, and waits for it.
func (w *proc) finish() error {
	w.stdin.Close()
	select {
	case <-w.exit:
		return w.err
	case <-time.After(30 * time.Second):
		w.cmd.Process.Kill()
		<-w.exit
		return errors.New("worker did not exit")
	}
}

// kill9 kills the worker without a chance to clean up.
func (w *proc) kill9() {
	w.cmd.Process.Kill()
	<-w.exit
}
