package demo

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/cmd/budgetctl/internal/clitext"
)

// The simulated provider: an object store with one quota domain, which
// meters requests the way real ones do (a token bucket of requests per
// second and a cap on concurrent requests) and answers over its quota with
// 503 SlowDown and a Retry-After. It also records, from its side of the
// wire, every request it sees, so the demo's report measures what the
// provider saw, not what the clients believe they sent.
//
// Its overload model is one rule: a refused request is not free. The
// provider still accepts the connection, reads and authenticates the
// request and answers it, so a 503 takes RefusalCost of a token (by
// default a whole one, as rate limiters that count every request they
// receive do) from the same bucket the served requests draw on, and the
// bucket may go into debt, down to minus one bucket. Clients that keep
// hammering a throttled provider therefore push down what it can serve,
// and the Retry-After it sends grows with the debt; clients that stay
// under the quota never pay.

// Provider classes, as indexes into its counters.
var providerClasses = []budget.OpClass{budget.OpList, budget.OpHead, budget.OpGet}

const (
	classList = iota
	classHead
	classGet
)

// ProviderConfig describes the provider. Latencies are fixed per class with
// jitter, so runs are comparable.
type ProviderConfig struct {
	Quota         float64 // requests per second the quota domain admits
	Burst         int     // bucket size; 0 means Quota/5, at least 1
	MaxConcurrent int     // requests (including open bodies) served at once; 0 is unbounded
	Objects       int
	Size          int64 // mean object size; sizes vary between 1/2 and 3/2 of it
	PageSize      int   // keys per listing page
	Seed          uint64
	Domain        budget.Domain
	// RetryAfter is the least Retry-After the provider sends; a throttled
	// client is told to wait until the bucket has a token again, but never
	// less than this.
	RetryAfter time.Duration
	// RefusalCost is what one 503 takes from the bucket, in tokens (a
	// served request takes 1). Zero means DefaultRefusalCost, 1: every
	// request the provider receives counts against its quota, refused or
	// not. Less models a provider that refuses cheaply; negative means
	// refusals are free (the bucket then meters served requests only).
	RefusalCost float64
}

func (c *ProviderConfig) fill() {
	if c.Burst <= 0 {
		c.Burst = max(1, int(c.Quota/5))
	}
	if c.PageSize <= 0 {
		c.PageSize = 100
	}
	if c.RetryAfter <= 0 {
		c.RetryAfter = 100 * time.Millisecond
	}
	switch {
	case c.RefusalCost == 0:
		c.RefusalCost = DefaultRefusalCost
	case c.RefusalCost < 0:
		c.RefusalCost = 0
	}
	if c.Domain.ID == "" {
		c.Domain = budget.Domain{Version: 1, ID: "sim-provider/acct-1"}
	}
}

// DefaultRefusalCost is the share of a token a 503 costs the provider when
// ProviderConfig.RefusalCost is zero.
const DefaultRefusalCost = 1.0

// refusalCostConfig turns a --refusal-cost, where 0 means free, into a
// ProviderConfig.RefusalCost, where 0 means the default and a negative
// value free.
func refusalCostConfig(flag float64) float64 {
	if flag == 0 {
		return -1
	}
	return flag
}

// Simulated latencies.
const (
	listLatency = 12 * time.Millisecond
	headLatency = 4 * time.Millisecond
	getLatency  = 8 * time.Millisecond // to the first byte
	bodyChunks  = 4
	chunkDelay  = 3 * time.Millisecond
)

type provider struct {
	cfg   ProviderConfig
	run   string // identifies this provider's run, for the workers' page claims
	sizes []int64

	mu       sync.Mutex
	rng      *rand.Rand
	tokens   float64
	last     time.Time // of the last bucket refill
	start    time.Time
	active   int // requests being served, bodies included
	inFlight [3]int
	bodies   int
	st       providerCounters
}

type providerCounters struct {
	received, throttled, peak [3]int
	peakBodies, peakActive    int
	bytes                     int64
	arrivals                  []time.Duration // since start, every request
	lastEnd                   time.Duration
}

func newProvider(cfg ProviderConfig) *provider {
	cfg.fill()
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	sizes := make([]int64, cfg.Objects)
	for i := range sizes {
		sizes[i] = max(1, cfg.Size/2+rng.Int64N(cfg.Size+1))
	}
	return &provider{
		cfg:    cfg,
		run:    uuid.NewString(),
		sizes:  sizes,
		rng:    rng,
		tokens: float64(cfg.Burst),
		start:  time.Now(),
		last:   time.Now(),
	}
}

