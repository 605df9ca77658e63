// Command callgrind counts the instructions Redis spends per admission,
// with redis-server run under valgrind's callgrind. Instructions, unlike
// seconds, repeat to a fraction of a percent for the same binary and
// workload whatever else the machine runs, so a change to the scripts can
// be judged by one run on each side even on a busy machine. It is a
// measuring tool for the scripts' authors, not part of `go run ./bench`.
//
//	go run ./bench/callgrind [-n 2000] [-domains 1] [-ahead 8] [-probes] [-sketch] [-census] [-ablate int,sunpack,...]
//
// Fixed sequential workloads, each after a warm-up, with the counters
// zeroed before and dumped after:
//   - contended: per admission, one acquire that queues a new waiter behind
//     ahead others and one retire that hands the slot to the head (what P3
//     and P4 do under contention), then each half apart;
//   - uncontended: per admission, an acquire granted at once and a retire
//     with nobody waiting (P1);
//   - prelude: a retire of a lease nobody holds (what every script does
//     before its own work);
//   - redis_rate: an Allow of go-redis's GCRA limiter (P1c's and P3r's
//     peer);
//   - noop: a script that returns 1, sent by EVALSHA (the P3 floor).
//
// Calls go one at a time through redisstore's Store, so none is batched.
// -probes counts pieces of the prelude and of a queueing acquire run
// alone; -sketch, a contended admission of a leaner layout (sketch.go)
// and one of today's layout with its Lua written flat (lean.go), and one
// of layout 2's records with flat Lua (lean2.go), and layout 3's (lean3.go,
// with a cancel in the middle of a line counted too), and today's scripts
// and layout 3 with a release and the next acquire sent in one call, as
// group commit sends them (batched.go), and that pair fused into one
// straight function on today's helpers (fused.go);
// -ablate, what named helpers of lib.lua cost the contended, batched (a
// release and the next acquire in one call, 1 domain) and uncontended
// workloads, all their calls together (ablate.go); -census,
// how many C calls (redis.call, struct.unpack, tonumber, ...) each
// workload's scripts make, by name (census.go).
package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/lease"
	"github.com/runbudget/runbudget/luascripts"
	"github.com/runbudget/runbudget/redisstore"
)

var verbose bool

func main() {
	n := flag.Int("n", 2000, "admissions (or no-op calls) counted per workload")
	domains := flag.Int("domains", 1, "domains per request")
	ahead := flag.Int("ahead", 8, "waiters queued ahead in the contended workload")
	keep := flag.Bool("keep", false, "keep the callgrind output files (their paths are printed)")
	probes := flag.Bool("probes", false, "also count pieces of the scripts' prelude, run alone")
	flag.BoolVar(&verbose, "v", false, "print the commands each workload ran per operation (commandstats)")
	sk := flag.Bool("sketch", false, "also count a contended admission of a sketched leaner layout (sketch.go), of today's layout with flat Lua (lean.go), of layout 2 with flat Lua (lean2.go), and of layout 3 (lean3.go); and a release with the next acquire in one call: today's batch, layout 3's, and today's fused (batched.go, fused.go)")
	cen := flag.Bool("census", false, "also count the C calls (redis.call, struct.pack, tonumber, ...) the scripts make per operation of each workload, by name (see census.go)")
	abl := flag.String("ablate", "", "comma-separated helpers of lib.lua (top-level local functions) whose cost to the contended, batched and uncontended workloads to count, each by calling it twice (see ablate.go)")
	flag.Parse()
	var helpers []string
	if *abl != "" {
		helpers = strings.Split(*abl, ",")
		_, src, _ := luascripts.Library()
		for _, f := range helpers {
			if _, err := ablated(src, f, 1); err != nil {
				fmt.Fprintln(os.Stderr, "callgrind: -ablate:", err)
				os.Exit(2)
			}
		}
	}
	if err := run(*n, *domains, *ahead, *keep, *probes, *sk, *cen, helpers); err != nil {
		fmt.Fprintln(os.Stderr, "callgrind:", err)
		os.Exit(1)
	}
}

