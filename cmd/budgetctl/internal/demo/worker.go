package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/httpbudget"
	"github.com/runbudget/runbudget/redisstore"
	"golang.org/x/time/rate"
)

// A worker is one host of the demo's copy job: it claims listing pages from
// a counter in Redis (so any number of hosts share the work without knowing
// of each other), lists them, and copies their objects with --lanes lanes.
// Every lane's client retries like an SDK's (client.go). With the budget,
// every attempt goes through one httpbudget.Transport on the shared budget
// in Redis, which also reports each 503 to it. Without it (the baseline),
// each lane limits itself as if it were alone.

// WorkerConfig configures one host.
type WorkerConfig struct {
	Provider string // base URL
	Budget   string // budget name in Redis
	Host     string // this host's name: the budget's consumer, and progress label
	Lanes    int
	// NoBudget runs the baseline: each lane has its own rate limiter at
	// Limits.RequestsPerSecond and Limits.Burst.
	NoBudget bool
	Limits   budget.Limits
	// Attempts is how many times a lane sends one request before it gives
	// the object up (DefaultAttempts when zero).
	Attempts int
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
	Failed    int64   `json:"failed"` // objects given up on: their retries ran out (a failed listing loses its page)
	Bytes     int64   `json:"bytes"`
	Throttled int64   `json:"throttled"`         // 429s and 503s this host received
	Pages     int64   `json:"pages"`             // listing pages this host claimed
	Retries   int64   `json:"retries"`           // attempts after a request's first
	Waited    float64 `json:"waited_s"`          // lane time spent waiting for admission
	Backoff   float64 `json:"backoff_s"`         // lane time spent backing off between attempts
	Seconds   float64 `json:"seconds,omitempty"` // on done: the host's run time
	Error     string  `json:"error,omitempty"`   // on done: why the host failed
}

type worker struct {
	cfg   WorkerConfig
	rdb   redis.UniversalClient
	info  providerInfo
	claim string // Redis key of the page counter

	stats                        clientStats
	copied, failed, bytes, pages atomic.Int64
}

// sizeKey carries a GET's object size to budgetRequest, which reserves it.
type sizeKey struct{}

