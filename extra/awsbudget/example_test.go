package awsbudget_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/extra/awsbudget"
)

// A GetObject holds its body slot until the Body is closed.
func ExampleWithBudget() {
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "object bytes")
	}))
	defer provider.Close()

	// One Budget per host; here in-process, with redisstore for a run
	// spread over hosts.
	b, err := budget.New(budget.Limits{
		InFlight:   map[budget.OpClass]int{budget.OpGet: 8},
		OpenBodies: 8,
	})
	if err != nil {
		panic(err)
	}
	defer b.Close()

	client := s3.New(s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(provider.URL),
		UsePathStyle: true,
		Credentials:  aws.AnonymousCredentials{},
	}, awsbudget.WithBudget(b))

	ctx := context.Background()
	out, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("photos"), Key: aws.String("cat.jpg")})
	if err != nil {
		panic(err)
	}
	openBodies := func() int {
		u, _ := b.Usage(ctx)
		n := 0
		for _, d := range u.Domains {
			n += d.OpenBodies
		}
		return n
	}
	data, _ := io.ReadAll(out.Body)
	fmt.Printf("read %q, open bodies: %d\n", data, openBodies())
	out.Body.Close()
	fmt.Printf("after Close, open bodies: %d\n", openBodies())
	// Output:
	// read "object bytes", open bodies: 1
	// after Close, open bodies: 0
}
