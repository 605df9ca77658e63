package httpbudget_test

import (
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/httpbudget"
)

// throttleCase runs one request against a server answering status with
// Retry-After value (none when absent) and checks the pause the budget took,
// that the domain was throttled, and that the response came back intact.
func TestThrottleRetryAfter(t *testing.T) {
	future := func(d time.Duration) func() string {
		return func() string { return time.Now().Add(d).UTC().Format(http.TimeFormat) }
	}
	fixed := func(s string) func() string { return func() string { return s } }
	for _, tc := range []struct {
		name       string
		status     int
		value      func() string // nil: no Retry-After header
		maxPause   time.Duration
		minP, maxP time.Duration // the pause Usage reports lies in (minP, maxP]
		throttled  bool
	}{
		{name: "429 delta", status: 429, value: fixed("2"), minP: time.Second, maxP: 2 * time.Second, throttled: true},
		{name: "503 delta", status: 503, value: fixed("3"), minP: 2 * time.Second, maxP: 3 * time.Second, throttled: true},
		{name: "429 HTTP-date", status: 429, value: future(10 * time.Second), minP: 7 * time.Second, maxP: 10 * time.Second, throttled: true},
		{name: "503 past date", status: 503, value: fixed("Sun, 06 Nov 1994 08:49:37 GMT"), throttled: true},
		{name: "429 malformed", status: 429, value: fixed("soon"), throttled: true},
		{name: "429 negative", status: 429, value: fixed("-5"), throttled: true},
		{name: "503 absent", status: 503, throttled: true},
		{name: "429 huge delta capped by the default", status: 429, value: fixed("99999999999999999999"),
			minP: httpbudget.DefaultMaxPause - 5*time.Second, maxP: httpbudget.DefaultMaxPause, throttled: true},
		{name: "429 far date capped by the default", status: 429, value: fixed("Fri, 31 Dec 9999 23:59:59 GMT"),
			minP: httpbudget.DefaultMaxPause - 5*time.Second, maxP: httpbudget.DefaultMaxPause, throttled: true},
		{name: "429 capped by MaxPause", status: 429, value: fixed("60"), maxPause: 3 * time.Second,
			minP: 2 * time.Second, maxP: 3 * time.Second, throttled: true},
		{name: "429 MaxPause above the default", status: 429, value: fixed("45"), maxPause: time.Minute,
			minP: 40 * time.Second, maxP: 45 * time.Second, throttled: true},
		{name: "429 negative MaxPause never pauses", status: 429, value: fixed("60"), maxPause: -1, throttled: true},
		{name: "200 with Retry-After is no throttle", status: 200, value: fixed("60")},
		{name: "500 is no throttle", status: 500, value: fixed("60")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBudget(t, getSlots(2))
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Provider", "kept")
				if tc.value != nil {
					w.Header().Set("Retry-After", tc.value())
				}
				w.WriteHeader(tc.status)
				io.WriteString(w, "provider says: slow down")
			})
			var hookErr error
			client := newClient(t, &httpbudget.Transport{Budget: b, MaxPause: tc.maxPause,
				ThrottleError: func(_ *http.Request, _ budget.Domain, err error) { hookErr = err }})
			resp, err := client.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			if hookErr != nil {
				t.Errorf("ThrottleError: %v", hookErr)
			}
			if resp.StatusCode != tc.status || resp.Header.Get("X-Provider") != "kept" ||
				(tc.value != nil && resp.Header.Get("Retry-After") == "") {
				t.Errorf("response changed: status %d, header %v", resp.StatusCode, resp.Header)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(got) != "provider says: slow down" {
				t.Errorf("body %q, %v", got, err)
			}

			du := domainUsage(t, b, srv.domain(t))
			if tc.throttled != (du.RateFactor < 1) {
				t.Errorf("rate factor %v; throttled should be %v", du.RateFactor, tc.throttled)
			}
			if tc.maxP == 0 {
				if du.Paused != 0 {
					t.Errorf("paused %v; want none", du.Paused)
				}
			} else if du.Paused <= tc.minP || du.Paused > tc.maxP {
				t.Errorf("paused %v; want in (%v, %v]", du.Paused, tc.minP, tc.maxP)
			}
			holdsNothing(t, b)
		})
	}
}

