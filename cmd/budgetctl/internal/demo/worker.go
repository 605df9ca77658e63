package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/redisstore"
	"golang.org/x/time/rate"
)

// A worker is one host of the demo's copy job: it claims listing pages from
// a counter in Redis (so any number of hosts share the work without knowing
// of each other), lists them, and copies their objects with --lanes lanes.
// With the budget, every provider request first acquires from the shared
// budget in Redis, and a 503 is reported to it. Without it (the baseline),
// each lane limits itself as if it were alone and backs off on its own.

// WorkerConfig configures one host.
type WorkerConfig struct {
	Provider string // base URL
	Budget   string // budget name in Redis
	Host     string // this host's name: the budget's consumer, and progress label
	Lanes    int
	// NoBudget runs the baseline: each lane has its own rate limiter at
	// Limits.RequestsPerSecond and Limits.Burst, and waits out its own 503s.
	NoBudget bool
	Limits   budget.Limits
	LeaseTTL time.Duration
	Progress time.Duration // how often to print a progress line
}

// WorkerEvent is one line of a worker's output: JSON, for the demo to read.
type WorkerEvent struct {
	Type      string  `json:"type"` // "progress", or "done" on the last line
	Host      string  `json:"host"`
	Budget    bool    `json:"budget"`  // whether the lanes drew on the shared budget
	Objects   int     `json:"objects"` // objects in the whole run, from the provider
	Copied    int64   `json:"copied"`
	Bytes     int64   `json:"bytes"`
	Throttled int64   `json:"throttled"`         // 503s this host received
	Pages     int64   `json:"pages"`             // listing pages this host claimed
	Retries   int64   `json:"retries"`           // transport errors retried
	Waited    float64 `json:"waited_s"`          // lane time spent waiting for admission or backing off
	Seconds   float64 `json:"seconds,omitempty"` // on done: the host's run time
	Error     string  `json:"error,omitempty"`   // on done: why the host failed
}

// gate admits a lane's provider requests: the shared budget, or the lane's
// own limiter in the baseline.
type gate interface {
	acquire(ctx context.Context, class budget.OpClass, mem int64, opensBody bool) (ticket, error)
	// throttled is told of a 503 and returns once the lane may try again.
	throttled(ctx context.Context, retryAfter time.Duration) error
}

// ticket is an admitted request's hold, retired in parts.
type ticket interface {
	CompleteRequest()
	CloseBody()
	ReleaseMemory()
	Release()
}

type budgetGate struct {
	b        *budget.Budget
	domain   budget.Domain
	consumer string
}

func (g *budgetGate) acquire(ctx context.Context, class budget.OpClass, mem int64, opensBody bool) (ticket, error) {
	return g.b.Acquire(ctx, budget.Request{Domains: []budget.Domain{g.domain}, Class: class,
		MemoryBytes: mem, OpensBody: opensBody, Consumer: g.consumer})
}

// throttled reports the 503 to the budget, which pauses and slows every
// lane of every host on the domain; the lane then simply asks again.
func (g *budgetGate) throttled(ctx context.Context, retryAfter time.Duration) error {
	return g.b.Throttle(ctx, g.domain, retryAfter)
}

// laneGate is the baseline: limits that would be right for a lane alone. A
// lane runs one request at a time, so per-lane in-flight ceilings never
// bind; only its own rate limiter and its own backoff remain.
type laneGate struct{ lim *rate.Limiter }

func (g *laneGate) acquire(ctx context.Context, _ budget.OpClass, _ int64, _ bool) (ticket, error) {
	if g.lim != nil {
		if err := g.lim.Wait(ctx); err != nil {
			return nil, err
		}
	}
	return noTicket{}, nil
}

func (g *laneGate) throttled(ctx context.Context, retryAfter time.Duration) error {
	return sleepCtx(ctx, retryAfter)
}

type noTicket struct{}

func (noTicket) CompleteRequest() {}
func (noTicket) CloseBody()       {}
func (noTicket) ReleaseMemory()   {}
func (noTicket) Release()         {}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type worker struct {
	cfg   WorkerConfig
	rdb   redis.UniversalClient
	http  *http.Client
	info  providerInfo
	claim string // Redis key of the page counter

	copied, bytes, throttled, retries atomic.Int64
	waited                            atomic.Int64 // nanoseconds
	pages                             atomic.Int64
}

