package httpbudget_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/httpbudget"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newBudget is an in-process budget closed at cleanup.
func newBudget(t *testing.T, l budget.Limits) *budget.Budget {
	t.Helper()
	b, err := budget.New(l)
	if err != nil {
		t.Fatalf("budget.New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func getSlots(n int) budget.Limits {
	return budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: n}, OpenBodies: n}
}

// newClient is a client whose Transport runs through b over a private
// http.Transport, whose idle connections are closed at cleanup (so goleak
// sees none of its goroutines).
func newClient(t *testing.T, tr *httpbudget.Transport) *http.Client {
	t.Helper()
	if tr.Base == nil {
		base := &http.Transport{}
		t.Cleanup(base.CloseIdleConnections)
		tr.Base = base
	}
	return &http.Client{Transport: tr}
}

// server is an httptest server counting the requests that reached it.
type server struct {
	*httptest.Server
	hits atomic.Int64
}

func newServer(t *testing.T, h http.HandlerFunc) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		h(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) domain(t *testing.T) budget.Domain {
	t.Helper()
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	return httpbudget.HostDomain(u.Host)
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func usage(t *testing.T, b *budget.Budget) budget.Usage {
	t.Helper()
	u, err := b.Usage(ctxFor(t))
	if err != nil {
		t.Fatalf("Usage: %v", err)
	}
	return u
}

// domainUsage is d's entry in b's usage, zero when d holds nothing.
func domainUsage(t *testing.T, b *budget.Budget, d budget.Domain) budget.DomainUsage {
	t.Helper()
	for _, du := range usage(t, b).Domains {
		if du.Domain == d {
			return du
		}
	}
	return budget.DomainUsage{Domain: d, RateFactor: 1}
}

// holdsNothing fails unless no domain of b has a request in flight, an open
// body or a waiter, and no memory is held. Throttled domains may still be
// listed while their rate recovers.
func holdsNothing(t *testing.T, b *budget.Budget) {
	t.Helper()
	u := usage(t, b)
	if u.MemoryHeld != 0 || u.Waiters != 0 {
		t.Errorf("usage: memory %d, waiters %d; want none", u.MemoryHeld, u.Waiters)
	}
	for _, du := range u.Domains {
		if len(du.InFlight) != 0 || du.OpenBodies != 0 || du.Waiters != 0 {
			t.Errorf("usage of %v: in flight %v, open bodies %d, waiters %d; want none",
				du.Domain, du.InFlight, du.OpenBodies, du.Waiters)
		}
	}
}

// eventually polls cond (a condition on state the test cannot be notified
// of, such as a waiter queued inside the budget) until it holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestSlotsEndInSteps(t *testing.T) {
	b := newBudget(t, getSlots(4))
	arrived, headers, finish := make(chan struct{}), make(chan struct{}), make(chan struct{})
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-headers
		io.WriteString(w, "first half;")
		w.(http.Flusher).Flush()
		<-finish
		io.WriteString(w, "second half")
	})
	d := srv.domain(t)
	client := newClient(t, &httpbudget.Transport{Budget: b})

	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := client.Get(srv.URL)
		done <- result{resp, err}
	}()

	<-arrived
	if du := domainUsage(t, b, d); du.InFlight[budget.OpGet] != 1 || du.OpenBodies != 1 {
		t.Errorf("while the request is at the server: in flight %v, open bodies %d; want get 1, body 1", du.InFlight, du.OpenBodies)
	}
	close(headers)
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if du := domainUsage(t, b, d); len(du.InFlight) != 0 || du.OpenBodies != 1 {
		t.Errorf("after the headers: in flight %v, open bodies %d; want none, body 1", du.InFlight, du.OpenBodies)
	}

	close(finish)
	got, err := io.ReadAll(res.resp.Body)
	if err != nil || string(got) != "first half;second half" {
		t.Fatalf("body %q, %v", got, err)
	}
	if du := domainUsage(t, b, d); du.OpenBodies != 1 {
		t.Errorf("after EOF, before Close: open bodies %d; want 1 (the slot ends at Close)", du.OpenBodies)
	}
	if err := res.resp.Body.Close(); err != nil {
		t.Fatal(err)
	}
	if u := usage(t, b); len(u.Domains) != 0 || u.MemoryHeld != 0 || u.Waiters != 0 {
		t.Errorf("after Close: usage %+v; want zero", u)
	}
	if err := res.resp.Body.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	holdsNothing(t, b)
}