func run(n, domains, ahead int, keep, probes, sk, cen bool, helpers []string) error {
	for _, tool := range []string{"valgrind", "callgrind_control", "redis-server"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is needed: %w", tool, err)
		}
	}
	dir, err := os.MkdirTemp("", "rb-callgrind-")
	if err != nil {
		return err
	}
	if !keep {
		defer os.RemoveAll(dir)
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	out := filepath.Join(dir, "callgrind.out")
	// Counting starts zeroed by callgrind_control; dumps go to out.<n>.
	cmd := exec.Command("valgrind", "--tool=callgrind", "--callgrind-out-file="+out,
		"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--hz", "1",
		"--dir", dir)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}()
	ctx := context.Background()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	// Under valgrind the server takes seconds to listen: wait for the port
	// before a client exists, so that its pool does not log failed dials.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if conn, err := net.Dial("tcp", addr); err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			return errors.New("redis-server under valgrind did not listen within a minute")
		}
	}
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 2, ContextTimeoutEnabled: true,
		ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		return err
	}
	var stores []*redisstore.Store
	defer func() {
		for _, s := range stores {
			s.Close()
		}
	}()
	newStore := func(name string) (*redisstore.Store, error) {
		s, err := redisstore.New(c, name, redisstore.WithLeaseTTL(time.Hour))
		if err != nil {
			return nil, err
		}
		stores = append(stores, s)
		return s, s.Register(ctx, budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}, false)
	}
	counted := func(name string, warm int, op func() error) (float64, error) {
		for range warm {
			if err := op(); err != nil {
				return 0, err
			}
		}
		before, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return 0, err
		}
		if err := exec.Command("callgrind_control", "-z", strconv.Itoa(pid)).Run(); err != nil {
			return 0, fmt.Errorf("zeroing counters: %w", err)
		}
		for range n {
			if err := op(); err != nil {
				return 0, err
			}
		}
		if err := exec.Command("callgrind_control", "-d", name, strconv.Itoa(pid)).Run(); err != nil {
			return 0, fmt.Errorf("dumping counters: %w", err)
		}
		after, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return 0, err
		}
		if verbose {
			fmt.Printf("  %s: commands per op %s\n", name, callsPer(before, after, n))
		}
		ir, path, err := lastDump(dir)
		if err != nil {
			return 0, err
		}
		if keep {
			fmt.Printf("  %s: %s\n", name, path)
		}
		return float64(ir) / float64(n), nil
	}

	cs, err := newStore("cg-contended")
	if err != nil {
		return err
	}
	l, err := contendedLine(ctx, cs, domains, ahead)
	if err != nil {
		return err
	}
	ic, err := counted("contended", 200, l.admission)
	if err != nil {
		return fmt.Errorf("contended: %w", err)
	}
	// Its two halves apart: n waiters join the line, then n handoffs
	// shorten it again.
	iq, err := counted("queue", 0, l.queue)
	if err != nil {
		return fmt.Errorf("queue: %w", err)
	}
	ih, err := counted("handoff", 0, l.handoff)
	if err != nil {
		return fmt.Errorf("handoff: %w", err)
	}
	us, err := newStore("cg-uncontended")
	if err != nil {
		return err
	}
	uncontended, err := uncontendedOp(ctx, us, domains)
	if err != nil {
		return err
	}
	iu, err := counted("uncontended", 200, uncontended)
	if err != nil {
		return fmt.Errorf("uncontended: %w", err)
	}
	// A retire of a lease nobody holds: every script's prelude (the
	// arguments, the clock, the limits, reclaim's check) and one HGET.
	ps, err := newStore("cg-prelude")
	if err != nil {
		return err
	}
	ip, err := counted("prelude", 200, func() error { return ps.Retire(ctx, "nobody", lease.All) })
	if err != nil {
		return fmt.Errorf("prelude: %w", err)
	}
	if probes {
		if err := probe(ctx, c, counted); err != nil {
			return fmt.Errorf("probes: %w", err)
		}
	}
	var isk, iskb, ilean, ilean2, il3, il3z, il3jc, il3j, ibt, il3b, ifu float64
	if sk {
		if isk, err = sketch(ctx, c, ahead, false, counted); err != nil {
			return fmt.Errorf("sketch: %w", err)
		}
		if iskb, err = sketch(ctx, c, ahead, true, counted); err != nil {
			return fmt.Errorf("sketch: %w", err)
		}
		if ilean, err = leanAdmission(ctx, c, ahead, counted); err != nil {
			return fmt.Errorf("sketch: today's commands, lean Lua: %w", err)
		}
		if ilean2, err = lean2Admission(ctx, c, ahead, counted); err != nil {
			return fmt.Errorf("sketch: layout 2's commands, lean Lua: %w", err)
		}
		if il3, err = lean3Admission(ctx, c, ahead, false, counted); err != nil {
			return fmt.Errorf("sketch: layout 3, lean Lua: %w", err)
		}
		if il3z, err = lean3Admission(ctx, c, ahead, true, counted); err != nil {
			return fmt.Errorf("sketch: layout 3 without its session cache, lean Lua: %w", err)
		}
		if il3jc, il3j, err = lean3Cancel(ctx, c, 64, counted); err != nil {
			return fmt.Errorf("sketch: layout 3's cancel, lean Lua: %w", err)
		}
		bs, err := newStore("cg-batched")
		if err != nil {
			return err
		}
		if ibt, err = todayBatched(ctx, c, bs, ahead, counted); err != nil {
			return fmt.Errorf("sketch: today's scripts batched: %w", err)
		}
		if il3b, err = lean3Batched(ctx, c, ahead, counted); err != nil {
			return fmt.Errorf("sketch: layout 3 batched: %w", err)
		}
		fs, err := newStore("cg-fused")
		if err != nil {
			return err
		}
		fused, err := fusedOp(ctx, c, fs, ahead)
		if err != nil {
			return fmt.Errorf("sketch: the fused pair: %w", err)
		}
		if ifu, err = counted("fused", 200, fused); err != nil {
			return fmt.Errorf("sketch: the fused pair: %w", err)
		}
	}
	// What P3 runs under load: a release and the next acquire as one
	// batch, on a line of its own.
	var batched func() error
	if len(helpers) > 0 || cen {
		bs, err := newStore("cg-batched-op")
		if err != nil {
			return err
		}
		if batched, err = batchedOp(ctx, c, bs, ahead); err != nil {
			return fmt.Errorf("batched: %w", err)
		}
	}
	if len(helpers) > 0 {
		ws := []workload{{"contended", l.admission}, {"batched", batched}, {"uncontended", uncontended}}
		if err := ablate(ctx, c, helpers, ws, counted); err != nil {
			return fmt.Errorf("ablation: %w", err)
		}
	}
	if cen {
		ws := []workload{{"contended", l.admission}, {"batched", batched}, {"queue", l.queue}, {"handoff", l.handoff}, {"uncontended", uncontended},
			{"prelude", func() error { return ps.Retire(ctx, "nobody", lease.All) }}}
		if err := census(ctx, c, n, ws); err != nil {
			return fmt.Errorf("census: %w", err)
		}
	}
	// What P3 sends under load, counted in every run: a release and the
	// next acquire in one batch, and two such pairs in one.
	pairStore, err := newStore("cg-pair")
	if err != nil {
		return err
	}
	pair, err := batchedPairs(ctx, c, pairStore, ahead, 1)
	if err != nil {
		return fmt.Errorf("batched pair: %w", err)
	}
	ib1, err := counted("pair", 200, pair)
	if err != nil {
		return fmt.Errorf("batched pair: %w", err)
	}
	pairs2Store, err := newStore("cg-pairs2")
	if err != nil {
		return err
	}
	pairs2, err := batchedPairs(ctx, c, pairs2Store, ahead, 2)
	if err != nil {
		return fmt.Errorf("two batched pairs: %w", err)
	}
	ib2, err := counted("pairs2", 100, pairs2)
	if err != nil {
		return fmt.Errorf("two batched pairs: %w", err)
	}
	// P3r's and P1c's peer: a redis_rate Allow (GCRA), over 100 keys.
	gcra := redis_rate.NewLimiter(c)
	var key int
	ir, err := counted("redis_rate", 200, func() error {
		key = (key + 1) % 100
		_, err := gcra.Allow(ctx, "cg-gcra:"+strconv.Itoa(key), redis_rate.PerSecond(1_000_000))
		return err
	})
	if err != nil {
		return fmt.Errorf("redis_rate: %w", err)
	}
	noop := redis.NewScript("return 1")
	if err := noop.Load(ctx, c).Err(); err != nil {
		return err
	}
	in, err := counted("noop", 200, func() error { return noop.EvalSha(ctx, c, nil).Err() })
	if err != nil {
		return fmt.Errorf("noop: %w", err)
	}
	fmt.Printf("Redis instructions, %d domain(s), %d counted each:\n", domains, n)
	fmt.Printf("  contended admission (queued acquire + handing-off retire, %d ahead): %.0f (%.2fx no-op)\n", ahead, ic, ic/in)
	fmt.Printf("    an acquire that queues: %.0f; a retire that hands off: %.0f\n", iq, ih)
	fmt.Printf("  uncontended Acquire+Release: %.0f (%.2fx no-op)\n", iu, iu/in)
	fmt.Printf("  retire of an unknown lease (the prelude): %.0f (%.2fx no-op)\n", ip, ip/in)
	fmt.Printf("  redis_rate Allow: %.0f (%.2fx no-op); a contended admission is %.2f of them, an uncontended one %.2f\n",
		ir, ir/in, ic/ir, iu/ir)
	fmt.Printf("  no-op EVALSHA: %.0f\n", in)
	fmt.Printf("  batched, as group commit sends them under P3's load: a release and the next acquire in one call %.0f (%.2f Allows); two such pairs in one call %.0f per pair (%.2f Allows)\n",
		ib1, ib1/ir, ib2/2, ib2/2/ir)
	if sk {
		printSketch(isk, iskb, ilean, ilean2, ic, ir)
		printLean3(il3, il3z, il3jc, il3j, ic, ir)
		fmt.Printf("  a release and the next acquire in one call, as group commit sends them: today's scripts %.0f (%.2f Allows), layout 3 %.0f (%.2f Allows, %.0f%% of today's)\n",
			ibt, ibt/ir, il3b, il3b/ir, 100*il3b/ibt)
		fmt.Printf("    the same pair fused into one straight function on today's helpers (fused.go): %.0f (%.2f Allows, %.0f%% of today's)\n",
			ifu, ifu/ir, 100*ifu/ibt)
	}
	return nil
}

