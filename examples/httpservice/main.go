// Command httpservice is a small HTTP service whose one endpoint is guarded
// by package admission, to show the whole path: a per-client rate check
// (process-local, or shared by every replica through Redis), a concurrency
// cap, and how each refusal becomes an HTTP status.
//
//	go run ./examples/httpservice -addr 127.0.0.1:8080
//	go run ./examples/httpservice -redis redis://127.0.0.1:6379/0
//	curl -i -H 'X-Client: alice' 'http://127.0.0.1:8080/hello?name=Ada'
//
// Mapping: a saturated Concurrency ("overloaded") and a rate backend that
// could not decide ("rate_limit_unavailable") are 503; a denied rate decision
// is 429, with Retry-After only when the delay is known.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/admission"
	"github.com/runbudget/runbudget/loom"
	"github.com/runbudget/runbudget/redisstore"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	redisURL := flag.String("redis", "", "Redis URL for a rate shared by every replica (default: one rate per process)")
	perSecond := flag.Float64("rate", 5, "requests per second per client")
	burst := flag.Int("burst", 10, "burst per client")
	capacity := flag.Int("concurrency", 64, "calls served at once by this process")
	flag.Parse()

	check, closeCheck, err := rateCheck(*redisURL, admission.RatePolicy{PerSecond: *perSecond, Burst: *burst})
	if err != nil {
		log.Fatal(err)
	}
	defer closeCheck()
	h, err := newHandler(check, *capacity, hello)
	if err != nil {
		log.Fatal(err)
	}

	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Printf("listening on %s", *addr)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// rateCheck picks the rate backend: Redis when a URL is given, so replicas
// share each client's allowance, else a single process-local Rate (shared by
// all clients; a real service would keep a bounded map of them per client).
func rateCheck(url string, p admission.RatePolicy) (admission.RateCheck, func(), error) {
	if url == "" {
		r, err := admission.NewRate(p)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, _ string) (admission.RateDecision, error) { return r.Allow(ctx) }, func() {}, nil
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		// The URL may hold a password: do not echo it.
		return nil, nil, errors.New("httpservice: -redis is not a valid Redis URL")
	}
	opt.ContextTimeoutEnabled = true
	client := redis.NewClient(opt)
	check, err := redisstore.NewRateCheck(client, "httpservice:hello:", p)
	if err != nil {
		_ = client.Close()
		return nil, nil, err
	}
	return check, func() { _ = client.Close() }, nil
}

// clientKey is the context key under which the transport stores the caller's
// identity. Here it is a header, trusted as is; a real service would take it
// from its authentication.
type clientKey struct{}

// helloRequest is the endpoint's payload.
type helloRequest struct{ Name string }

// hello is the service method, free of any admission concern.
func hello(ctx context.Context, req any) (any, error) {
	return fmt.Sprintf("hello, %s\n", req.(*helloRequest).Name), nil
}

// rateLimited is the denial error the service declares (in Goa, an error in
// the design with a retry-after attribute); the transport maps it to 429.
type rateLimited struct {
	// RetryAfter is in whole seconds; zero when unknown.
	RetryAfter int64
}

func (e *rateLimited) Error() string        { return "rate limited" }
func (e *rateLimited) GoaErrorName() string { return "rate_limited" }

// newHandler wraps endpoint in rate then concurrency admission and serves it
// at /hello. The rate check runs first, so a client over its rate does not
// take a concurrency permit; the price is that a call refused as overloaded
// has already spent a token.
func newHandler(check admission.RateCheck, capacity int, endpoint loom.Endpoint) (http.Handler, error) {
	conc, err := admission.NewConcurrency(capacity)
	if err != nil {
		return nil, err
	}
	ra, err := admission.NewRateAdmission(check, 250*time.Millisecond)
	if err != nil {
		return nil, err
	}
	limit := ra.Middleware(
		func(ctx context.Context, _ any) (string, error) {
			id, ok := ctx.Value(clientKey{}).(string)
			if !ok || id == "" {
				return "", errors.New("no client identity")
			}
			return id, nil
		},
		func(d admission.RateDecision) error { return &rateLimited{RetryAfter: d.RetryAfterSeconds()} },
	)
	ep := limit(conc.Middleware(endpoint))

	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Client")
		if id == "" {
			http.Error(w, "missing X-Client", http.StatusUnauthorized)
			return
		}
		ctx := context.WithValue(r.Context(), clientKey{}, id)
		res, err := ep(ctx, &helloRequest{Name: r.URL.Query().Get("name")})
		if err != nil {
			writeError(w, err)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, res)
	})
	return mux, nil
}

// writeError maps the endpoint's errors to HTTP, the job a Goa design's
// Response(...) clauses do in generated code.
func writeError(w http.ResponseWriter, err error) {
	var limited *rateLimited
	var se *loom.ServiceError
	switch {
	case errors.As(err, &limited):
		// Retry-After only for a known delay: a guessed one would invite
		// clients to come back at the wrong time.
		if limited.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(limited.RetryAfter, 10))
		}
		http.Error(w, "rate limited", http.StatusTooManyRequests)
	case errors.As(err, &se) && se.Name == "overloaded":
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	case errors.As(err, &se) && se.Name == "rate_limit_unavailable":
		http.Error(w, "rate limit unavailable", http.StatusServiceUnavailable)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The client has gone or run out of time; nobody reads this.
		http.Error(w, "request canceled", http.StatusServiceUnavailable)
	default:
		http.Error(w, "internal error", http.StatusInternalServerError)
	}
}
