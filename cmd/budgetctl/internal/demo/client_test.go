package demo

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestBackoff: u x min(base x 2^retry, cap), base 1s after a throttle and
// 100ms otherwise, or the Retry-After when longer, never above the cap.
// The jitters are binary fractions, so every product is exact.
func TestBackoff(t *testing.T) {
	p := sdkRetry(3)
	for _, tc := range []struct {
		retry      int
		u          float64
		throttle   bool
		retryAfter time.Duration
		want       time.Duration
	}{
		{1, 0, true, 0, 0},                                               // full jitter reaches zero
		{1, 0.5, true, 0, time.Second},                                   // 0.5 x 1s x 2
		{2, 0.5, true, 0, 2 * time.Second},                               // doubles
		{3, 0.75, true, 0, 6 * time.Second},                              // 0.75 x 8s
		{1, 0.5, false, 0, 100 * time.Millisecond},                       // other failures: base 100ms
		{3, 0.5, false, 0, 400 * time.Millisecond},                       // 0.5 x 100ms x 8
		{5, 0.5, true, 0, 10 * time.Second},                              // 0.5 x min(32s, 20s)
		{40, 0.5, true, 0, 10 * time.Second},                             // far out: the cap, no overflow
		{1, 0.125, true, 700 * time.Millisecond, 700 * time.Millisecond}, // the Retry-After when longer
		{1, 0.75, true, 700 * time.Millisecond, 1500 * time.Millisecond}, // the backoff when longer
		{1, 0, false, time.Hour, 20 * time.Second},                       // a Retry-After is capped too
		{1, 0, true, time.Nanosecond, time.Nanosecond},                   // and honoured however short
	} {
		if got := p.backoff(tc.retry, tc.u, tc.throttle, tc.retryAfter); got != tc.want {
			t.Errorf("backoff(retry %d, u %v, throttle %v, Retry-After %v) = %v, want %v",
				tc.retry, tc.u, tc.throttle, tc.retryAfter, got, tc.want)
		}
	}
}

// testClient is a client on base with a policy of 3 attempts and
// millisecond backoffs, and no jitter: every wait is the Retry-After.
func testClient(base http.RoundTripper, stats *clientStats) *client {
	return &client{
		http:   &http.Client{Transport: base},
		policy: retryPolicy{Attempts: 3, Base: time.Millisecond, ThrottleBase: time.Millisecond, Cap: time.Second},
		jitter: func() float64 { return 0 },
		stats:  stats,
	}
}

func TestClientRetries(t *testing.T) {
	// The server answers the first `fail` requests of each test with 503
	// and Retry-After-Ms 7, the rest with 200.
	var served, fail atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if served.Add(1) <= fail.Load() {
			w.Header().Set("Retry-After-Ms", "7")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	get := func(ctx context.Context) (*http.Request, error) {
		return http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	}
	for _, tc := range []struct {
		name                string
		fail                int64
		wantErr             bool
		requests, throttled int64
		retries             int64
	}{
		{"first try", 0, false, 1, 0, 0},
		{"two throttles", 2, false, 3, 2, 2},
		{"out of attempts", 5, true, 3, 3, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			served.Store(0)
			fail.Store(tc.fail)
			var stats clientStats
			c := testClient(&sendMarker{base: http.DefaultTransport, stats: &stats}, &stats)
			resp, err := c.do(context.Background(), get)
			if tc.wantErr {
				var gu *gaveUpError
				if !errors.Is(err, errGaveUp) || !errors.As(err, &gu) || gu.attempts != 3 || gu.last != "503 Service Unavailable" {
					t.Fatalf("do = %v, want it to give up after 3 attempts on a 503", err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %s", resp.Status)
				}
			}
			// No jitter: each backoff is the server's Retry-After, 7ms.
			if served.Load() != tc.requests || stats.throttled.Load() != tc.throttled || stats.retries.Load() != tc.retries ||
				stats.backoff.Load() != tc.retries*int64(7*time.Millisecond) {
				t.Errorf("requests %d, throttled %d, retries %d, backoff %v; want %d, %d, %d, %v", served.Load(),
					stats.throttled.Load(), stats.retries.Load(), time.Duration(stats.backoff.Load()),
					tc.requests, tc.throttled, tc.retries, time.Duration(tc.retries*int64(7*time.Millisecond)))
			}
		})
	}

	t.Run("not retryable", func(t *testing.T) {
		nf := httptest.NewServer(http.NotFoundHandler())
		defer nf.Close()
		var stats clientStats
		c := testClient(&sendMarker{base: http.DefaultTransport, stats: &stats}, &stats)
		resp, err := c.do(context.Background(), func(ctx context.Context) (*http.Request, error) {
			return http.NewRequestWithContext(ctx, http.MethodGet, nf.URL, nil)
		})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || stats.retries.Load() != 0 {
			t.Errorf("status %s after %d retries; want 404 returned at once", resp.Status, stats.retries.Load())
		}
	})
}

// failingTransport fails every round trip with err, counting them, and
// calls onCall (if set) first.
type failingTransport struct {
	err    error
	onCall func()
	calls  atomic.Int64
}

func (f *failingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	f.calls.Add(1)
	if f.onCall != nil {
		f.onCall()
	}
	return nil, f.err
}

// admissionTransport refuses before anything reaches a sendMarker, as a
// budget that cannot admit does.
type admissionTransport struct{ err error }

func (a admissionTransport) RoundTrip(*http.Request) (*http.Response, error) { return nil, a.err }

func TestClientErrors(t *testing.T) {
	newReq := func(ctx context.Context) (*http.Request, error) {
		return http.NewRequestWithContext(ctx, http.MethodGet, "http://provider.invalid/o/x", nil)
	}
	t.Run("transport error after sending is retried", func(t *testing.T) {
		var stats clientStats
		wire := &failingTransport{err: errors.New("connection reset by peer")}
		c := testClient(&sendMarker{base: wire, stats: &stats}, &stats)
		_, err := c.do(context.Background(), newReq)
		if !errors.Is(err, errGaveUp) || wire.calls.Load() != 3 || stats.throttled.Load() != 0 {
			t.Errorf("do = %v after %d sends, %d throttles; want to give up after 3 sends, no throttle",
				err, wire.calls.Load(), stats.throttled.Load())
		}
	})
	t.Run("admission error is returned at once", func(t *testing.T) {
		var stats clientStats
		refused := errors.New("budget: store unavailable")
		c := testClient(admissionTransport{err: refused}, &stats)
		_, err := c.do(context.Background(), newReq)
		if !errors.Is(err, refused) || errors.Is(err, errGaveUp) || stats.retries.Load() != 0 {
			t.Errorf("do = %v after %d retries; want the budget's error, not retried", err, stats.retries.Load())
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		// The context ends during the first attempt: do returns its error
		// and sends nothing more.
		var stats clientStats
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		wire := &failingTransport{err: errors.New("connection refused"), onCall: cancel}
		c := testClient(&sendMarker{base: wire, stats: &stats}, &stats)
		_, err := c.do(ctx, newReq)
		if !errors.Is(err, context.Canceled) || wire.calls.Load() != 1 {
			t.Errorf("do = %v after %d sends; want context.Canceled after 1", err, wire.calls.Load())
		}
	})
}