func request(domains int) (budget.Request, error) {
	req := budget.Request{Class: budget.OpGet, Consumer: "callgrind"}
	for i := range domains {
		req.Domains = append(req.Domains, budget.Domain{Version: 1, ID: "d" + strconv.Itoa(i)})
	}
	return req.Normalize()
}

// line is a holder of the one slot and the waiters queued behind it.
type line struct {
	ctx     context.Context
	s       *redisstore.Store
	req     budget.Request
	holder  string
	waiters []string
}

func (l *line) try(want budget.Outcome) (string, error) {
	id := uuid.NewString()
	a, err := l.s.TryAcquire(l.ctx, id, l.req)
	if err == nil && a.Outcome != want {
		err = fmt.Errorf("acquire: outcome %v, want %v", a.Outcome, want)
	}
	return id, err
}

// queue adds a waiter at the back of the line: an acquire that queues.
func (l *line) queue() error {
	id, err := l.try(budget.Queued)
	l.waiters = append(l.waiters, id)
	return err
}

// handoff retires the holder's lease, which the retire hands to the head.
func (l *line) handoff() error {
	if len(l.waiters) == 0 {
		return errors.New("nobody in line to hand the slot to")
	}
	if err := l.s.Retire(l.ctx, l.holder, lease.All); err != nil {
		return err
	}
	l.holder, l.waiters = l.waiters[0], l.waiters[1:]
	return nil
}