// Requests without a body slot end their lease with the headers.
func TestNoBodySlot(t *testing.T) {
	b := newBudget(t, budget.Limits{InFlight: map[budget.OpClass]int{
		budget.OpHead: 1, budget.OpPut: 1, budget.OpDelete: 1,
	}})
	var gotBody atomic.Value
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		p, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPut {
			gotBody.Store(string(p))
		}
		io.WriteString(w, "ok")
	})
	client := newClient(t, &httpbudget.Transport{Budget: b})
	for _, m := range []string{http.MethodHead, http.MethodPut, http.MethodPost, http.MethodPatch, http.MethodDelete} {
		req, err := http.NewRequestWithContext(ctxFor(t), m, srv.URL, strings.NewReader("payload"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		if u := usage(t, b); len(u.Domains) != 0 {
			t.Errorf("%s before Close: usage %+v; want zero", m, u)
		}
		resp.Body.Close()
	}
	if got := gotBody.Load(); got != "payload" {
		t.Errorf("PUT body at the server: %v", got)
	}
}

// Closing one body from many goroutines at once releases the lease once.
func TestBodyCloseConcurrent(t *testing.T) {
	b := newBudget(t, getSlots(1))
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "x") })
	client := newClient(t, &httpbudget.Transport{Budget: b})
	for range 3 {
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				if err := resp.Body.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
		}
		wg.Wait()
		if u := usage(t, b); len(u.Domains) != 0 {
			t.Fatalf("after Close: usage %+v; want zero", u)
		}
	}
}

// The caller's retry is a new round trip, and a new admission: with one GET
// slot, a second attempt waits until the first attempt's body is closed.
func TestEachRoundTripAdmitted(t *testing.T) {
	b := newBudget(t, getSlots(1))
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	})
	client := newClient(t, &httpbudget.Transport{Budget: b})
	first, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxFor(t))
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	retried := make(chan error, 1)
	go func() {
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		retried <- err
	}()
	eventually(t, "the retry to queue", func() bool { return usage(t, b).Waiters == 1 })
	if n := srv.hits.Load(); n != 1 {
		t.Errorf("server saw %d requests while the retry waited; want 1", n)
	}
	first.Body.Close()
	if err := <-retried; err != nil {
		t.Fatalf("retry: %v", err)
	}
	cancel()
	if n := srv.hits.Load(); n != 2 {
		t.Errorf("server saw %d requests; want 2", n)
	}
	holdsNothing(t, b)
}

func TestCancelWhileWaitingSendsNothing(t *testing.T) {
	b := newBudget(t, getSlots(1))
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "x") })
	client := newClient(t, &httpbudget.Transport{Budget: b})

	holder, err := client.Get(srv.URL) // holds the only slot until its body is closed
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxFor(t))
	body := &trackedBody{Reader: strings.NewReader("never sent")}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL, nil)
	req.Body = body
	tr := &httpbudget.Transport{Budget: b, Base: client.Transport.(*httpbudget.Transport).Base,
		Request: func(r *http.Request) (budget.Request, error) {
			return budget.Request{Domains: []budget.Domain{srv.domain(t)}, Class: budget.OpGet, OpensBody: true}, nil
		}}
	errc := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	eventually(t, "the request to queue", func() bool { return usage(t, b).Waiters == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("RoundTrip after cancel: %v; want context.Canceled", err)
	}
	if n := srv.hits.Load(); n != 1 {
		t.Errorf("server saw %d requests; want 1 (the cancelled one must not be sent)", n)
	}
	if !body.closed.Load() {
		t.Error("request body not closed after the cancelled round trip")
	}
	// The Budget takes a cancelled waiter out of its store in the
	// background (Budget.abandon): a slot freed before that would be
	// granted to it and given back a moment later, so the holder lets go
	// only once the line is empty.
	eventually(t, "the cancelled request to leave the line", func() bool { return usage(t, b).Waiters == 0 })
	holder.Body.Close()
	holdsNothing(t, b)

	// A context that ended before the call sends nothing either.
	req2, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if _, err := client.Do(req2); !errors.Is(err, context.Canceled) {
		t.Errorf("Do with a cancelled context: %v; want context.Canceled", err)
	}
	if n := srv.hits.Load(); n != 1 {
		t.Errorf("server saw %d requests; want 1", n)
	}
	holdsNothing(t, b)
}