func objectKey(i int) string { return fmt.Sprintf("obj-%06d", i) }

func objectIndex(key string) (int, bool) {
	n, ok := strings.CutPrefix(key, "obj-")
	if !ok || len(n) != 6 {
		return 0, false
	}
	i, err := strconv.Atoi(n)
	return i, err == nil && i >= 0
}

// providerInfo is what GET /info returns: enough for a worker to join.
type providerInfo struct {
	Run      string        `json:"run"`
	Objects  int           `json:"objects"`
	PageSize int           `json:"page_size"`
	Domain   budget.Domain `json:"domain"`
	Quota    float64       `json:"quota"`
}

// listing is what GET /list returns.
type listing struct {
	Keys []listedObject `json:"keys"`
}

type listedObject struct {
	Key  string `json:"key"`
	Size int64  `json:"size"`
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/info":
		clitext.JSON(w, providerInfo{Run: p.run, Objects: p.cfg.Objects, PageSize: p.cfg.PageSize, Domain: p.cfg.Domain, Quota: p.cfg.Quota})
	case r.URL.Path == "/stats":
		clitext.JSON(w, p.stats())
	case r.URL.Path == "/list" && r.Method == http.MethodGet:
		p.serve(w, r, classList)
	case strings.HasPrefix(r.URL.Path, "/o/") && r.Method == http.MethodHead:
		p.serve(w, r, classHead)
	case strings.HasPrefix(r.URL.Path, "/o/") && r.Method == http.MethodGet:
		p.serve(w, r, classGet)
	default:
		http.NotFound(w, r)
	}
}

// admit counts an arriving request and decides whether the quota admits
// it. A refused request is in flight for no time at all, but it costs
// RefusalCost of a token: the bucket can go into debt, down to minus one
// bucket, so a provider refusing a flood stays throttled until the flood
// eases. The Retry-After it answers with is the time until the bucket
// holds a whole token again, at least cfg.RetryAfter.
func (p *provider) admit(class int) (ok bool, retryAfter time.Duration, jitter float64) {
	return p.admitAt(class, time.Now())
}

// admitAt is admit at time now, which must not go back.
func (p *provider) admitAt(class int, now time.Time) (ok bool, retryAfter time.Duration, jitter float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.st.arrivals = append(p.st.arrivals, now.Sub(p.start))
	p.st.received[class]++
	jitter = 0.75 + p.rng.Float64()/2

	p.tokens = math.Min(float64(p.cfg.Burst), p.tokens+now.Sub(p.last).Seconds()*p.cfg.Quota)
	p.last = now
	switch {
	case p.cfg.MaxConcurrent > 0 && p.active >= p.cfg.MaxConcurrent:
		retryAfter = p.cfg.RetryAfter
	case p.cfg.Quota > 0 && p.tokens < 1:
		retryAfter = p.cfg.RetryAfter
	default:
		if p.cfg.Quota > 0 {
			p.tokens--
		}
		p.active++
		p.st.peakActive = max(p.st.peakActive, p.active)
		p.inFlight[class]++
		p.st.peak[class] = max(p.st.peak[class], p.inFlight[class])
		return true, 0, jitter
	}
	p.tokens = math.Max(-float64(p.cfg.Burst), p.tokens-p.cfg.RefusalCost)
	if p.cfg.Quota > 0 {
		retryAfter = max(retryAfter, time.Duration((1-p.tokens)/p.cfg.Quota*float64(time.Second)))
	}
	p.st.throttled[class]++
	p.st.lastEnd = now.Sub(p.start)
	return false, retryAfter.Round(time.Millisecond), jitter
}

// endRequest marks the request's headers as about to be sent: the request
// stops counting as in flight. It is recorded before the client can see
// the response, so the provider's count never outlasts the client's.
func (p *provider) endRequest(class int, opensBody bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight[class]--
	if opensBody {
		p.bodies++
		p.st.peakBodies = max(p.st.peakBodies, p.bodies)
	} else {
		p.active--
		p.st.lastEnd = time.Since(p.start)
	}
}