// admission is one contended admission: a waiter queues at the back and
// the holder's slot goes to the head.
func (l *line) admission() error {
	if err := l.queue(); err != nil {
		return err
	}
	return l.handoff()
}

// contendedLine returns a line of ahead waiters behind a holder on s.
func contendedLine(ctx context.Context, s *redisstore.Store, domains, ahead int) (*line, error) {
	req, err := request(domains)
	if err != nil {
		return nil, err
	}
	l := &line{ctx: ctx, s: s, req: req}
	if l.holder, err = l.try(budget.Granted); err != nil {
		return nil, err
	}
	for range ahead {
		if err := l.queue(); err != nil {
			return nil, err
		}
	}
	return l, nil
}

func uncontendedOp(ctx context.Context, s *redisstore.Store, domains int) (func() error, error) {
	req, err := request(domains)
	if err != nil {
		return nil, err
	}
	return func() error {
		id := uuid.NewString()
		a, err := s.TryAcquire(ctx, id, req)
		if err != nil {
			return err
		}
		if a.Outcome != budget.Granted {
			return fmt.Errorf("uncontended acquire: outcome %v", a.Outcome)
		}
		return s.Retire(ctx, id, lease.All)
	}, nil
}

// lastDump returns the total instructions (the "summary:" or "totals:"
// line) of the latest dump in dir (callgrind numbers them out.1, out.2,
// ...), and its path.
func lastDump(dir string) (int64, string, error) {
	matches, _ := filepath.Glob(filepath.Join(dir, "callgrind.out.*"))
	latest, newest := 0, ""
	for _, m := range matches {
		if k, err := strconv.Atoi(m[strings.LastIndex(m, ".")+1:]); err == nil && k > latest {
			latest, newest = k, m
		}
	}
	if newest == "" {
		return 0, "", errors.New("callgrind wrote no dump")
	}
	f, err := os.Open(newest)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, p := range []string{"summary:", "totals:"} {
			if v, ok := strings.CutPrefix(line, p); ok {
				fields := strings.Fields(v)
				if len(fields) == 0 {
					return 0, "", fmt.Errorf("%s: an empty %s line", newest, p)
				}
				ir, err := strconv.ParseInt(fields[0], 10, 64)
				return ir, newest, err
			}
		}
	}
	return 0, "", fmt.Errorf("%s holds no totals line", newest)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// probeFns are pieces of what every script does, registered beside a copy