// trackedBody records that it was closed.
type trackedBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *trackedBody) Close() error { b.closed.Store(true); return nil }

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestErrorPathsReleaseEverything(t *testing.T) {
	errMap := errors.New("no mapping")
	errBase := errors.New("connection refused (test)")
	target := budget.Domain{Version: 1, ID: "http:provider.test"}
	get := func(*http.Request) (budget.Request, error) {
		return budget.Request{Domains: []budget.Domain{target}, Class: budget.OpGet, OpensBody: true, MemoryBytes: 10}, nil
	}
	limits := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}, OpenBodies: 1, MemoryBytes: 100}
	for _, tc := range []struct {
		name    string
		tr      func(b *budget.Budget, sent *atomic.Int64) *httpbudget.Transport
		want    error
		closeB  bool // close the budget first
		nilBudg bool
	}{
		{name: "request func error", want: errMap, tr: func(b *budget.Budget, _ *atomic.Int64) *httpbudget.Transport {
			return &httpbudget.Transport{Budget: b, Request: func(*http.Request) (budget.Request, error) { return budget.Request{}, errMap }}
		}},
		{name: "invalid request", want: budget.ErrInvalidRequest, tr: func(b *budget.Budget, _ *atomic.Int64) *httpbudget.Transport {
			return &httpbudget.Transport{Budget: b, Request: func(*http.Request) (budget.Request, error) {
				return budget.Request{Class: budget.OpGet}, nil // no domains
			}}
		}},
		{name: "never admissible", want: budget.ErrNeverAdmissible, tr: func(b *budget.Budget, _ *atomic.Int64) *httpbudget.Transport {
			return &httpbudget.Transport{Budget: b, Request: func(*http.Request) (budget.Request, error) {
				return budget.Request{Domains: []budget.Domain{target}, Class: budget.OpGet, MemoryBytes: 1000}, nil
			}}
		}},
		{name: "default mapping refuses the method", want: budget.ErrInvalidRequest, tr: func(b *budget.Budget, _ *atomic.Int64) *httpbudget.Transport {
			return &httpbudget.Transport{Budget: b, Base: roundTripFunc(func(*http.Request) (*http.Response, error) {
				panic("sent a request the mapping refused")
			})}
		}},
		{name: "budget closed", want: budget.ErrClosed, closeB: true, tr: func(b *budget.Budget, _ *atomic.Int64) *httpbudget.Transport {
			return &httpbudget.Transport{Budget: b, Request: get}
		}},
		{name: "no budget", want: httpbudget.ErrNoBudget, nilBudg: true, tr: func(b *budget.Budget, _ *atomic.Int64) *httpbudget.Transport {
			return &httpbudget.Transport{Request: get}
		}},
		{name: "base error", want: errBase, tr: func(b *budget.Budget, sent *atomic.Int64) *httpbudget.Transport {
			return &httpbudget.Transport{Budget: b, Request: get, Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				sent.Add(1)
				r.Body.Close() // as the contract asks of a base
				return nil, errBase
			})}
		}},
		{name: "base response and error", want: errBase, tr: func(b *budget.Budget, sent *atomic.Int64) *httpbudget.Transport {
			return &httpbudget.Transport{Budget: b, Request: get, Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				sent.Add(1)
				r.Body.Close()
				return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(""))}, errBase
			})}
		}},
		{name: "nil response", want: httpbudget.ErrNilResponse, tr: func(b *budget.Budget, sent *atomic.Int64) *httpbudget.Transport {
			return &httpbudget.Transport{Budget: b, Request: get, Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				sent.Add(1)
				r.Body.Close()
				return nil, nil
			})}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBudget(t, limits)
			if tc.closeB {
				b.Close()
			}
			var sent atomic.Int64
			tr := tc.tr(b, &sent)
			body := &trackedBody{Reader: strings.NewReader("data")}
			method := http.MethodGet
			if tc.name == "default mapping refuses the method" {
				method = http.MethodOptions
			}
			req, _ := http.NewRequestWithContext(ctxFor(t), method, "http://provider.test/object", body)
			resp, err := tr.RoundTrip(req)
			if !errors.Is(err, tc.want) {
				t.Errorf("RoundTrip: %v; want %v", err, tc.want)
			}
			if resp != nil {
				t.Errorf("RoundTrip returned a response with error %v", err)
			}
			if !body.closed.Load() {
				t.Error("request body left open")
			}
			if !tc.closeB && !tc.nilBudg {
				if u := usage(t, b); len(u.Domains) != 0 || u.MemoryHeld != 0 {
					t.Fatalf("usage after the error: %+v; want zero", u)
				}
				// The slot is free again: a good round trip goes through.
				ok := &httpbudget.Transport{Budget: b, Request: get, Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
					return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
				})}
				req, _ := http.NewRequestWithContext(ctxFor(t), http.MethodGet, "http://provider.test/object", nil)
				resp, err := ok.RoundTrip(req)
				if err != nil {
					t.Fatalf("round trip after the error: %v", err)
				}
				resp.Body.Close()
				holdsNothing(t, b)
			}
		})
	}
}

