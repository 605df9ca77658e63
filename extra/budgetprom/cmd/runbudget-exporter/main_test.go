package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// password is the Redis password of the tests: it must never appear in
// what the exporter serves or logs.
const password = "s3cret-pw-Zq9"

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// exporter runs the command until the test ends and returns its base URL
// and log.
func exporter(t *testing.T, args []string, env map[string]string) (string, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, args, func(k string) string { return env[k] }, logs, func(a net.Addr) { addr <- a })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run returned %v after cancel", err)
		}
	})
	select {
	case a := <-addr:
		return "http://" + a.String(), logs
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	return "", nil
}

// scrape gets url and parses the page; it returns the families, the raw
// page and how long the request took.
func scrape(t *testing.T, c *http.Client, url string) (map[string]*dto.MetricFamily, string, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	took := time.Since(start)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d, %v\n%s", url, resp.StatusCode, err, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing the page: %v", err)
	}
	return mfs, string(body), took
}

func gauge(t *testing.T, mfs map[string]*dto.MetricFamily, name string, pairs ...string) float64 {
	t.Helper()
next:
	for _, m := range mfs[name].GetMetric() {
		for i := 0; i+1 < len(pairs); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == pairs[i] && l.GetValue() == pairs[i+1])
			}
			if !found {
				continue next
			}
		}
		return m.GetGauge().GetValue()
	}
	t.Fatalf("no series %s%v", name, pairs)
	return 0
}

// TestExporterOverHTTP holds leases on a password-protected Redis, scrapes
// the command over HTTP and compares with Inspect; then freezes Redis (the
// scrape answers at its timeout), kills it (the scrape answers at once),
// both saying the scrape failed, and restarts it (recovery). The password
// appears nowhere.
func TestExporterOverHTTP(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, redistest.WithConfig("requirepass "+password))
	client := srv.Client(t)
	st, err := redisstore.New(client, "copy-job", redisstore.WithLeaseTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b, err := budget.New(budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 6}}, budget.WithStore(st))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	d := budget.Domain{Version: 1, ID: "bucket"}
	for range 4 {
		l, err := b.Acquire(ctx, budget.Request{Domains: []budget.Domain{d}, Class: budget.OpGet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Release)
	}
	adm, err := redisstore.NewAdmin(client)
	if err != nil {
		t.Fatal(err)
	}
	in, err := adm.Inspect(ctx, "copy-job", 0)
	if err != nil || len(in.Domains) != 1 {
		t.Fatalf("Inspect = %+v, %v", in, err)
	}

	const timeout = time.Second
	// The URL comes from the environment, as REDIS_URL.
	base, logs := exporter(t, []string{"--listen", "127.0.0.1:0", "--scrape-timeout", timeout.String()},
		map[string]string{"REDIS_URL": srv.URL()})
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)

	mfs, page, _ := scrape(t, hc, base+"/metrics")
	if got := gauge(t, mfs, "runbudget_exporter_scrape_error"); got != 0 {
		t.Fatalf("scrape_error = %v with Redis up; log:\n%s", got, logs)
	}
	dl := []string{"budget", "copy-job", "domain", d.String(), "class", "get"}
	if got, want := gauge(t, mfs, "runbudget_domain_in_flight", dl...), float64(in.Domains[0].InFlight[budget.OpGet]); got != want || got != 4 {
		t.Errorf("in flight = %v, Inspect says %v, 4 held", got, want)
	}
	if got := gauge(t, mfs, "runbudget_budget_limit_in_flight", "budget", "copy-job", "class", "get"); got != 6 {
		t.Errorf("get ceiling = %v, want 6", got)
	}
	var list []*dto.MetricFamily
	for _, mf := range mfs {
		list = append(list, mf)
	}
	problems, err := promlint.NewWithMetricFamilies(list).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}

	srv.Pause()
	mfs, _, took := scrape(t, hc, base+"/metrics")
	srv.Resume()
	if got := gauge(t, mfs, "runbudget_exporter_scrape_error"); got != 1 {
		t.Errorf("scrape_error = %v with Redis frozen", got)
	}
	if took < timeout || took > timeout+2*time.Second {
		t.Errorf("a scrape with Redis frozen took %v; want about the %v timeout", took, timeout)
	}

	srv.Kill()
	mfs, down, took := scrape(t, hc, base+"/metrics")
	if got := gauge(t, mfs, "runbudget_exporter_scrape_error"); got != 1 {
		t.Errorf("scrape_error = %v with Redis down", got)
	}
	if took > time.Second {
		t.Errorf("a scrape with Redis down took %v; a refused connection should answer at once", took)
	}
	if mfs["runbudget_domain_in_flight"] != nil {
		t.Error("domain series served while Redis is down")
	}
	if !strings.Contains(logs.String(), "scrape failed") {
		t.Errorf("no scrape failure logged:\n%s", logs)
	}

	srv.Restart(t)
	mfs, _, _ = scrape(t, hc, base+"/metrics")
	if got := gauge(t, mfs, "runbudget_exporter_scrape_error"); got != 0 {
		t.Errorf("scrape_error = %v after Redis came back; log:\n%s", got, logs)
	}
	if !strings.Contains(logs.String(), "scrape succeeded again") {
		t.Errorf("recovery not logged:\n%s", logs)
	}
	for what, text := range map[string]string{"page": page, "page with Redis down": down, "log": logs.String()} {
		if strings.Contains(text, password) {
			t.Errorf("the Redis password appears in the %s", what)
		}
	}
	if !strings.Contains(logs.String(), srv.Addr()) {
		t.Errorf("the log does not name the Redis address:\n%s", logs)
	}
}