// of the library so that they run with its helpers and caches; cfg-prelude
// is the budget probed, registered by the prelude workload.
var probeFns = []struct{ name, body string }{
	{"empty", "return 1"},
	{"begin", "begin(KEYS, ARGV) return 1"},
	{"clock", "begin(KEYS, ARGV) clock() return 1"},
	{"prelude", "begin(KEYS, ARGV) local now = clock() touch_cfg(now) reclaim(now) return done({R_OK})"},
	{"hmget9", "redis.call('HMGET', KEYS[1], 'json', 'rid', 'qu', 'rx', 'rc', 'lt', 'co', 'tl', 'ce') return 1"},
	{"tonumber7", "local x = 0 for i = 1, 7 do x = x + tonumber(ARGV[4]) end return 1"},
	{"format7", "local x for i = 1, 7 do x = I(1900000000123456 + i) end return 1"},
	{"get", "redis.call('GET', KEYS[1] .. 'x') return 1"},
	{"hget", "redis.call('HGET', KEYS[1], 'rid') return 1"},
	{"hmget3", "redis.call('HMGET', KEYS[1], 'json', 'rid', 'qu') return 1"},
	{"time", "redis.call('TIME') return 1"},
	{"tables4", "local a, b, c, d = {}, {}, {}, {} return 1"},
	{"sub2", "local a, b = string.sub(KEYS[1], -4), string.sub(KEYS[1], 1, -4) return 1"},
	{"limits", "begin(KEYS, ARGV) lims() return 1"},
	{"zadd", "redis.call('ZADD', KEYS[1] .. 'z', '1900000000123456', 'member-0123456789') return 1"},
	{"pexpireat", "redis.call('PEXPIREAT', KEYS[1], '4102444800000') return 1"},
	{"setpxat", "redis.call('SET', KEYS[1] .. 's', 'value-0123456789-0123456789-0123456789', 'PXAT', '4102444800000') return 1"},
	{"hincrby", "redis.call('HINCRBY', KEYS[1], 'seq', '1') return 1"},
	{"zrange1", "redis.call('ZRANGE', KEYS[1] .. 'z', '0', '0', 'WITHSCORES') return 1"},
	{"publish", "redis.call('PUBLISH', KEYS[1] .. 'chan', 'granted 0123456789 0123456789 12') return 1"},
	{"pack22", "local d = {f = {0, 0, 0, 0, 0, 0}} dzero(d) local s = spack(d) return 1"},
	{"unpack22", "local d = {f = {0, 0, 0, 0, 0, 0}} dzero(d) local s = spack(d) for i = 1, 10 do sunpack('e', 'k', 'q', s) end return 1"},
	{"eparse10", "STRUCT = rawget(_G, 'struct') local e = epack('0b8a5d6c-3e1f-4a7b-9c2d-5e6f7a8b9c0d', '0123456789abcdef-0123-sess.1', '0123456789abcdef-0123-sess', 0, 0, 30000000, 1900000000123456, '', 'consumer') for i = 1, 10 do eparse(e, 1) end return 1"},
	{"idcheck10", "for i = 1, 10 do id_arg('0b8a5d6c-3e1f-4a7b-9c2d-5e6f7a8b9c0d', 'waiter id') end return 1"},
	{"dzero", "local d = {f = {0, 0, 0, 0, 0, 0}} dzero(d) return 1"},
	{"leaseunpack10", "for i = 1, 10 do lease_unpack('10 2 1900000000123456 0123456789abcdef-0123-sess 1.61 consumer') end return 1"},
	{"epack10", "STRUCT = rawget(_G, 'struct') for i = 1, 10 do epack('0b8a5d6c-3e1f-4a7b-9c2d-5e6f7a8b9c0d', '0123456789abcdef-0123-sess.1', '0123456789abcdef-0123-sess', 0, 0, 30000000, 1900000000123456, '', 'consumer') end return 1"},
	{"ipairs100", "local t = {1} for i = 1, 100 do for _, x in ipairs(t) do end end return 1"},
	{"numfor100", "local t = {1} for i = 1, 100 do for j = 1, #t do local x = t[j] end end return 1"},
	{"gmatch100", "local s = '1.61' for i = 1, 100 do for e in string.gmatch(s, '[^,]+') do end end return 1"},
	{"find100", "local s = '1.61' for i = 1, 100 do if not string.find(s, ',', 1, true) then local e = s end end return 1"},
	{"floor100", "local x for i = 1, 100 do x = math.floor(i / 3) end return 1"},
	{"mod100", "local x for i = 1, 100 do x = i / 3 x = x - x % 1 end return 1"},
	{"cfunc100", "local x = 'abc' local b for i = 1, 100 do b = string.byte(x, 1) end return 1"},
	{"luaop1000", "local x = 0 for i = 1, 1000 do x = x + i end return 1"},
	{"tget100", "local t = {a = 1} local x for i = 1, 100 do x = t.a end return 1"},
	{"upcall100", "local x for i = 1, 100 do x = I end return 1"},
	{"wbinpack10", "local s for i = 1, 10 do s = struct.pack('>Bi8BBi8i8I4c0I4c0I4c0I4c0', 1, 12, 0, 0, 1900000000123456, 30000000, 21, '0123456789abcdef-chan', 26, '0123456789abcdef-0123-sess', 4, '1.61', 8, 'consumer') end return 1"},
	{"wbinunpack10", "local s = struct.pack('>Bi8BBi8i8I4c0I4c0I4c0I4c0', 1, 12, 0, 0, 1900000000123456, 30000000, 21, '0123456789abcdef-chan', 26, '0123456789abcdef-0123-sess', 4, '1.61', 8, 'consumer') for i = 1, 10 do local v, t, c, b, at, ttl, ch, sn, ds, cs = struct.unpack('>Bi8BBi8i8I4c0I4c0I4c0I4c0', s) local w = {t = t, c = c, b = b, at = at, ttl = ttl, ch = ch, sn = sn, ds = ds, cs = cs} end return 1"},
	{"packBEi8", "local s = struct.pack('>i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8', 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,1900000000123456) return 1"},
	{"packLEi8", "local s = struct.pack('<i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8', 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,1900000000123456) return 1"},
	{"packBEd", "local s = struct.pack('>dddddddddddddddddddddd', 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,1900000000123456) return 1"},
	{"packLEd", "local s = struct.pack('<dddddddddddddddddddddd', 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,1900000000123456) return 1"},
	{"msgpack22", "local s = cmsgpack.pack({1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,1900000000123456}) return 1"},
	{"concat22", "local s = table.concat({1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,1900000000123456}, ' ') return 1"},
	{"concat10", "begin(KEYS, ARGV) local x for i = 1, 10 do x = P .. 'w:' .. ARGV[4] end return 1"},
}