// A real network failure from http.Transport (the server drops the
// connection) releases the lease.
func TestConnectionDropReleases(t *testing.T) {
	b := newBudget(t, getSlots(1))
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		conn.Close()
	})
	client := newClient(t, &httpbudget.Transport{Budget: b})
	if _, err := client.Get(srv.URL); err == nil {
		t.Fatal("Get succeeded on a dropped connection")
	}
	holdsNothing(t, b)
	if u := usage(t, b); len(u.Domains) != 0 {
		t.Errorf("usage %+v; want zero", u)
	}
}

// The transport does not modify the request it was given.
func TestRequestUnmodified(t *testing.T) {
	b := newBudget(t, getSlots(1))
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "x") })
	client := newClient(t, &httpbudget.Transport{Budget: b})
	req, _ := http.NewRequestWithContext(ctxFor(t), http.MethodGet, srv.URL+"/a?b=c", nil)
	req.Header.Set("X-Trace", "1")
	header, u := req.Header.Clone(), *req.URL
	resp, err := client.Transport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !maps.EqualFunc(header, req.Header, func(a, b []string) bool { return strings.Join(a, "\n") == strings.Join(b, "\n") }) || *req.URL != u {
		t.Errorf("request changed: header %v, URL %v", req.Header, req.URL)
	}
	if resp.Request != req {
		t.Error("response does not point at the caller's request")
	}
}

// An upgraded connection (101) comes back writable, and closing it ends the
// lease.
func TestSwitchingProtocolsStaysWritable(t *testing.T) {
	b := newBudget(t, getSlots(1))
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		rw.Flush()
		line, err := rw.ReadString('\n')
		if err != nil {
			return
		}
		rw.WriteString(line)
		rw.Flush()
	})
	client := newClient(t, &httpbudget.Transport{Budget: b})
	req, _ := http.NewRequestWithContext(ctxFor(t), http.MethodGet, srv.URL, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d", resp.StatusCode)
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		t.Fatalf("body %T is not an io.ReadWriteCloser", resp.Body)
	}
	if _, err := io.WriteString(rwc, "ping\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(rwc).ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("echo %q, %v", line, err)
	}
	if du := domainUsage(t, b, srv.domain(t)); du.OpenBodies != 1 {
		t.Errorf("open bodies %d while upgraded; want 1", du.OpenBodies)
	}
	rwc.Close()
	holdsNothing(t, b)
}