// budgetRequest is the httpbudget mapping of the demo's provider requests:
// one domain, the provider's, and a class by endpoint. A GET of an object
// opens a body and reserves the object's size in this host's memory; its
// lease ends when the lane closes the body, once the copy is written.
func (w *worker) budgetRequest(r *http.Request) (budget.Request, error) {
	req := budget.Request{Domains: []budget.Domain{w.info.Domain}, Consumer: w.cfg.Host}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/list":
		req.Class = budget.OpList
	case r.Method == http.MethodHead:
		req.Class = budget.OpHead
	case r.Method == http.MethodGet:
		req.Class, req.OpensBody = budget.OpGet, true
		req.MemoryBytes, _ = r.Context().Value(sizeKey{}).(int64)
	default:
		return budget.Request{}, fmt.Errorf("%w: the demo has no class for %s %s", budget.ErrInvalidRequest, r.Method, r.URL.Path)
	}
	return req, nil
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
// writing progress events to out. An object whose retries run out is
// counted as failed, not as the host's failure; the host fails (returns an
// error) when the budget refuses, Redis fails, or a copy comes out wrong.
// It closes everything it opened.
func RunWorker(ctx context.Context, cfg WorkerConfig, rdb redis.UniversalClient, out io.Writer) error {
	start := time.Now()
	if cfg.Attempts <= 0 {
		cfg.Attempts = DefaultAttempts
	}
	w := &worker{cfg: cfg, rdb: rdb}
	conns := &http.Transport{MaxIdleConnsPerHost: cfg.Lanes + 2, IdleConnTimeout: 30 * time.Second}
	defer conns.CloseIdleConnections()
	var err error
	if w.info, err = fetchInfo(ctx, &http.Client{Timeout: 30 * time.Second, Transport: conns}, cfg.Provider); err != nil {
		return err
	}
	w.claim = "budgetctl:demo:" + w.info.Run + ":page"

	// Every attempt of every lane reaches the wire through wire.
	wire := &sendMarker{base: conns, stats: &w.stats}
	newClient := func(rt http.RoundTripper) *client {
		return &client{http: &http.Client{Timeout: 30 * time.Second, Transport: rt},
			policy: sdkRetry(cfg.Attempts), jitter: rand.Float64, stats: &w.stats}
	}
	var laneClient func() *client
	if cfg.NoBudget {
		laneClient = func() *client {
			t := &laneTransport{base: wire}
			if cfg.Limits.RequestsPerSecond > 0 {
				t.lim = rate.NewLimiter(rate.Limit(cfg.Limits.RequestsPerSecond), max(1, cfg.Limits.Burst))
			}
			return newClient(t)
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
		// One Transport for the host: every lane's attempts draw on the
		// budget every host shares, and each 503 any lane receives slows
		// them all.
		shared := newClient(&httpbudget.Transport{Base: wire, Budget: b, Request: w.budgetRequest})
		laneClient = func() *client { return shared }
	}

	emit := func(typ string, errText string) {
		ev := WorkerEvent{Type: typ, Host: cfg.Host, Budget: !cfg.NoBudget, Objects: w.info.Objects,
			Copied: w.copied.Load(), Failed: w.failed.Load(), Bytes: w.bytes.Load(), Throttled: w.stats.throttled.Load(),
			Pages: w.pages.Load(), Retries: w.stats.retries.Load(), Waited: time.Duration(w.stats.waited.Load()).Seconds(),
			Backoff: time.Duration(w.stats.backoff.Load()).Seconds(), Error: errText}
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
		if err := w.list(ctx, laneClient(), keys); err != nil {
			cancel(err)
		}
	})
	for range cfg.Lanes {
		c := laneClient()
		wg.Go(func() {
			for obj := range keys {
				if err := w.copy(ctx, c, obj); err != nil {
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
// the lanes. A page whose listing runs out of retries is listed again.
func (w *worker) list(ctx context.Context, c *client, keys chan<- listedObject) error {
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
		page, err := w.listPage(ctx, c, q)
		if err != nil {
			return err
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

// listPage lists one page. A copy job cannot skip part of its listing, so
// when the page's attempts run out it lists it again, after the longest
// backoff its client uses: only objects are ever given up.
func (w *worker) listPage(ctx context.Context, c *client, q url.Values) (listing, error) {
	for {
		resp, err := c.do(ctx, func(ctx context.Context) (*http.Request, error) {
			return http.NewRequestWithContext(ctx, http.MethodGet, w.cfg.Provider+"/list?"+q.Encode(), nil)
		})
		if errors.Is(err, errGaveUp) {
			if err := sleepCtx(ctx, c.policy.backoff(c.policy.Attempts, c.jitter(), true, 0)); err != nil {
				return listing{}, err
			}
			continue
		}
		if err != nil {
			return listing{}, fmt.Errorf("listing: %w", err)
		}
		var page listing
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %s", resp.Status)
		} else {
			err = json.NewDecoder(resp.Body).Decode(&page)
		}
		resp.Body.Close()
		if err != nil {
			return listing{}, fmt.Errorf("listing: %w", err)
		}
		return page, nil
	}
}

// copy reads one object's metadata and content, checks it, and "writes"
// it. With the budget, each part of an attempt's lease ends as soon as it
// can: the request slot when the headers arrive (httpbudget), the GET's
// body slot and memory when the lane closes the body, once the copy is
// written. An object whose HEAD or GET runs out of retries is counted as
// failed, and copy returns nil: the lane goes on with the next one.
func (w *worker) copy(ctx context.Context, c *client, obj listedObject) error {
	objURL := w.cfg.Provider + "/o/" + obj.Key
	resp, err := c.do(ctx, func(ctx context.Context) (*http.Request, error) {
		return http.NewRequestWithContext(ctx, http.MethodHead, objURL, nil)
	})
	if errors.Is(err, errGaveUp) {
		w.failed.Add(1)
		return nil
	}
	if err != nil {
		return fmt.Errorf("HEAD %s: %w", obj.Key, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HEAD %s: %s", obj.Key, resp.Status)
	}
	size, etag := resp.ContentLength, resp.Header.Get("ETag")

	getCtx := context.WithValue(ctx, sizeKey{}, max(size, 0))
	resp, err = c.do(getCtx, func(ctx context.Context) (*http.Request, error) {
		return http.NewRequestWithContext(ctx, http.MethodGet, objURL, nil)
	})
	if errors.Is(err, errGaveUp) {
		w.failed.Add(1)
		return nil
	}
	if err != nil {
		return fmt.Errorf("GET %s: %w", obj.Key, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", obj.Key, resp.Status)
	}
	buf := bytes.NewBuffer(make([]byte, 0, max(size, 0)))
	if _, err := io.Copy(buf, resp.Body); err != nil {
		return fmt.Errorf("GET %s: body: %w", obj.Key, err)
	}
	h := fnv.New64a()
	h.Write(buf.Bytes()) // the "write" to the destination
	if got := strconv.Quote(strconv.FormatUint(h.Sum64(), 16)); got != etag || int64(buf.Len()) != size {
		return fmt.Errorf("GET %s: copy does not match its ETag", obj.Key)
	}
	// Closing the body ends the GET's lease: its body slot, and the
	// memory its buffer held, now written.
	resp.Body.Close()
	w.copied.Add(1)
	w.bytes.Add(int64(buf.Len()))
	return nil
}