func probe(ctx context.Context, c *redis.Client, counted func(string, int, func() error) (float64, error)) error {
	_, src, _ := luascripts.Library()
	lib, err := libraryCopy("rbprobe")
	if err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString(lib)
	for _, p := range probeFns {
		fmt.Fprintf(&b, "\nredis.register_function('probe_%s', function(KEYS, ARGV) %s end)\n", p.name, p.body)
	}
	// The acquire script cut short at points along its queueing path:
	// each cut returns before anything is written, so the same call
	// repeats (on the contended line, where a new waiter queues).
	cuts, err := acquireCuts(src)
	if err != nil {
		return err
	}
	for i, cut := range cuts {
		fmt.Fprintf(&b, "\nredis.register_function('probe_cut%d', function(KEYS, ARGV) begin(KEYS, ARGV)\n%s\nend)\n", i, cut.body)
	}
	if err := c.FunctionLoad(ctx, b.String()).Err(); err != nil {
		return err
	}
	if err := c.FunctionLoad(ctx, "#!lua name=rbtiny\nredis.register_function('tiny_empty', function() return 1 end)").Err(); err != nil {
		return err
	}
	cfg := "rb:{" + hex.EncodeToString([]byte("cg-prelude")) + "}:cfg"
	// The common arguments as the store sends them: its idle TTL is
	// 20 lease TTLs (an hour here).
	args := []any{"PUBLISH", strconv.Itoa(20 * 3600 * 1000), "", "1900000000123456"}
	fcall := func(fn string) func() error {
		return func() error { return c.FCall(ctx, fn, []string{cfg}, args...).Err() }
	}
	fmt.Println("probes (instructions per call):")
	v, err := counted("tiny_empty", 200, fcall("tiny_empty"))
	if err != nil {
		return err
	}
	fmt.Printf("  %-10s %8.0f  (an empty function in a library of its own)\n", "empty", v)
	for _, p := range probeFns {
		v, err := counted("probe_"+p.name, 200, fcall("probe_"+p.name))
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		fmt.Printf("  %-10s %8.0f  %s\n", p.name, v, p.body)
	}
	qcfg := "rb:{" + hex.EncodeToString([]byte("cg-contended")) + "}:cfg"
	enc := "1." + hex.EncodeToString([]byte("d0"))
	// A new waiter id each call: the later cuts come after the waiter
	// joined the line, and a second call of the same id takes another path.
	var seq int
	for i, cut := range cuts {
		fn := fmt.Sprintf("probe_cut%d", i)
		v, err := counted(fn, 50, func() error {
			seq++
			return c.FCall(ctx, fn, []string{qcfg}, "PUBLISH", strconv.Itoa(20*3600*1000), "",
				"probe-waiter-"+strconv.Itoa(seq), "probe.ch", "probe.sess", strconv.Itoa(budget.OpGet.Index()), "0", "callgrind",
				strconv.Itoa(3600*1000), "1", enc).Err()
		})
		if err != nil {
			return fmt.Errorf("%s: %w", fn, err)
		}
		fmt.Printf("  acquire, queueing, cut before %-60q %8.0f\n", cut.at, v)
	}
	return nil
}