// fetchInfo asks the provider for the run's description, retrying while it
// starts (in docker-compose the workers may come up first).
func fetchInfo(ctx context.Context, client *http.Client, base string) (providerInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/info", nil)
		if err != nil {
			return providerInfo{}, fmt.Errorf("provider URL: %v", err)
		}
		resp, err := client.Do(req)
		if err == nil {
			var info providerInfo
			err = json.NewDecoder(resp.Body).Decode(&info)
			resp.Body.Close()
			if err == nil && resp.StatusCode == http.StatusOK {
				return info, nil
			}
			if err == nil {
				err = fmt.Errorf("status %s", resp.Status)
			}
		}
		last = err
		if sleepCtx(ctx, 200*time.Millisecond) != nil {
			return providerInfo{}, fmt.Errorf("provider at %s did not answer within 30s: %v", base, last)
		}
	}
}

// RunWorker runs one host until its share of the work is done or ctx ends,
// writing progress events to out. It closes everything it opened.
func RunWorker(ctx context.Context, cfg WorkerConfig, rdb redis.UniversalClient, out io.Writer) error {
	start := time.Now()
	w := &worker{cfg: cfg, rdb: rdb, http: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Lanes + 2, IdleConnTimeout: 30 * time.Second},
	}}
	defer w.http.CloseIdleConnections()
	var err error
	if w.info, err = fetchInfo(ctx, w.http, cfg.Provider); err != nil {
		return err
	}
	w.claim = "budgetctl:demo:" + w.info.Run + ":page"

	var g func() gate
	if cfg.NoBudget {
		g = func() gate {
			if cfg.Limits.RequestsPerSecond <= 0 {
				return &laneGate{}
			}
			return &laneGate{lim: rate.NewLimiter(rate.Limit(cfg.Limits.RequestsPerSecond), max(1, cfg.Limits.Burst))}
		}
	} else {
		s, err := redisstore.New(rdb, cfg.Budget, redisstore.WithLeaseTTL(cfg.LeaseTTL))
		if err != nil {
			return err
		}
		b, err := budget.New(cfg.Limits, budget.WithStore(s))
		if err != nil {
			return err
		}
		defer b.Close()
		shared := &budgetGate{b: b, domain: w.info.Domain, consumer: cfg.Host}
		g = func() gate { return shared }
	}

	emit := func(typ string, errText string) {
		ev := WorkerEvent{Type: typ, Host: cfg.Host, Budget: !cfg.NoBudget, Objects: w.info.Objects,
			Copied: w.copied.Load(), Bytes: w.bytes.Load(), Throttled: w.throttled.Load(), Pages: w.pages.Load(),
			Retries: w.retries.Load(), Waited: time.Duration(w.waited.Load()).Seconds(), Error: errText}
		if typ == "done" {
			ev.Seconds = time.Since(start).Seconds()
		}
		b, _ := json.Marshal(ev)
		fmt.Fprintf(out, "%s\n", b)
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	keys := make(chan listedObject, w.info.PageSize)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(keys)
		if err := w.list(ctx, g(), keys); err != nil {
			cancel(err)
		}
	})
	for range cfg.Lanes {
		lg := g()
		wg.Go(func() {
			for obj := range keys {
				if err := w.copy(ctx, lg, obj); err != nil {
					cancel(err)
					// Drain, so the lister is never stuck on a full channel.
					for range keys {
					}
					return
				}
			}
		})
	}
	progressDone := make(chan struct{})
	var pg sync.WaitGroup
	pg.Go(func() {
		t := time.NewTicker(cfg.Progress)
		defer t.Stop()
		for {
			select {
			case <-progressDone:
				return
			case <-t.C:
				emit("progress", "")
			}
		}
	})
	wg.Wait()
	close(progressDone)
	pg.Wait()
	if err := context.Cause(ctx); err != nil {
		emit("done", err.Error())
		return err
	}
	emit("done", "")
	return nil
}