func TestDefaultRequest(t *testing.T) {
	for _, tc := range []struct {
		method, url string
		class       budget.OpClass
		body        bool
		id          string
	}{
		{http.MethodGet, "https://Bucket.Example.COM/key", budget.OpGet, true, "http:bucket.example.com"},
		{"", "http://example.com:8080/", budget.OpGet, true, "http:example.com:8080"},
		{http.MethodHead, "http://example.com/", budget.OpHead, false, "http:example.com"},
		{http.MethodPut, "http://example.com/", budget.OpPut, false, "http:example.com"},
		{http.MethodPost, "http://example.com/", budget.OpPut, false, "http:example.com"},
		{http.MethodPatch, "http://example.com/", budget.OpPut, false, "http:example.com"},
		{http.MethodDelete, "http://[::1]:9000/", budget.OpDelete, false, "http:[::1]:9000"},
		{http.MethodGet, "http://example.com:443/", budget.OpGet, true, "http:example.com:443"},
	} {
		req, err := http.NewRequest(tc.method, tc.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := httpbudget.DefaultRequest(req)
		if err != nil {
			t.Errorf("%s %s: %v", tc.method, tc.url, err)
			continue
		}
		want := budget.Domain{Version: 1, ID: tc.id}
		if got.Class != tc.class || got.OpensBody != tc.body || len(got.Domains) != 1 || got.Domains[0] != want ||
			got.MemoryBytes != 0 {
			t.Errorf("%s %s: %+v; want class %s, body %v, domain %v", tc.method, tc.url, got, tc.class, tc.body, want)
		}
	}
	for _, tc := range []struct {
		name string
		req  *http.Request
		want error
	}{
		{"OPTIONS", &http.Request{Method: http.MethodOptions, URL: &url.URL{Host: "example.com"}}, budget.ErrInvalidRequest},
		{"CONNECT", &http.Request{Method: http.MethodConnect, URL: &url.URL{Host: "example.com"}}, budget.ErrInvalidRequest},
		{"TRACE", &http.Request{Method: http.MethodTrace, URL: &url.URL{Host: "example.com"}}, budget.ErrInvalidRequest},
		{"lower-case get", &http.Request{Method: "get", URL: &url.URL{Host: "example.com"}}, budget.ErrInvalidRequest},
		{"no host", &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/x"}}, budget.ErrInvalidRequest},
		{"no URL", &http.Request{Method: http.MethodGet}, budget.ErrInvalidRequest},
		{"invalid UTF-8 host", &http.Request{Method: http.MethodGet, URL: &url.URL{Host: "\xff"}}, budget.ErrInvalidDomain},
	} {
		if _, err := httpbudget.DefaultRequest(tc.req); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v; want %v", tc.name, err, tc.want)
		}
	}
}

// cancelCtx is a cancellable context, cancelled at cleanup at the latest.
func cancelCtx(t *testing.T) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctxFor(t))
	t.Cleanup(cancel)
	return ctx, cancel
}

// Each redirect hop is its own round trip and admission; with one GET slot
// the chain still completes, because the client closes each hop's body
// before it sends the next.
func TestRedirectHopsAdmittedOneByOne(t *testing.T) {
	b := newBudget(t, getSlots(1))
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/a":
			http.Redirect(w, r, "/b", http.StatusFound)
		case "/b":
			http.Redirect(w, r, "/c", http.StatusFound)
		default:
			io.WriteString(w, "arrived")
		}
	})
	client := newClient(t, &httpbudget.Transport{Budget: b})
	req, _ := http.NewRequestWithContext(ctxFor(t), http.MethodGet, srv.URL+"/a", nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	if string(got) != "arrived" || resp.Request.URL.Path != "/c" {
		t.Errorf("final response %q at %s", got, resp.Request.URL.Path)
	}
	if du := domainUsage(t, b, srv.domain(t)); du.OpenBodies != 1 {
		t.Errorf("open bodies %d before the last Close; want 1 (earlier hops closed)", du.OpenBodies)
	}
	resp.Body.Close()
	if n := srv.hits.Load(); n != 3 {
		t.Errorf("server saw %d requests; want 3 hops", n)
	}
	holdsNothing(t, b)
}

// A request that reserves memory but opens no body keeps the reservation
// until the body is closed: the buffer it stands for is filled from the body.
func TestMemoryHeldUntilClose(t *testing.T) {
	b := newBudget(t, budget.Limits{InFlight: map[budget.OpClass]int{budget.OpHead: 1}, MemoryBytes: 1 << 20})
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "x") })
	client := newClient(t, &httpbudget.Transport{Budget: b, Request: func(r *http.Request) (budget.Request, error) {
		req, err := httpbudget.DefaultRequest(r)
		req.Class, req.OpensBody, req.MemoryBytes = budget.OpHead, false, 4096
		return req, err
	}})
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	u := usage(t, b)
	if u.MemoryHeld != 4096 {
		t.Errorf("memory held %d before Close; want 4096", u.MemoryHeld)
	}
	for _, du := range u.Domains {
		if len(du.InFlight) != 0 || du.OpenBodies != 0 {
			t.Errorf("%v: in flight %v, bodies %d after the headers; want none", du.Domain, du.InFlight, du.OpenBodies)
		}
	}
	resp.Body.Close()
	if u := usage(t, b); u.MemoryHeld != 0 || len(u.Domains) != 0 {
		t.Errorf("usage after Close %+v; want zero", u)
	}
}