// libraryCopy returns today's function library under the library name
// given, its functions renamed to start with it and an underscore (a
// function name is Redis-wide), for functions appended to it to call
// lib.lua's local helpers.
func libraryCopy(name string) (string, error) {
	_, src, fns := luascripts.Library()
	tag := strings.TrimSuffix(strings.TrimPrefix(fns["retire"], "rb_"), "_retire")
	first, rest, _ := strings.Cut(src, "\n")
	if !strings.HasPrefix(first, "#!lua name=") {
		return "", errors.New("the library does not start with its name")
	}
	return "#!lua name=" + name + "\n" + strings.ReplaceAll(rest, "rb_"+tag+"_", name+"_"), nil
}

type cut struct{ at, body string }

// acquireCuts returns the acquire script's body cut short before each of
// a few statements of its path for a new waiter that queues.
func acquireCuts(src string) ([]cut, error) {
	const open = "BODY['acquire'] = function(KEYS, ARGV)\n"
	i := strings.Index(src, open)
	if i < 0 {
		return nil, errors.New("no acquire body in the library")
	}
	body, _, ok := strings.Cut(src[i+len(open):], "\nend\nredis.register_function")
	if !ok {
		return nil, errors.New("the acquire body has no end")
	}
	var out []cut
	for _, at := range []string{
		"local id = id_arg(ARGV[4], 'waiter id')",
		"local ch = id_arg(ARGV[5], 'process channel', true)",
		"local class = int(ARGV[7], 'class', 0, NCLASS - 1, true)",
		"local encs",
		"local req = REUSE.areq",
		"local now = clock()",
		"vouch(lim, now, ttl)",
		"local lk = lxkey(sid)",
		"local left = session(sid, ttl, now)",
		"local dkey = P .. 'd:' .. encs[1]",
		"  entry = epack(id, sid, ch, class, body, ttl, now, '', consumer)",
		"    local at = r[4] + r[3] - #entry",
		"      if redis.call('APPEND', P .. 'q:' .. encs[1], entry) == r[3] then",
		"local rec = redis.call('HGET', lk, id)",
		"local doms = REUSE.adoms",
		"  for i = 1, n do at[i] = I(q_append(doms[i], entry, i > 1)) end",
	} {
		j := strings.Index(body, "\n"+at)
		if j < 0 {
			return nil, fmt.Errorf("acquire has no line %q", at)
		}
		out = append(out, cut{at: strings.TrimSpace(at), body: body[:j] + "\ndo return {'cut'} end\n" + body[j:]})
	}
	out = append(out, cut{at: "(the whole script)", body: body})
	return out, nil
}

// callsPer is the commands between two INFO commandstats, per op (top
// level: a script's inner commands are counted too, by name), the INFO
// itself left out.
func callsPer(before, after string, n int) string {
	var parts []string
	for name, v := range commandsPer(before, after, n) {
		parts = append(parts, fmt.Sprintf("%s %.2f", name, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// commandsPer is callsPer's figures by command name.
func commandsPer(before, after string, n int) map[string]float64 {
	b, a := commandCounts(before), commandCounts(after)
	out := map[string]float64{}
	for name, v := range a {
		if d := v - b[name]; d > 0 && name != "info" {
			out[name] = float64(d) / float64(n)
		}
	}
	return out
}

// commandCounts reads the calls of each command from INFO commandstats.
func commandCounts(s string) map[string]int64 {
	m := map[string]int64{}
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, ",")
		m[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.ParseInt(v, 10, 64)
	}
	return m
}
