//go:build linux

package test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/dompack"
)

// referee counts what workers say they hold, outside the faulted path. A
// worker reports a start after its grant and an end before its release,
// and waits for the referee's ack each time, so the referee's count is an
// upper bound of the true overlap that never reorders events: any count
// above a ceiling is a real over-admission.
type referee struct {
	ln      net.Listener
	ceiling func(res string) int
	wg      sync.WaitGroup

	mu        sync.Mutex
	held      map[string]int
	peak      map[string]int
	overSince map[string]time.Time
	overFor   time.Duration
	overAt    []time.Time // when each time above a ceiling began
	starts    int
	arrived   map[string]time.Time // lane -> arrival of its current request
	grants    []grant              // one per first start after an arrival
}

// grant is one request as the referee saw it: when its lane said it was
// about to ask, and when it said it had been granted.
type grant struct {
	lane          string
	arrive, start time.Time
}

func startReferee(t testing.TB, ceiling func(res string) int) *referee {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &referee{ln: ln, ceiling: ceiling, held: map[string]int{}, peak: map[string]int{}, overSince: map[string]time.Time{},
		arrived: map[string]time.Time{}}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.wg.Add(1)
			go func() { defer r.wg.Done(); r.serve(c) }()
		}
	}()
	t.Cleanup(r.close)
	return r
}

func (r *referee) addr() string { return r.ln.Addr().String() }

func (r *referee) close() {
	r.ln.Close()
	r.wg.Wait()
}

func (r *referee) serve(c net.Conn) {
	defer c.Close()
	sc := bufio.NewScanner(c)
	lane := ""
	for sc.Scan() {
		op, res, _ := strings.Cut(sc.Text(), " ")
		now := time.Now()
		r.mu.Lock()
		switch op {
		case "L": // the lane names itself
			lane = res
		case "A": // about to call Acquire
			r.arrived[lane] = now
		case "S":
			if at, ok := r.arrived[lane]; ok {
				r.grants = append(r.grants, grant{lane: lane, arrive: at, start: now})
				delete(r.arrived, lane)
			}
			r.starts++
			r.held[res]++
			r.peak[res] = max(r.peak[res], r.held[res])
			if r.held[res] > r.ceiling(res) {
				if _, ok := r.overSince[res]; !ok {
					r.overSince[res] = now
					r.overAt = append(r.overAt, now)
				}
			}
		case "E":
			r.held[res]--
			if since, ok := r.overSince[res]; ok && r.held[res] <= r.ceiling(res) {
				r.overFor += now.Sub(since)
				delete(r.overSince, res)
			}
		}
		r.mu.Unlock()
		if _, err := c.Write([]byte{'k'}); err != nil {
			return
		}
	}
}

// peakOf is the most holders of res the referee saw at once.
func (r *referee) peakOf(res string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.peak[res]
}

// report returns the effective overshoot (largest count above a ceiling),
// how long any resource spent above its ceiling, and the number of starts.
func (r *referee) report() (overshoot int, over time.Duration, starts int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for res, p := range r.peak {
		overshoot = max(overshoot, p-r.ceiling(res))
	}
	return overshoot, r.overFor, r.starts
}

// overStarts returns when each time above a ceiling began.
func (r *referee) overStarts() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.overAt)
}

// inversions counts pairs granted against arrival order, where the earlier
// arrival came more than tol before the later one. Arrivals are reported
// just before Acquire is called, so two within a few milliseconds may reach
// Redis in either order; beyond a tolerance, order must hold.
func (r *referee) inversions(tol time.Duration) int {
	r.mu.Lock()
	gs := slices.Clone(r.grants)
	r.mu.Unlock()
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

// refClient is a lane's connection to the referee.
type refClient struct {
	c net.Conn
	r *bufio.Reader
}

func dialReferee(addr, lane string) (*refClient, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	rc := &refClient{c: c, r: bufio.NewReader(c)}
	if err := rc.send("L", lane); err != nil {
		c.Close()
		return nil, err
	}
	return rc, nil
}

func (rc *refClient) send(op, res string) error {
	if _, err := fmt.Fprintf(rc.c, "%s %s\n", op, res); err != nil {
		return err
	}
	_, err := rc.r.ReadByte()
	return err
}

func (rc *refClient) arrive() error          { return rc.send("A", "") }
func (rc *refClient) start(res string) error { return rc.send("S", res) }
func (rc *refClient) end(res string) error   { return rc.send("E", res) }
func (rc *refClient) Close() error           { return rc.c.Close() }

// sampler reads, on a side connection, the in-flight counts Redis keeps for
// some domains, and records the largest excess over the ceiling it sees:
// the server-side overshoot, which must be 0 while Redis keeps its state.
type sampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	max  int
	n    int
}

func startSampler(t testing.TB, c redis.UniversalClient, name string, domains []budget.Domain, ceiling int) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	keys := make([]string, len(domains))
	for i, d := range domains {
		keys[i] = "rb:{" + hex.EncodeToString([]byte(name)) + "}:d:" + fmt.Sprintf("%d.%s", d.Version, hex.EncodeToString([]byte(d.ID)))
	}
	go func() {
		defer close(s.done)
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			for _, k := range keys {
				if d, err := dompack.Decode(c.Get(ctx, k).Val(), budget.NumClasses); err == nil {
					n := d.InFlight[budget.OpGet.Index()]
					s.mu.Lock()
					s.max = max(s.max, n-ceiling)
					s.n++
					s.mu.Unlock()
				}
			}
			cancel()
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *sampler) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// overshoot stops sampling and returns the largest excess seen (0 or less
// when Redis never counted above the ceiling) and the number of samples.
func (s *sampler) overshoot() (int, int) {
	s.close()
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.max, 0), s.n
}