// endBody marks a body as about to be finished, again before the client
// can have read its last byte.
func (p *provider) endBody(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bodies--
	p.active--
	p.st.bytes += n
	p.st.lastEnd = time.Since(p.start)
}

func (p *provider) serve(w http.ResponseWriter, r *http.Request, class int) {
	ok, retryAfter, jitter := p.admit(class)
	if !ok {
		// Retry-After in whole seconds is what HTTP allows; Retry-After-Ms
		// carries the precise value (the header Azure's SDKs read). The
		// budget's httpbudget.Transport reads Retry-After; the per-lane SDK
		// clients prefer Retry-After-Ms, which asks them to wait less.
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(retryAfter.Seconds()))))
		w.Header().Set("Retry-After-Ms", strconv.FormatInt(retryAfter.Milliseconds(), 10))
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, slowDownBody)
		return
	}
	wait := func(d time.Duration) bool {
		t := time.NewTimer(time.Duration(float64(d) * jitter))
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-r.Context().Done():
			return false
		}
	}
	switch class {
	case classList:
		wait(listLatency)
		after := r.URL.Query().Get("start-after")
		from := 0
		if after != "" {
			i, ok := objectIndex(after)
			if !ok {
				p.endRequest(class, false)
				http.Error(w, "bad start-after", http.StatusBadRequest)
				return
			}
			from = i + 1
		}
		limit, err := strconv.Atoi(r.URL.Query().Get("max-keys"))
		if err != nil || limit <= 0 || limit > p.cfg.PageSize {
			limit = p.cfg.PageSize
		}
		out := listing{Keys: []listedObject{}}
		for i := from; i < len(p.sizes) && len(out.Keys) < limit; i++ {
			out.Keys = append(out.Keys, listedObject{Key: objectKey(i), Size: p.sizes[i]})
		}
		p.endRequest(class, false)
		clitext.JSON(w, out)
	case classHead, classGet:
		i, ok := objectIndex(strings.TrimPrefix(r.URL.Path, "/o/"))
		if !ok || i >= len(p.sizes) {
			p.endRequest(class, false)
			http.NotFound(w, r)
			return
		}
		size := p.sizes[i]
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		w.Header().Set("ETag", strconv.Quote(objectETag(i, size)))
		if class == classHead {
			wait(headLatency)
			p.endRequest(class, false)
			w.WriteHeader(http.StatusOK)
			return
		}
		if !wait(getLatency) {
			p.endRequest(class, false)
			return
		}
		p.endRequest(class, true)
		ended := false
		defer func() {
			if !ended {
				p.endBody(0)
			}
		}()
		w.WriteHeader(http.StatusOK)
		body := objectBody(i, size)
		chunk := (int(size) + bodyChunks - 1) / bodyChunks
		for off := 0; off < len(body); off += chunk {
			end := min(off+chunk, len(body))
			if end == len(body) {
				p.endBody(size)
				ended = true
			}
			if _, err := w.Write(body[off:end]); err != nil {
				return
			}
			if end < len(body) {
				w.(http.Flusher).Flush()
				if !wait(chunkDelay) {
					return
				}
			}
		}
	}
}

// slowDownBody is the error document S3 sends with a 503 it throttles.
const slowDownBody = `<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>
`

// objectBody is object i's content: deterministic, so a copy can be checked.
func objectBody(i int, size int64) []byte {
	b := make([]byte, size)
	x := uint32(i)*2654435761 + 1
	for j := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[j] = byte(x)
	}
	return b
}

func objectETag(i int, size int64) string {
	h := fnv.New64a()
	h.Write(objectBody(i, size))
	return strconv.FormatUint(h.Sum64(), 16)
}

// ProviderStats is the provider's view of a run.
type ProviderStats struct {
	Quota          float64                       `json:"quota"`
	Burst          int                           `json:"burst"`
	MaxConcurrent  int                           `json:"max_concurrent"`
	RefusalCost    float64                       `json:"refusal_cost"`
	Requests       int                           `json:"requests"` // received, refused ones included
	Throttled      int                           `json:"throttled"`
	Served         int                           `json:"served"` // Requests - Throttled
	Classes        map[budget.OpClass]ClassStats `json:"classes"`
	PeakOpenBodies int                           `json:"peak_open_bodies"`
	PeakConcurrent int                           `json:"peak_concurrent"`
	Bytes          int64                         `json:"bytes"`
	// Seconds is the span from the first request's arrival to the end of
	// the last one; RequestsPerSecond is Requests over it. PeakPerSecond is
	// the most requests that arrived within any one second.
	Seconds           float64 `json:"seconds"`
	RequestsPerSecond float64 `json:"requests_per_second"`
	PeakPerSecond     int     `json:"peak_per_second"`
	// Utilization is the share of the quota that did useful work: Served
	// over Quota x Seconds. A budget at 90% of the quota tops out near 0.9.
	Utilization float64 `json:"utilization"`
}

