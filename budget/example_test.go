package budget_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runbudget/runbudget/budget"
)

// A source bucket's quota, as a provider adapter would name it.
var source = budget.Domain{Version: 1, ID: "s3:eu-west-1:acct-1234"}

func ExampleNew() {
	b, err := budget.New(budget.Limits{
		RequestsPerSecond: 50, // per domain; Burst left at zero: one second's worth
		InFlight:          map[budget.OpClass]int{budget.OpGet: 8, budget.OpList: 2},
		OpenBodies:        8,
		MemoryBytes:       256 << 20, // on this host
	})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	fmt.Println("burst:", b.Limits().Burst)

	// A Limits that bounds nothing is refused, so "no budget" is never
	// reached by leaving fields out.
	_, err = budget.New(budget.Limits{})
	fmt.Println(errors.Is(err, budget.ErrInvalidLimits))
	// Output:
	// burst: 50
	// true
}

// A copy lane reads one object: the GET opens a body and its content is
// buffered in memory before it is written to the destination. Each part of
// the lease is handed back the moment it is no longer needed.
func ExampleBudget_Acquire() {
	b, err := budget.New(budget.Limits{
		InFlight:    map[budget.OpClass]int{budget.OpGet: 8},
		OpenBodies:  8,
		MemoryBytes: 256 << 20,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()

	l, err := b.Acquire(ctx, budget.Request{
		Domains:     []budget.Domain{source},
		Class:       budget.OpGet,
		OpensBody:   true,
		MemoryBytes: 8 << 20,
		Consumer:    "copy-lane-3",
	})
	if err != nil {
		log.Fatal(err) // ctx ended, the budget closed, or the request can never fit
	}
	defer l.Release() // the safety net: returns whatever is still held
	show(b, "admitted")

	// ... the GET returns its headers ...
	l.CompleteRequest()
	show(b, "call returned")

	// ... the body is drained into the buffer and closed ...
	l.CloseBody()
	show(b, "body drained")

	// ... the buffer is written to the destination ...
	l.ReleaseMemory()
	show(b, "buffer written")
	// Output:
	// admitted: get in flight 1, open bodies 1, memory 8 MiB
	// call returned: get in flight 0, open bodies 1, memory 8 MiB
	// body drained: get in flight 0, open bodies 0, memory 8 MiB
	// buffer written: get in flight 0, open bodies 0, memory 0 MiB
}

// show prints what the budget holds against source.
func show(b *budget.Budget, step string) {
	u, err := b.Usage(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	var inFlight, bodies int
	for _, du := range u.Domains {
		if du.Domain == source {
			inFlight, bodies = du.InFlight[budget.OpGet], du.OpenBodies
		}
	}
	fmt.Printf("%s: get in flight %d, open bodies %d, memory %d MiB\n", step, inFlight, bodies, u.MemoryHeld>>20)
}

// The provider answered 503 SlowDown with a Retry-After header. Reporting it
// slows every consumer of the domain at once and pauses new starts for the
// time the provider asked.
func ExampleBudget_Throttle() {
	b, err := budget.New(budget.Limits{RequestsPerSecond: 100})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	fmt.Printf("before: rate factor %.1f\n", rateFactor(b, source))

	resp := &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Retry-After": {"2"}}}
	if resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests {
		secs, _ := strconv.Atoi(resp.Header.Get("Retry-After")) // 0 when absent: no pause, still slows
		if err := b.Throttle(ctx, source, time.Duration(secs)*time.Second); err != nil {
			log.Fatal(err)
		}
	}
	// Other lanes hit the same throttle a moment later: one congestion
	// event, so the rate is not cut again.
	for range 5 {
		if err := b.Throttle(ctx, source, 2*time.Second); err != nil {
			log.Fatal(err)
		}
	}

	u, err := b.Usage(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, du := range u.Domains {
		// The factor climbs back on its own over a few seconds; one decimal
		// hides the microseconds of recovery since the report.
		fmt.Printf("after: %s rate factor %.1f, paused %v\n", du.Domain, du.RateFactor, du.Paused > time.Second)
	}
	// Output:
	// before: rate factor 1.0
	// after: v1:"s3:eu-west-1:acct-1234" rate factor 0.7, paused true
}

// rateFactor returns d's rate factor; a domain Usage does not list is
// untouched, at 1.
func rateFactor(b *budget.Budget, d budget.Domain) float64 {
	u, err := b.Usage(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	for _, du := range u.Domains {
		if du.Domain == d {
			return du.RateFactor
		}
	}
	return 1
}

// Usage shows what the run holds right now: per domain, and the memory held
// across the run, which a request naming two domains charges once.
func ExampleBudget_Usage() {
	b, err := budget.New(budget.Limits{
		InFlight:    map[budget.OpClass]int{budget.OpGet: 8, budget.OpList: 2},
		MemoryBytes: 64 << 20,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()

	account := budget.Domain{Version: 1, ID: "acct-1234"}
	bucket := budget.Domain{Version: 1, ID: "acct-1234/photos"}
	list, err := b.Acquire(ctx, budget.Request{Domains: []budget.Domain{account}, Class: budget.OpList, Consumer: "enumerate"})
	if err != nil {
		log.Fatal(err)
	}
	defer list.Release()
	get, err := b.Acquire(ctx, budget.Request{
		Domains: []budget.Domain{account, bucket}, Class: budget.OpGet, MemoryBytes: 4 << 20, OpensBody: true, Consumer: "copy",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer get.Release()

	u, err := b.Usage(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, du := range u.Domains {
		fmt.Printf("%s: in flight %v, open bodies %d, rate factor %.1f\n", du.Domain, du.InFlight, du.OpenBodies, du.RateFactor)
	}
	fmt.Printf("memory held %d MiB, waiters %d\n", u.MemoryHeld>>20, u.Waiters)

	list.Release()
	get.Release()
	u, err = b.Usage(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("after release: %d domains, memory held %d, waiters %d\n", len(u.Domains), u.MemoryHeld, u.Waiters)
	// Output:
	// v1:"acct-1234": in flight map[get:1 list:1], open bodies 1, rate factor 1.0
	// v1:"acct-1234/photos": in flight map[get:1], open bodies 1, rate factor 1.0
	// memory held 4 MiB, waiters 0
	// after release: 0 domains, memory held 0, waiters 0
}

// copyObject is the README's usage example, kept here so that it compiles and
// runs; TestREADMEUsageExample keeps the two texts the same.
func copyObject(ctx context.Context) error {
	b, err := budget.New(budget.Limits{
		RequestsPerSecond: 50, // per domain
		InFlight:          map[budget.OpClass]int{budget.OpGet: 8},
		OpenBodies:        8,
		MemoryBytes:       256 << 20, // on this host
	})
	if err != nil {
		return err
	}
	defer b.Close()

	src := budget.Domain{Version: 1, ID: "s3:eu-west-1:acct-1234"}
	l, err := b.Acquire(ctx, budget.Request{
		Domains:     []budget.Domain{src},
		Class:       budget.OpGet,
		OpensBody:   true,
		MemoryBytes: 8 << 20,
		Consumer:    "copy-lane-3",
	})
	if err != nil {
		return err // ctx ended, the budget closed, or the request can never fit
	}
	defer l.Release() // returns whatever is still held

	// ... the GET returns ...
	l.CompleteRequest()
	// ... the body is drained into the buffer ...
	l.CloseBody()
	// ... the buffer is written to the destination ...
	l.ReleaseMemory()

	// The provider answered 503 SlowDown, Retry-After: 2. Every lane on src slows down.
	if err := b.Throttle(ctx, src, 2*time.Second); err != nil {
		return err
	}
	return nil
}

// A copy lane end to end: admitted, each part retired as it ends, and a
// provider throttle reported. This is the README's usage example.
func Example() {
	if err := copyObject(context.Background()); err != nil {
		log.Fatal(err)
	}
	fmt.Println("copied")
	// Output: copied
}

// TestREADMEUsageExample checks that the README's Go block is the body of
// copyObject, so the usage example people copy is code that compiles and runs.
func TestREADMEUsageExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```go\n")
	block, _, ok2 := strings.Cut(block, "\n```")
	if !ok || !ok2 {
		t.Fatal("README.md has no Go block")
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(src), "func copyObject(ctx context.Context) error {\n")
	body, _, ok2 = strings.Cut(body, "\n\treturn nil\n}")
	if !ok || !ok2 {
		t.Fatal("example_test.go has no copyObject")
	}
	lines := strings.Split(body, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	if got := strings.Join(lines, "\n"); got != block {
		t.Errorf("README.md's Go block and copyObject differ; README:\n%s\n\ncopyObject:\n%s", block, got)
	}
}