// list claims pages until the listing runs out, and feeds their objects to
// the lanes.
func (w *worker) list(ctx context.Context, g gate, keys chan<- listedObject) error {
	for {
		n, err := w.rdb.Incr(ctx, w.claim).Result()
		if err != nil {
			return fmt.Errorf("claiming a listing page: %w", err)
		}
		if n == 1 {
			w.rdb.Expire(ctx, w.claim, time.Hour)
		}
		w.pages.Add(1)
		q := url.Values{"max-keys": {strconv.Itoa(w.info.PageSize)}}
		if n > 1 {
			q.Set("start-after", objectKey(int(n-1)*w.info.PageSize-1))
		}
		resp, t, err := w.do(ctx, g, budget.OpList, 0, false, func() (*http.Request, error) {
			return http.NewRequestWithContext(ctx, http.MethodGet, w.cfg.Provider+"/list?"+q.Encode(), nil)
		})
		if err != nil {
			return err
		}
		var page listing
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		t.Release()
		if err != nil {
			return fmt.Errorf("listing: %w", err)
		}
		if len(page.Keys) == 0 {
			return nil
		}
		for _, k := range page.Keys {
			select {
			case keys <- k:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// copy reads one object's metadata and content, checks it, and "writes"
// it, retiring each part of the budget as soon as it ends: the request
// slot when the headers arrive, the body slot once the body is drained,
// the memory once the buffer is written.
func (w *worker) copy(ctx context.Context, g gate, obj listedObject) error {
	objURL := w.cfg.Provider + "/o/" + obj.Key
	resp, t, err := w.do(ctx, g, budget.OpHead, 0, false, func() (*http.Request, error) {
		return http.NewRequestWithContext(ctx, http.MethodHead, objURL, nil)
	})
	if err != nil {
		return err
	}
	resp.Body.Close()
	t.Release()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HEAD %s: %s", obj.Key, resp.Status)
	}
	size, etag := resp.ContentLength, resp.Header.Get("ETag")

	resp, t, err = w.do(ctx, g, budget.OpGet, size, true, func() (*http.Request, error) {
		return http.NewRequestWithContext(ctx, http.MethodGet, objURL, nil)
	})
	if err != nil {
		return err
	}
	defer t.Release()
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return fmt.Errorf("GET %s: %s", obj.Key, resp.Status)
	}
	buf := bytes.NewBuffer(make([]byte, 0, max(size, 0)))
	_, err = io.Copy(buf, resp.Body)
	resp.Body.Close()
	t.CloseBody()
	if err != nil {
		return fmt.Errorf("GET %s: body: %w", obj.Key, err)
	}
	h := fnv.New64a()
	h.Write(buf.Bytes()) // the "write" to the destination
	if got := strconv.Quote(strconv.FormatUint(h.Sum64(), 16)); got != etag || int64(buf.Len()) != size {
		return fmt.Errorf("GET %s: copy does not match its ETag", obj.Key)
	}
	t.ReleaseMemory()
	w.copied.Add(1)
	w.bytes.Add(int64(buf.Len()))
	return nil
}

// do sends one provider request through the gate, retrying on 503 (after
// telling the gate) and on transport errors (a few times, with backoff).
// The returned ticket has its request part retired: the headers are in.
func (w *worker) do(ctx context.Context, g gate, class budget.OpClass, mem int64, opensBody bool,
	newReq func() (*http.Request, error)) (*http.Response, ticket, error) {
	failures := 0
	for {
		begin := time.Now()
		t, err := g.acquire(ctx, class, mem, opensBody)
		w.waited.Add(int64(time.Since(begin)))
		if err != nil {
			return nil, nil, err
		}
		req, err := newReq()
		if err != nil {
			t.Release()
			return nil, nil, err
		}
		resp, err := w.http.Do(req)
		if err != nil {
			t.Release()
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			if failures++; failures > 5 {
				return nil, nil, fmt.Errorf("%s request: %w", class, err)
			}
			w.retries.Add(1)
			if err := sleepCtx(ctx, time.Duration(failures)*100*time.Millisecond); err != nil {
				return nil, nil, err
			}
			continue
		}
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.CompleteRequest()
			return resp, t, nil
		}
		// Refused: nothing of the lease is needed any more; one Release
		// returns it all in one store call.
		t.Release()
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		w.throttled.Add(1)
		begin = time.Now()
		err = g.throttled(ctx, retryAfter(resp.Header))
		w.waited.Add(int64(time.Since(begin)))
		if err != nil {
			return nil, nil, err
		}
	}
}

// retryAfter reads Retry-After-Ms, else Retry-After in seconds (whole or
// fractional), else assumes one second.
func retryAfter(h http.Header) time.Duration {
	if ms, err := strconv.ParseInt(h.Get("Retry-After-Ms"), 10, 64); err == nil && ms >= 0 {
		return time.Duration(ms) * time.Millisecond
	}
	if s, err := strconv.ParseFloat(strings.TrimSpace(h.Get("Retry-After")), 64); err == nil && s >= 0 && s < 3600 {
		return time.Duration(s * float64(time.Second))
	}
	return time.Second
}