// ClassStats is the provider's view of one class of requests.
type ClassStats struct {
	Requests     int `json:"requests"`
	Throttled    int `json:"throttled"`
	PeakInFlight int `json:"peak_in_flight"`
}

func (p *provider) stats() ProviderStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := ProviderStats{
		Quota: p.cfg.Quota, Burst: p.cfg.Burst, MaxConcurrent: p.cfg.MaxConcurrent, RefusalCost: p.cfg.RefusalCost,
		Classes:        map[budget.OpClass]ClassStats{},
		PeakOpenBodies: p.st.peakBodies, PeakConcurrent: p.st.peakActive, Bytes: p.st.bytes,
	}
	for i, c := range providerClasses {
		s.Classes[c] = ClassStats{Requests: p.st.received[i], Throttled: p.st.throttled[i], PeakInFlight: p.st.peak[i]}
		s.Requests += p.st.received[i]
		s.Throttled += p.st.throttled[i]
	}
	s.Served = s.Requests - s.Throttled
	s.Seconds, s.RequestsPerSecond, s.PeakPerSecond = arrivalRates(p.st.arrivals, p.st.lastEnd)
	s.Utilization = utilization(s.Served, s.Quota, s.Seconds)
	return s
}

// utilization is served over quota x seconds; a span under a second counts
// as one, as arrivalRates does, and no quota or no time is 0.
func utilization(served int, quota, seconds float64) float64 {
	if quota <= 0 || seconds <= 0 {
		return 0
	}
	return float64(served) / (quota * math.Max(seconds, 1))
}

// arrivalRates summarizes arrival times (ascending): the span from the
// first arrival to end, the mean rate over it, and the most arrivals within
// any one-second window.
func arrivalRates(arrivals []time.Duration, end time.Duration) (seconds, mean float64, peak int) {
	if len(arrivals) == 0 {
		return 0, 0, 0
	}
	span := max(end, arrivals[len(arrivals)-1]) - arrivals[0]
	seconds = span.Seconds()
	if span > 0 {
		// A run shorter than a second still spreads its requests over at
		// least that second, so a handful of requests is not a huge rate.
		mean = float64(len(arrivals)) / math.Max(seconds, 1)
	}
	lo := 0
	for hi, t := range arrivals {
		for t-arrivals[lo] >= time.Second {
			lo++
		}
		peak = max(peak, hi-lo+1)
	}
	return seconds, mean, peak
}

// serveProvider starts p on addr and returns its base URL; stop shuts it
// down and waits for its handlers.
func serveProvider(p *provider, addr string) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("provider: %w", err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	stop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
		<-done
	}
	return "http://" + ln.Addr().String(), stop, nil
}

// ServeProvider serves the simulated provider described by cfg on listen
// until ctx ends. It says where it serves on stderr, and writes its
// counters to stdout as a JSON line every interval in which requests
// arrived.
func ServeProvider(ctx context.Context, cfg ProviderConfig, listen string, every time.Duration, stdout, stderr io.Writer) error {
	p := newProvider(cfg)
	url, shutdown, err := serveProvider(p, listen)
	if err != nil {
		return err
	}
	defer shutdown()
	fmt.Fprintf(stderr, "provider: serving %d objects on %s, quota %g req/s (burst %d), at most %d at once, a 503 costs %g of a request; run %s\n",
		p.cfg.Objects, url, p.cfg.Quota, p.cfg.Burst, p.cfg.MaxConcurrent, p.cfg.RefusalCost, p.run)
	tick := time.NewTicker(every)
	defer tick.Stop()
	seen := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		s := p.stats()
		if s.Requests == seen {
			continue
		}
		seen = s.Requests
		if err := clitext.JSON(stdout, s); err != nil {
			return err
		}
	}
}
