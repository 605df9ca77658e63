package httpbudget_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/httpbudget"
)

// A client whose every request draws on one budget: here an in-process one
// with two GETs in flight and two open bodies per host; with a
// redisstore.Store, every host of a run shares the same ceilings.
func ExampleTransport() {
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "object bytes")
	}))
	defer provider.Close()

	b, err := budget.New(budget.Limits{
		InFlight:   map[budget.OpClass]int{budget.OpGet: 2},
		OpenBodies: 2,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	base := &http.Transport{}
	defer base.CloseIdleConnections()
	client := &http.Client{Transport: &httpbudget.Transport{
		Base:   base,
		Budget: b, // Request left nil: httpbudget.DefaultRequest, one domain per host
	}}

	resp, err := client.Get(provider.URL + "/bucket/key")
	if err != nil {
		log.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		log.Fatal(err)
	}
	u, _ := b.Usage(context.Background())
	fmt.Println(resp.Status, string(body))
	fmt.Println("open bodies before Close:", u.Domains[0].OpenBodies)

	resp.Body.Close() // ends the GET's body slot
	u, _ = b.Usage(context.Background())
	fmt.Println("domains in use after Close:", len(u.Domains))
	// Output:
	// 200 OK object bytes
	// open bodies before Close: 1
	// domains in use after Close: 0
}