// A request on several domains throttles each of them, once per distinct
// domain, and leaves other domains alone.
func TestThrottleEveryDomain(t *testing.T) {
	b := newBudget(t, getSlots(2))
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "4")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	host := srv.domain(t)
	account := budget.Domain{Version: 1, ID: "account:42"}
	other := budget.Domain{Version: 1, ID: "account:7"}
	var mu sync.Mutex
	var failed []budget.Domain
	client := newClient(t, &httpbudget.Transport{
		Budget: b,
		Request: func(r *http.Request) (budget.Request, error) {
			req, err := httpbudget.DefaultRequest(r)
			req.Domains = append(req.Domains, account, account, host)
			return req, err
		},
		ThrottleError: func(_ *http.Request, d budget.Domain, _ error) {
			mu.Lock()
			failed = append(failed, d)
			mu.Unlock()
		},
	})
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("status %d", resp.StatusCode)
	}
	for _, d := range []budget.Domain{host, account} {
		du := domainUsage(t, b, d)
		if du.RateFactor >= 1 || du.Paused <= 3*time.Second || du.Paused > 4*time.Second {
			t.Errorf("%v: factor %v, paused %v; want throttled with a pause of about 4s", d, du.RateFactor, du.Paused)
		}
	}
	if du := domainUsage(t, b, other); du.RateFactor != 1 || du.Paused != 0 {
		t.Errorf("%v (not in the request): factor %v, paused %v; want untouched", other, du.RateFactor, du.Paused)
	}
	if len(failed) != 0 {
		t.Errorf("throttle reports failed for %v", failed)
	}
	holdsNothing(t, b)
}

// A custom classifier replaces the default one entirely.
func TestCustomThrottleClassifier(t *testing.T) {
	for _, tc := range []struct {
		status    int
		header    string
		throttled bool
	}{
		{400, "SlowDown", true},
		{400, "", false},
		{429, "", false}, // the custom classifier does not call IsThrottle
		{503, "", true},  // it does for 503
	} {
		b := newBudget(t, getSlots(1))
		srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			if tc.header != "" {
				w.Header().Set("X-Error-Code", tc.header)
			}
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(tc.status)
		})
		client := newClient(t, &httpbudget.Transport{Budget: b, Throttled: func(r *http.Response) bool {
			return r.Header.Get("X-Error-Code") == "SlowDown" ||
				(r.StatusCode == http.StatusServiceUnavailable && httpbudget.IsThrottle(r))
		}})
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if du := domainUsage(t, b, srv.domain(t)); (du.RateFactor < 1) != tc.throttled {
			t.Errorf("status %d, code %q: factor %v; throttled should be %v", tc.status, tc.header, du.RateFactor, tc.throttled)
		}
		holdsNothing(t, b)
	}
}

func TestIsThrottle(t *testing.T) {
	for code, want := range map[int]bool{200: false, 400: false, 429: true, 500: false, 502: false, 503: true, 504: false} {
		if got := httpbudget.IsThrottle(&http.Response{StatusCode: code}); got != want {
			t.Errorf("IsThrottle(%d) = %v; want %v", code, got, want)
		}
	}
}

// A throttle report that fails goes to ThrottleError, once per distinct
// domain, and the provider's response still reaches the caller. The budget is closed under the request,
// between admission and response, so Throttle fails with ErrClosed.
func TestThrottleErrorKeepsResponse(t *testing.T) {
	b, err := budget.New(getSlots(1))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, "throttled")
	})
	type report struct {
		req *http.Request
		d   budget.Domain
		err error
	}
	var reports []report
	account := budget.Domain{Version: 1, ID: "account:42"}
	client := newClient(t, &httpbudget.Transport{
		Budget: b,
		Request: func(r *http.Request) (budget.Request, error) {
			req, err := httpbudget.DefaultRequest(r)
			req.Domains = append(req.Domains, account, account, req.Domains[0])
			return req, err
		},
		ThrottleError: func(r *http.Request, d budget.Domain, err error) {
			reports = append(reports, report{r, d, err})
		},
	})
	req, _ := http.NewRequestWithContext(ctxFor(t), http.MethodGet, srv.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("Do: %v; the response must survive a failed throttle report", err)
	}
	got, _ := io.ReadAll(resp.Body)
	if err := resp.Body.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if resp.StatusCode != http.StatusTooManyRequests || string(got) != "throttled" {
		t.Errorf("response %d %q", resp.StatusCode, got)
	}
	// One report per distinct domain, however often the request names it.
	want := []budget.Domain{account, srv.domain(t)}
	if len(reports) != len(want) {
		t.Fatalf("reports %+v; want one ErrClosed for each of %v", reports, want)
	}
	for i, r := range reports {
		if r.req != req || r.d != want[i] || !errors.Is(r.err, budget.ErrClosed) {
			t.Errorf("report %d: %v, %v; want %v, ErrClosed", i, r.d, r.err, want[i])
		}
	}
}