// TestBadURLsHideThePassword: every way a URL can be wrong gives an error
// without its credentials.
func TestBadURLsHideThePassword(t *testing.T) {
	for _, raw := range []string{
		"redis://:" + password + "@localhost:notaport/0",              // url.Parse fails and quotes its input
		"redis//:" + password + "@localhost",                          // no scheme
		"http://user:" + password + "@localhost",                      // wrong scheme
		"redis://:" + password + "@localhost/notanumber",              // go-redis refuses the database
		"redis://:" + password + "@localhost/0?pool_size=" + password, // an option holding it
		"redis://:s3cret%2Dpw%2DZq9@localhost:x",                      // escaped, and unparsable
	} {
		var logs syncBuffer
		err := run(context.Background(), []string{"--redis", raw, "--listen", "127.0.0.1:0"}, func(string) string { return "" }, &logs, nil)
		if err == nil {
			t.Errorf("%q accepted", raw)
			continue
		}
		if strings.Contains(err.Error(), password) || strings.Contains(logs.String(), password) {
			t.Errorf("the password leaks for a bad URL: %v\n%s", err, logs.String())
		}
	}
}

func TestURLSecrets(t *testing.T) {
	got := urlSecrets("rediss://user:p%40ss@host:6380/0?sentinel_password=other")
	for _, want := range []string{"p%40ss", "p@ss", "other"} {
		found := false
		for _, g := range got {
			found = found || g == want
		}
		if !found {
			t.Errorf("urlSecrets missed %q: %q", want, got)
		}
	}
	red := redactor(got)
	if s := red("auth p@ss and p%40ss, other"); strings.Contains(s, "p@ss") || strings.Contains(s, "other") || strings.Contains(s, "p%40ss") {
		t.Errorf("redacted text still holds a secret: %q", s)
	}
	if s := urlSecrets("redis://localhost:6379/0"); len(s) != 0 {
		t.Errorf("secrets found in a URL without any: %q", s)
	}
}

func TestFlagErrors(t *testing.T) {
	noenv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no Redis given"},
		{[]string{"--redis", "redis://localhost", "extra"}, "unexpected arguments"},
		{[]string{"--redis", "redis://localhost", "--scrape-timeout", "0s"}, "must be positive"},
		{[]string{"--redis", "redis://localhost", "--path", "metrics"}, "must start with /"},
	} {
		err := run(context.Background(), tc.args, noenv, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
	if err := run(context.Background(), []string{"--help"}, noenv, io.Discard, nil); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help = %v, want flag.ErrHelp", err)
	}
}
