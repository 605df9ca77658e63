package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"go.uber.org/goleak"

	"github.com/runbudget/runbudget/admission"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// A go-redis client's pool reaper runs until its client is closed at
		// the end of the test that opened it.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}

func get(t *testing.T, h http.Handler, client string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/hello?name=Ada", nil)
	if client != "" {
		req.Header.Set("X-Client", client)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// fixed is a RateCheck that always gives the same answer.
func fixed(d admission.RateDecision, err error) admission.RateCheck {
	return func(context.Context, string) (admission.RateDecision, error) { return d, err }
}

func TestStatusMapping(t *testing.T) {
	for _, tc := range []struct {
		name       string
		check      admission.RateCheck
		client     string
		status     int
		retryAfter string // "" means the header must be absent
		body       string
	}{
		{"allowed", fixed(admission.RateDecision{Allowed: true}, nil), "alice", 200, "", "hello, Ada\n"},
		{"denied, delay known", fixed(admission.RateDecision{RetryAfter: 1500 * time.Millisecond}, nil), "alice", 429, "2", "rate limited\n"},
		{"denied, delay under a second", fixed(admission.RateDecision{RetryAfter: time.Millisecond}, nil), "alice", 429, "1", "rate limited\n"},
		{"denied, delay unknown", fixed(admission.RateDecision{}, nil), "alice", 429, "", "rate limited\n"},
		{"backend down", fixed(admission.RateDecision{}, errors.New("dial tcp: alice's bucket")), "alice", 503, "", "rate limit unavailable\n"},
		{"backend nonsense", fixed(admission.RateDecision{Allowed: true, RetryAfter: time.Second}, nil), "alice", 503, "", "rate limit unavailable\n"},
		{"no identity", fixed(admission.RateDecision{Allowed: true}, nil), "", 401, "", "missing X-Client\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := newHandler(tc.check, 4, hello)
			if err != nil {
				t.Fatal(err)
			}
			rec := get(t, h, tc.client)
			if rec.Code != tc.status || rec.Body.String() != tc.body {
				t.Fatalf("got %d %q, want %d %q", rec.Code, rec.Body.String(), tc.status, tc.body)
			}
			got, present := rec.Header()["Retry-After"]
			if tc.retryAfter == "" && present {
				t.Fatalf("Retry-After %q set for an unknown delay", got)
			}
			if tc.retryAfter != "" && rec.Header().Get("Retry-After") != tc.retryAfter {
				t.Fatalf("Retry-After %q, want %q", rec.Header().Get("Retry-After"), tc.retryAfter)
			}
		})
	}
}

func TestOverloadedIs503(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	blocking := func(ctx context.Context, req any) (any, error) {
		entered <- struct{}{}
		<-release
		return hello(ctx, req)
	}
	h, err := newHandler(fixed(admission.RateDecision{Allowed: true}, nil), 1, blocking)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if rec := get(t, h, "alice"); rec.Code != 200 {
			t.Errorf("held call: %d", rec.Code)
		}
	})
	<-entered
	rec := get(t, h, "bob")
	if rec.Code != http.StatusServiceUnavailable || rec.Body.String() != "overloaded\n" {
		t.Fatalf("got %d %q, want 503 overloaded", rec.Code, rec.Body.String())
	}
	if _, present := rec.Header()["Retry-After"]; present {
		t.Fatal("Retry-After set on overload, whose end is unknown")
	}
	close(release)
	wg.Wait()
}

// TestSharedRateOverRedis serves two replicas from one Redis-backed rate:
// a client's burst is shared between them, other clients are not affected.
func TestSharedRateOverRedis(t *testing.T) {
	m := miniredis.RunT(t)
	m.SetTime(time.Unix(1_700_000_000, 0))
	p := admission.RatePolicy{PerSecond: 0.5, Burst: 2}
	var replicas []http.Handler
	for range 2 {
		check, closeCheck, err := rateCheck("redis://"+m.Addr()+"/0", p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(closeCheck)
		h, err := newHandler(check, 4, hello)
		if err != nil {
			t.Fatal(err)
		}
		replicas = append(replicas, h)
	}
	for i, want := range []int{200, 200, 429} {
		rec := get(t, replicas[i%2], "alice")
		if rec.Code != want {
			t.Fatalf("alice call %d: %d, want %d", i, rec.Code, want)
		}
		if want == 429 && rec.Header().Get("Retry-After") != "2" {
			t.Fatalf("Retry-After %q, want 2 (one token at 0.5/s)", rec.Header().Get("Retry-After"))
		}
	}
	if rec := get(t, replicas[1], "bob"); rec.Code != 200 {
		t.Fatalf("bob: %d, want 200", rec.Code)
	}
	m.SetTime(time.Unix(1_700_000_002, 0))
	if rec := get(t, replicas[0], "alice"); rec.Code != 200 {
		t.Fatalf("alice after 2s: %d, want 200", rec.Code)
	}
}

func TestRateCheckChoices(t *testing.T) {
	if _, _, err := rateCheck("", admission.RatePolicy{}); err == nil {
		t.Error("invalid local policy accepted")
	}
	_, _, err := rateCheck("redis://:s3cret@[bad", admission.RatePolicy{PerSecond: 1, Burst: 1})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad URL: error %v; want one that does not echo the password", err)
	}
	if _, _, err := rateCheck("redis://127.0.0.1:1/0", admission.RatePolicy{PerSecond: 1, Burst: 0}); err == nil {
		t.Error("invalid Redis policy accepted")
	}
	if _, err := newHandler(fixed(admission.RateDecision{}, nil), 0, hello); err == nil {
		t.Error("capacity 0 accepted")
	}
}
