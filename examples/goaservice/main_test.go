package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	goahttp "goa.design/goa/v3/http"

	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/admission"
	"github.com/runbudget/runbudget/examples/goaservice/gen/http/objects/server"
	"github.com/runbudget/runbudget/examples/goaservice/gen/objects"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// roomy is a policy no test call exhausts, for tests about something else.
var roomy = admission.RatePolicy{PerSecond: 1000, Burst: 1000}

// strict gives each client one call, then one more every ten seconds: a
// second call is denied with a Retry-After near 10.
var strict = admission.RatePolicy{PerSecond: 0.1, Burst: 1}

// rateCheck returns a rate backend on srv under a prefix of its own, so
// tests never share buckets.
func rateCheck(t *testing.T, srv *redistest.Server, p admission.RatePolicy) admission.RateCheck {
	t.Helper()
	check, err := redisstore.NewRateCheck(srv.Client(t), "goaservice-test:"+rand.Text()+":", p)
	if err != nil {
		t.Fatal(err)
	}
	return check
}

// lineSink receives what an http.Server logs, one write per line, so a test
// can wait for a line instead of sleeping.
type lineSink chan string

func (s lineSink) Write(p []byte) (int, error) {
	select {
	case s <- string(p):
	default: // nobody waits for more: drop it rather than block the server
	}
	return len(p), nil
}

// site is one service instance served over real HTTP on loopback.
type site struct {
	ts   *httptest.Server
	conc *admission.Concurrency
	logs lineSink
}

func serveHandler(t *testing.T, h http.Handler) (*httptest.Server, lineSink) {
	t.Helper()
	logs := make(lineSink, 16)
	ts := httptest.NewUnstartedServer(h)
	ts.Config.ErrorLog = log.New(logs, "", 0)
	ts.Start()
	t.Cleanup(ts.Close)
	return ts, logs
}

func serve(t *testing.T, svc objects.Service, check admission.RateCheck, capacity int) *site {
	t.Helper()
	h, conc, err := newHandler(svc, check, config{capacity: capacity, checkTimeout: 200 * time.Millisecond}, log.New(io.Discard, "", 0))
	if err != nil {
		t.Fatal(err)
	}
	ts, logs := serveHandler(t, h)
	return &site{ts: ts, conc: conc, logs: logs}
}

// reply is what a call got back.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) String() string { return strconv.Itoa(r.status) + " " + string(r.body) }

