// Package s3fake serves gofakes3 behind a throttle that behaves like S3
// under overload, so tests and the s3copy example can show what a shared
// budget changes: each bucket has a read rate, a write rate and a
// concurrency ceiling per class, and a request over any of them gets
// 503 SlowDown with retry advice instead of service.
package s3fake

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"golang.org/x/time/rate"
)

// The classes the fake meters, as S3 does: reads (list, head, get) and
// writes (put, which includes POST and server-side copies, and delete).
const (
	List   = "list"
	Head   = "head"
	Get    = "get"
	Put    = "put"
	Delete = "delete"
)

// Limits are the fake provider's ceilings, each applied per bucket.
type Limits struct {
	// ReadRate and WriteRate bound request starts per second: GET, HEAD and
	// listings count as reads; PUT, POST, copies and deletes as writes.
	// Zero means unbounded.
	ReadRate, WriteRate float64
	// Burst is the token bucket depth of both rates (at least 1).
	Burst int
	// InFlight bounds requests being served at once per class. A GET counts
	// until its whole body has been written, as S3 counts it until drained.
	// Classes absent are unbounded.
	InFlight map[string]int
	// MinRetryAfter is the least advice sent with a 503 (default 100 ms):
	// over a rate the advice is the time until a token is due, over a
	// concurrency ceiling it is this.
	MinRetryAfter time.Duration
}

// Stats counts what the throttled endpoint saw.
type Stats struct {
	Requests  int64            // every request received
	Throttled int64            // answered 503 SlowDown
	ByClass   map[string]int64 // requests received, by class
	// PeakInFlight is the most requests of a class served at once on one
	// bucket (admitted ones only).
	PeakInFlight map[string]int
}

// Server is a fake S3 endpoint: URL is throttled, DirectURL serves the
// same objects without limits, for seeding and checking.
type Server struct {
	URL       string
	DirectURL string

	limits  Limits
	backend *s3mem.Backend
	front   *httptest.Server
	direct  *httptest.Server

	requests, throttled atomic.Int64

	mu      sync.Mutex
	buckets map[string]*bucketState
	byClass map[string]int64
	peak    map[string]int
}

type bucketState struct {
	read, write *rate.Limiter
	inFlight    map[string]int
}

// Start serves a new, empty fake on two loopback ports. Close stops it.
func Start(l Limits) *Server {
	if l.Burst < 1 {
		l.Burst = 1
	}
	if l.MinRetryAfter <= 0 {
		l.MinRetryAfter = 100 * time.Millisecond
	}
	s := &Server{
		limits:  l,
		backend: s3mem.New(),
		buckets: make(map[string]*bucketState),
		byClass: make(map[string]int64),
		peak:    make(map[string]int),
	}
	h := gofakes3.New(s.backend, gofakes3.WithoutVersioning()).Server()
	s.front = httptest.NewServer(s.throttle(h))
	s.direct = httptest.NewServer(h)
	s.URL, s.DirectURL = s.front.URL, s.direct.URL
	return s
}

// Close stops both endpoints and waits for their requests to finish.
func (s *Server) Close() {
	s.front.Close()
	s.direct.Close()
}

// CreateBucket creates a bucket directly in the backend.
func (s *Server) CreateBucket(name string) error { return s.backend.CreateBucket(name) }

// Stats returns the counts so far.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Requests:     s.requests.Load(),
		Throttled:    s.throttled.Load(),
		ByClass:      make(map[string]int64, len(s.byClass)),
		PeakInFlight: make(map[string]int, len(s.peak)),
	}
	for k, v := range s.byClass {
		st.ByClass[k] = v
	}
	for k, v := range s.peak {
		st.PeakInFlight[k] = v
	}
	return st
}

// ResetStats zeroes the counts, for a second run over the same objects.
func (s *Server) ResetStats() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests.Store(0)
	s.throttled.Store(0)
	clear(s.byClass)
	clear(s.peak)
	// Fresh buckets: a run must not inherit the last one's spent tokens.
	clear(s.buckets)
}

// Classify returns the bucket and class of a path-style S3 request.
func Classify(r *http.Request) (bucket, class string) {
	path := strings.TrimPrefix(r.URL.Path, "/")
	bucket, object, _ := strings.Cut(path, "/")
	q := r.URL.Query()
	switch r.Method {
	case http.MethodHead:
		return bucket, Head
	case http.MethodGet:
		switch {
		case object == "", q.Has("uploadId"):
			return bucket, List
		case q.Has("tagging"), q.Has("acl"), q.Has("attributes"):
			return bucket, Head
		default:
			return bucket, Get
		}
	case http.MethodDelete:
		return bucket, Delete
	case http.MethodPost:
		if object == "" && q.Has("delete") {
			return bucket, Delete
		}
		return bucket, Put
	default:
		return bucket, Put
	}
}

func (s *Server) throttle(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		bucket, class := Classify(r)
		wait, ok := s.admit(bucket, class)
		if !ok {
			s.throttled.Add(1)
			slowDown(w, r, wait)
			return
		}
		defer s.done(bucket, class)
		next.ServeHTTP(w, r)
	})
}

// admit takes a token and a slot, or returns the advice for a 503.
func (s *Server) admit(bucket, class string) (retryAfter time.Duration, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byClass[class]++
	b := s.buckets[bucket]
	if b == nil {
		b = &bucketState{
			read:     limiter(s.limits.ReadRate, s.limits.Burst),
			write:    limiter(s.limits.WriteRate, s.limits.Burst),
			inFlight: make(map[string]int),
		}
		s.buckets[bucket] = b
	}
	if c, bounded := s.limits.InFlight[class]; bounded && c > 0 && b.inFlight[class] >= c {
		return s.limits.MinRetryAfter, false
	}
	lim := b.read
	if class == Put || class == Delete {
		lim = b.write
	}
	now := time.Now()
	if res := lim.ReserveN(now, 1); res.DelayFrom(now) > 0 {
		d := res.DelayFrom(now)
		res.CancelAt(now)
		return max(d, s.limits.MinRetryAfter), false
	}
	b.inFlight[class]++
	s.peak[class] = max(s.peak[class], b.inFlight[class])
	return 0, true
}

func (s *Server) done(bucket, class string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.buckets[bucket]; b != nil && b.inFlight[class] > 0 {
		b.inFlight[class]--
	}
}

func limiter(r float64, burst int) *rate.Limiter {
	if r <= 0 {
		return rate.NewLimiter(rate.Inf, burst)
	}
	return rate.NewLimiter(rate.Limit(r), burst)
}

// slowDown answers as S3 does when over its request rate, with both forms
// of advice: x-amz-retry-after in milliseconds and Retry-After in whole
// seconds, rounded up.
func slowDown(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	h := w.Header()
	h.Set("X-Amz-Retry-After", strconv.FormatInt(wait.Milliseconds(), 10))
	h.Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
	h.Set("Content-Type", "application/xml")
	w.WriteHeader(http.StatusServiceUnavailable)
	if r.Method == http.MethodHead {
		return
	}
	fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?>`+
		`<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`)
}
