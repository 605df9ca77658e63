// Package test holds integration tests that run real redis-server processes
// and several OS processes (this test binary, re-executed as worker hosts)
// sharing one budget, checked by an observer outside the budget.
package test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
	"go.uber.org/goleak"
)

// Environment of a worker host.
const (
	envRole     = "RUNBUDGET_TEST_ROLE"
	envRedis    = "RUNBUDGET_TEST_REDIS"
	envObserver = "RUNBUDGET_TEST_OBSERVER"
	envName     = "RUNBUDGET_TEST_BUDGET"
	envLanes    = "RUNBUDGET_TEST_LANES"
	envOps      = "RUNBUDGET_TEST_OPS"
	envHost     = "RUNBUDGET_TEST_HOST"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(envFault); spec != "" {
		if err := runFaultWorker(spec); err != nil {
			fmt.Fprintln(os.Stderr, "fault worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(envRole) == "worker" {
		if err := worker(); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// Every scenario stops what it started: workers, referees, samplers,
	// proxies, clients. A goroutine left over fails the package.
	goleak.VerifyTestMain(m)
}

const (
	multiHosts = 4
	multiLanes = 16
	multiSlots = 8
)

func multiLimits() budget.Limits {
	return budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: multiSlots}}
}

// worker is one host: lanes that acquire, report to the observer, hold a
// moment, report, and release.
func worker() error {
	lanes, _ := strconv.Atoi(os.Getenv(envLanes))
	ops, _ := strconv.Atoi(os.Getenv(envOps))
	host := os.Getenv(envHost)
	c := redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis), ContextTimeoutEnabled: true})
	defer c.Close()
	s, err := redisstore.New(c, os.Getenv(envName), redisstore.WithLeaseTTL(2*time.Second))
	if err != nil {
		return err
	}
	b, err := budget.New(multiLimits(), budget.WithStore(s))
	if err != nil {
		return err
	}
	defer b.Close()
	d := budget.Domain{Version: 1, ID: "shared"}
	var wg sync.WaitGroup
	errs := make(chan error, lanes)
	for lane := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", os.Getenv(envObserver))
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			r := bufio.NewReader(conn)
			tell := func(ev string) error {
				// Wait for the ack: the observer has counted the event before
				// the lane moves on, so its count bounds the real overlap.
				if _, err := fmt.Fprintf(conn, "%s %s/%d\n", ev, host, lane); err != nil {
					return err
				}
				_, err := r.ReadByte()
				return err
			}
			for i := range ops {
				if err := tell("arrive"); err != nil {
					errs <- err
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				l, err := b.Acquire(ctx, budget.Request{Domains: []budget.Domain{d}, Class: budget.OpGet, Consumer: host})
				cancel()
				if err != nil {
					errs <- err
					return
				}
				if err := tell("start"); err != nil {
					errs <- err
					return
				}
				time.Sleep(time.Duration((lane*7+i*3)%4) * time.Millisecond) // the "request"
				if err := tell("end"); err != nil {
					errs <- err
					return
				}
				l.Release()
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// observer counts what the lanes report; it is not the budget's usage.
type observer struct {
	mu       sync.Mutex
	inFlight int
	peak     int
	arrive   map[string]time.Time // lane -> arrival of its current request
	grants   []grant
}

type grant struct {
	lane          string
	arrive, start time.Time
}

func (o *observer) handle(conn net.Conn) {
	defer conn.Close()
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		ev, lane, _ := strings.Cut(sc.Text(), " ")
		now := time.Now()
		o.mu.Lock()
		switch ev {
		case "arrive":
			o.arrive[lane] = now
		case "start":
			o.inFlight++
			o.peak = max(o.peak, o.inFlight)
			o.grants = append(o.grants, grant{lane: lane, arrive: o.arrive[lane], start: now})
		case "end":
			o.inFlight--
		}
		o.mu.Unlock()
		if _, err := conn.Write([]byte{'k'}); err != nil {
			return
		}
	}
}

// inversions counts pairs granted against arrival order, where the earlier
// arrival came more than tol before the later one.
func (o *observer) inversions(tol time.Duration) int {
	gs := slices.Clone(o.grants)
	slices.SortFunc(gs, func(a, b grant) int { return a.arrive.Compare(b.arrive) })
	n := 0
	for i := range gs {
		for j := i + 1; j < len(gs); j++ {
			if gs[j].arrive.Sub(gs[i].arrive) > tol && gs[j].start.Before(gs[i].start) {
				n++
			}
		}
	}
	return n
}

// TestMultiHost: 4 OS processes x 16 lanes on one budget with 8 get slots.
// The observer never sees more than 8 in flight, grants follow arrival
// order beyond a small tolerance, and usage ends at zero.
func TestMultiHost(t *testing.T) {
	srv := redistest.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	obs := &observer{arrive: map[string]time.Time{}}
	var conns sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() { defer conns.Done(); obs.handle(c) }()
		}
	}()

	ops := 15
	if testing.Short() {
		ops = 4
	}
	name := "multihost"
	var procs []*exec.Cmd
	for h := range multiHosts {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envRole+"=worker", envRedis+"="+srv.Addr(), envObserver+"="+ln.Addr().String(),
			envName+"="+name, envLanes+"="+strconv.Itoa(multiLanes), envOps+"="+strconv.Itoa(ops), envHost+"=host"+strconv.Itoa(h))
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, cmd)
	}
	for i, p := range procs {
		if err := p.Wait(); err != nil {
			t.Errorf("host %d: %v", i, err)
		}
	}
	ln.Close()
	conns.Wait()

	obs.mu.Lock()
	defer obs.mu.Unlock()
	if want := multiHosts * multiLanes * ops; len(obs.grants) != want {
		t.Errorf("observer saw %d grants, want %d", len(obs.grants), want)
	}
	if obs.peak > multiSlots {
		t.Errorf("observer saw %d requests in flight, ceiling %d", obs.peak, multiSlots)
	}
	if obs.peak < multiSlots/2 {
		t.Errorf("peak in flight only %d of %d: the slots were not shared", obs.peak, multiSlots)
	}
	// A lane reports its arrival just before calling Acquire, so arrivals a
	// few milliseconds apart can reach Redis in either order; beyond the
	// tolerance, order must hold.
	const tol = 250 * time.Millisecond
	t.Logf("%d grants, peak %d; FIFO inversions: %d within 5ms, %d beyond 50ms, %d beyond %v",
		len(obs.grants), obs.peak, obs.inversions(0)-obs.inversions(5*time.Millisecond),
		obs.inversions(50*time.Millisecond), obs.inversions(tol), tol)
	if n := obs.inversions(tol); n != 0 {
		t.Errorf("%d grants passed a waiter that arrived more than %v earlier", n, tol)
	}

	c := srv.Client(t)
	s, err := redisstore.New(c, name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := budget.New(multiLimits(), budget.WithStore(s))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	u, err := b.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if u.Waiters != 0 || u.MemoryHeld != 0 || len(u.Domains) != 0 {
		t.Errorf("usage after every host finished: %+v, want zero", u)
	}
}