// do sends one request; client "" sends no X-Client header.
func do(ts *httptest.Server, method, path, client, body string) (reply, error) {
	req, err := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if client != "" {
		req.Header.Set("X-Client", client)
	}
	res, err := ts.Client().Do(req)
	if err != nil {
		return reply{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return reply{status: res.StatusCode, header: res.Header, body: b}, err
}

func call(t *testing.T, ts *httptest.Server, method, path, client, body string) reply {
	t.Helper()
	r, err := do(ts, method, path, client, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func put(t *testing.T, s *site, client, key string) reply {
	t.Helper()
	return call(t, s.ts, http.MethodPut, "/objects/"+key, client, `{"content":"hello"}`)
}

// serviceError decodes the body Goa writes for an ErrorResult error.
func serviceError(t *testing.T, r reply) goahttp.ErrorResponse {
	t.Helper()
	var e goahttp.ErrorResponse
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("error body %q: %v", r.body, err)
	}
	return e
}

// declared are the ErrorResult errors the design declares.
var declared = map[string]bool{"overloaded": true, "rate_limit_unavailable": true, "not_found": true}

// wantError checks status, error name (body and goa-error header), and that
// no Retry-After is sent.
func wantError(t *testing.T, r reply, status int, name string) goahttp.ErrorResponse {
	t.Helper()
	if r.status != status {
		t.Fatalf("got %v, want status %d", r, status)
	}
	e := serviceError(t, r)
	// Errors the design declares also name themselves in a goa-error
	// header; Goa's own (missing_field, ...) go through its fallback encoder,
	// which sets none.
	if e.Name != name || (declared[name] && r.header.Get("goa-error") != name) {
		t.Fatalf("got %v (goa-error %q), want error %q", r, r.header.Get("goa-error"), name)
	}
	if v, ok := r.header["Retry-After"]; ok {
		t.Fatalf("Retry-After %q on %s", v, name)
	}
	return e
}

func TestCallsServed(t *testing.T) {
	srv := redistest.Start(t)
	s := serve(t, newStore(), rateCheck(t, srv, roomy), 4)

	for _, step := range []struct {
		method, path, client, body string
		status                     int
		want                       string // exact body for successes, error name otherwise
	}{
		{http.MethodPut, "/objects/a", "alice", `{"content":"hello"}`, 200, `{"key":"a","size":5}`},
		{http.MethodPost, "/objects/a/copy", "alice", `{"to":"b"}`, 200, `{"key":"b","size":5}`},
		{http.MethodPost, "/objects/missing/copy", "alice", `{"to":"b"}`, 404, "not_found"},
		// Goa validates before any endpoint middleware: no X-Client is a
		// 400 that never reaches admission.
		{http.MethodPut, "/objects/a", "", `{"content":"hello"}`, 400, "missing_field"},
	} {
		r := call(t, s.ts, step.method, step.path, step.client, step.body)
		if step.status == 200 {
			if r.status != 200 || strings.TrimSpace(string(r.body)) != step.want {
				t.Fatalf("%s %s: got %v, want 200 %s", step.method, step.path, r, step.want)
			}
			continue
		}
		wantError(t, r, step.status, step.want)
	}
	if got := s.conc.Snapshot(); got.Admitted != 3 || got.InFlight != 0 || got.Rejected != 0 {
		t.Fatalf("concurrency %+v, want 3 admitted and nothing held or rejected", got)
	}
}

// gated is a store whose Put waits, after it has been admitted, until the
// test releases it: a call that holds its permit for as long as the test
// needs.
type gated struct {
	*store
	entered chan struct{}
	release chan struct{}
}

func newGated() *gated {
	return &gated{store: newStore(), entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *gated) Put(ctx context.Context, p *objects.PutPayload) (*objects.Object, error) {
	select {
	case g.entered <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case <-g.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.store.Put(ctx, p)
}

// hold starts a put by client that takes the permit and keeps it until the
// returned function is called; that function waits for the put's reply.
func hold(t *testing.T, s *site, g *gated, client string) func() reply {
	t.Helper()
	done := make(chan reply, 1)
	errc := make(chan error, 1)
	go func() {
		r, err := do(s.ts, http.MethodPut, "/objects/held", client, `{"content":"hello"}`)
		if err != nil {
			errc <- err
			return
		}
		done <- r
	}()
	select {
	case <-g.entered:
	case err := <-errc:
		t.Fatalf("holding call: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("holding call never reached the service")
	}
	var (
		released bool
		got      reply
	)
	finish := func() reply {
		if released {
			return got
		}
		released = true
		close(g.release)
		select {
		case got = <-done:
		case err := <-errc:
			t.Errorf("holding call: %v", err)
		}
		return got
	}
	t.Cleanup(func() { finish() }) // never leave the goroutine behind
	return finish
}

func TestOverloadedIs503(t *testing.T) {
	srv := redistest.Start(t)
	g := newGated()
	s := serve(t, g, rateCheck(t, srv, roomy), 1)
	finish := hold(t, s, g, "alice")

	e := wantError(t, call(t, s.ts, http.MethodPost, "/objects/held/copy", "bob", `{"to":"b"}`), 503, "overloaded")
	if !e.Temporary || e.Timeout || e.Fault || e.Message != "too many calls in progress; retry later" {
		t.Fatalf("overloaded body %+v", e)
	}
	if r := finish(); r.status != 200 {
		t.Fatalf("held call: %v", r)
	}
	// The permit is back: the same call now goes through.
	if r := call(t, s.ts, http.MethodPost, "/objects/held/copy", "bob", `{"to":"b"}`); r.status != 200 {
		t.Fatalf("after release: %v", r)
	}
}

func TestRateDeniedIs429WithRetryAfter(t *testing.T) {
	srv := redistest.Start(t)
	check := rateCheck(t, srv, strict)
	// Two replicas on one Redis: a client's allowance is one, shared.
	a := serve(t, newStore(), check, 4)
	b := serve(t, newStore(), check, 4)

	if r := put(t, a, "alice", "x"); r.status != 200 {
		t.Fatalf("first call: %v", r)
	}
	r := put(t, b, "alice", "x")
	if r.status != 429 || r.header.Get("goa-error") != "rate_limited" {
		t.Fatalf("second call on the other replica: %v, want 429 rate_limited", r)
	}
	// One token per ten seconds, just spent: the wait is 10s less the time
	// since, rounded up to whole seconds.
	secs, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || secs < 9 || secs > 10 {
		t.Fatalf("Retry-After %q, want 9 or 10", r.header.Get("Retry-After"))
	}
	var body map[string]any
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("429 body %q: %v", r.body, err)
	}
	// The header carries the delay; the body keeps only the message.
	if len(body) != 1 || body["message"] != "rate limit exceeded; retry later" {
		t.Fatalf("429 body %q", r.body)
	}
	// Buckets are per client.
	if r := put(t, b, "bob", "x"); r.status != 200 {
		t.Fatalf("another client: %v", r)
	}
}

func TestRateDeniedWithoutKnownDelaySendsNoRetryAfter(t *testing.T) {
	// A backend that denies without a delay: what the design says then is
	// "no header", not a guessed one.
	unknown := func(context.Context, string) (admission.RateDecision, error) {
		return admission.RateDecision{}, nil
	}
	s := serve(t, newStore(), unknown, 4)
	r := put(t, s, "alice", "x")
	if r.status != 429 {
		t.Fatalf("got %v, want 429", r)
	}
	if v, ok := r.header["Retry-After"]; ok {
		t.Fatalf("Retry-After %q for an unknown delay", v)
	}
}

// wantNoLeak fails if an error body names the rate group key or anything of
// the backend.
func wantNoLeak(t *testing.T, r reply, srv *redistest.Server, secrets ...string) {
	t.Helper()
	for _, s := range append(secrets, srv.Addr(), strconv.Itoa(srv.Port()), "dial", "refused", "redis", "i/o", "goaservice-test") {
		if bytes.Contains(bytes.ToLower(r.body), []byte(strings.ToLower(s))) {
			t.Fatalf("body %q contains %q", r.body, s)
		}
	}
}

// TestRedisDownIs503Unavailable kills the server under a running service.
// What the check then reports depends on the client: go-redis by default
// redials five times 100ms apart and retries the command, which outlasts the
// check's 200ms, so the refusal is the timed-out flavour; a client told not
// to retry fails at once with a plain one. Both are 503 here.
func TestRedisDownIs503Unavailable(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    redis.Options
		timeout bool
	}{
		{"go-redis defaults", redis.Options{}, true},
		{"no retries", redis.Options{DialerRetries: 1, MaxRetries: -1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			opts := tc.opts
			opts.Addr = srv.Addr()
			opts.ContextTimeoutEnabled = true
			client := redis.NewClient(&opts)
			t.Cleanup(func() { _ = client.Close() })
			check, err := redisstore.NewRateCheck(client, "goaservice-test:"+rand.Text()+":", roomy)
			if err != nil {
				t.Fatal(err)
			}
			s := serve(t, newStore(), check, 4)
			const key = "tenant-7f3a-secret"
			if r := put(t, s, key, "x"); r.status != 200 {
				t.Fatalf("with Redis up: %v", r)
			}
			srv.Kill()

			r := put(t, s, key, "x")
			e := wantError(t, r, 503, "rate_limit_unavailable")
			want := "rate limit check unavailable; retry later"
			if tc.timeout {
				want = "rate limit check timed out; retry later"
			}
			if !e.Temporary || e.Timeout != tc.timeout || e.Message != want {
				t.Fatalf("body %+v, want Timeout %v and message %q", e, tc.timeout, want)
			}
			wantNoLeak(t, r, srv, key)
			if got := s.conc.Snapshot(); got.Admitted != 1 {
				t.Fatalf("concurrency %+v: a call refused by the rate check took a permit", got)
			}
		})
	}
}

// A Redis that accepts but never answers makes the check run out of time.
// admission flags that error Timeout, which Goa's fallback encoder would send
// as 504; the design's explicit mapping keeps it 503.
func TestRedisStalledIs503NotGatewayTimeout(t *testing.T) {
	srv := redistest.Start(t)
	check := rateCheck(t, srv, roomy)
	s := serve(t, newStore(), check, 4)
	if r := put(t, s, "alice", "x"); r.status != 200 {
		t.Fatalf("with Redis up: %v", r)
	}
	srv.Pause()
	t.Cleanup(srv.Resume)

	r := put(t, s, "alice", "x")
	e := wantError(t, r, 503, "rate_limit_unavailable")
	if !e.Temporary || !e.Timeout || e.Message != "rate limit check timed out; retry later" {
		t.Fatalf("body %+v", e)
	}
	wantNoLeak(t, r, srv, "alice")

	// The same error through Goa's fallback, as an undeclared error name
	// would go: 504.
	ra, err := admission.NewRateAdmission(check, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ra.Check(context.Background(), "alice")
	rec := httptest.NewRecorder()
	if encErr := goahttp.ErrorEncoder(goahttp.ResponseEncoder, nil)(context.Background(), rec, err); encErr != nil {
		t.Fatal(encErr)
	}
	if rec.Code != http.StatusGatewayTimeout {
		t.Fatalf("fallback encoder gave %d for %v, want 504", rec.Code, err)
	}
}

// handWritten has the design's error name but is not the generated type.
type handWritten struct{ retryAfter int64 }

func (*handWritten) Error() string        { return "rate limited" }
func (*handWritten) GoaErrorName() string { return "rate_limited" }

// TestHandWrittenDenialCrashesEncoder is the reason rateLimited returns the
// generated *objects.RateLimited. The generated error encoder switches on
// GoaErrorName, then extracts the design's type with errors.As and uses it
// without checking: a different type leaves it nil, and the encoder panics.
func TestHandWrittenDenialCrashesEncoder(t *testing.T) {
	t.Run("encoder", func(t *testing.T) {
		enc := server.EncodeCopyError(goahttp.ResponseEncoder, nil)
		defer func() {
			p := recover()
			re, ok := p.(runtime.Error)
			if !ok || !strings.Contains(re.Error(), "nil pointer dereference") {
				t.Fatalf("recovered %v, want a nil pointer dereference", p)
			}
		}()
		_ = enc(context.Background(), httptest.NewRecorder(), &handWritten{retryAfter: 3})
		t.Fatal("the encoder returned")
	})

	t.Run("over HTTP", func(t *testing.T) {
		srv := redistest.Start(t)
		ra, err := admission.NewRateAdmission(rateCheck(t, srv, strict), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		endpoints := objects.NewEndpoints(newStore())
		endpoints.Use(ra.Middleware(rateKey, func(d admission.RateDecision) error {
			return &handWritten{retryAfter: d.RetryAfterSeconds()}
		}))
		mux := goahttp.NewMuxer()
		server.Mount(mux, server.New(endpoints, mux, goahttp.RequestDecoder, goahttp.ResponseEncoder, nil, nil))
		ts, logs := serveHandler(t, mux)

		if r := call(t, ts, http.MethodPost, "/objects/a/copy", "alice", `{"to":"b"}`); r.status != 404 {
			t.Fatalf("first call: %v, want 404 not_found", r)
		}
		// Denied: the client gets no response at all, the connection is cut.
		if r, err := do(ts, http.MethodPost, "/objects/a/copy", "alice", `{"to":"b"}`); err == nil {
			t.Fatalf("denied call answered %v; want the connection dropped", r)
		}
		select {
		case line := <-logs:
			if !strings.Contains(line, "panic serving") || !strings.Contains(line, "nil pointer dereference") {
				t.Fatalf("server logged %q, want a nil pointer panic", line)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("server logged nothing")
		}
	})
}

// TestUseOrder pins the order newHandler installs: rate outermost. A client
// over its rate is refused 429 even while every permit is taken, and never
// counted by Concurrency; the price, a call refused as overloaded has spent
// its token.
func TestUseOrder(t *testing.T) {
	srv := redistest.Start(t)
	g := newGated()
	s := serve(t, g, rateCheck(t, srv, strict), 1)

	// spent uses its one token while the service is idle.
	if r := call(t, s.ts, http.MethodPost, "/objects/none/copy", "spent", `{"to":"b"}`); r.status != 404 {
		t.Fatalf("spent's first call: %v", r)
	}
	finish := hold(t, s, g, "holder")

	// Saturated, yet spent is told about its rate, not about the overload.
	if r := put(t, s, "spent", "x"); r.status != 429 {
		t.Fatalf("spent while saturated: %v, want 429", r)
	}
	// fresh has a token: it is spent on a call refused as overloaded.
	wantError(t, put(t, s, "fresh", "x"), 503, "overloaded")
	if got := s.conc.Snapshot(); got.Rejected != 1 || got.InFlight != 1 {
		t.Fatalf("concurrency %+v, want only fresh rejected", got)
	}
	if r := finish(); r.status != 200 {
		t.Fatalf("held call: %v", r)
	}
	if r := put(t, s, "fresh", "x"); r.status != 429 {
		t.Fatalf("fresh after the overload: %v, want 429 (its token went on the refused call)", r)
	}
}
