// Package copyjob is the copy job that the integration test and the s3copy
// example run: hosts that each list a source bucket and copy their share of
// it to a destination over lanes, one object at a time, the way a real job
// spreads work. It is kept apart so both measure the same thing.
package copyjob

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// Job describes one copy run.
type Job struct {
	// Hosts are the clients, one per simulated host; host i copies the keys
	// whose hash falls on it.
	Hosts []*s3.Client
	// Lanes is the number of concurrent copies per host.
	Lanes int
	// Src and Dst are the buckets.
	Src, Dst string
	// Prefix restricts the listing of Src.
	Prefix string
	// ServerSide picks the keys copied with CopyObject; the others are read
	// with GetObject and written with PutObject. Nil: all client-side.
	ServerSide func(key string) bool
}

// Result is what a run did.
type Result struct {
	Listed   int           // keys found in the source listings
	Copied   int           // objects whose copy succeeded
	Failed   int           // objects whose copy failed (after the SDK's retries)
	Duration time.Duration // from start to the last lane's end
	// Errors holds the first few failures, for the report.
	Errors []error
}

const keptErrors = 5

// Run lists Src on every host and copies each host's share of the keys. It
// fails an object when its copy fails and carries on with the next, as a
// job does once the SDK's retries are spent; a failed listing fails the
// whole share of that host, counted in Errors but not in Failed (its keys
// are unknown): compare Listed with what was seeded. It returns once every
// lane has ended.
func Run(ctx context.Context, job Job) Result {
	start := time.Now()
	var (
		listed, copied, failed atomic.Int64
		mu                     sync.Mutex
		errs                   []error
	)
	record := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if len(errs) < keptErrors {
			errs = append(errs, err)
		}
	}
	var wg sync.WaitGroup
	for h, client := range job.Hosts {
		wg.Go(func() {
			keys, err := list(ctx, client, job.Src, job.Prefix, h, len(job.Hosts))
			listed.Add(int64(len(keys)))
			if err != nil {
				record(fmt.Errorf("host %d: list: %w", h, err))
			}
			work := make(chan string)
			var lanes sync.WaitGroup
			for range max(job.Lanes, 1) {
				lanes.Go(func() {
					for k := range work {
						if err := copyOne(ctx, client, job, k); err != nil {
							failed.Add(1)
							record(fmt.Errorf("host %d: %s: %w", h, k, err))
							continue
						}
						copied.Add(1)
					}
				})
			}
			for _, k := range keys {
				work <- k
			}
			close(work)
			lanes.Wait()
		})
	}
	wg.Wait()
	return Result{
		Listed:   int(listed.Load()),
		Copied:   int(copied.Load()),
		Failed:   int(failed.Load()),
		Duration: time.Since(start),
		Errors:   errs,
	}
}

// Owner returns the host (of n) that copies key.
func Owner(key string, n int) int {
	h := fnv.New32a()
	io.WriteString(h, key)
	return int(h.Sum32() % uint32(n))
}

func list(ctx context.Context, c *s3.Client, bucket, prefix string, host, hosts int) ([]string, error) {
	var keys []string
	p := s3.NewListObjectsV2Paginator(c, &s3.ListObjectsV2Input{
		Bucket: aws.String(bucket), Prefix: aws.String(prefix), MaxKeys: aws.Int32(100),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return keys, err
		}
		for _, o := range page.Contents {
			if k := aws.ToString(o.Key); Owner(k, hosts) == host {
				keys = append(keys, k)
			}
		}
	}
	return keys, nil
}

func copyOne(ctx context.Context, c *s3.Client, job Job, key string) error {
	if job.ServerSide != nil && job.ServerSide(key) {
		_, err := c.CopyObject(ctx, &s3.CopyObjectInput{
			Bucket:     aws.String(job.Dst),
			Key:        aws.String(key),
			CopySource: aws.String(job.Src + "/" + url.PathEscape(key)),
		})
		return err
	}
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(job.Src), Key: aws.String(key)})
	if err != nil {
		return err
	}
	data, err := io.ReadAll(out.Body)
	// Close before the write: the body's slot is the source connection, and
	// the write does not need it.
	if cerr := out.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if out.ContentLength != nil && *out.ContentLength != int64(len(data)) {
		return errors.New("short read")
	}
	_, err = c.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        aws.String(job.Dst),
		Key:           aws.String(key),
		Body:          bytes.NewReader(data),
		ContentLength: aws.Int64(int64(len(data))),
	})
	return err
}

// Counter counts the responses a client receives, by what matters to a
// copy job: every response, and the throttles among them. It works against
// any endpoint, since it sits in the client's own transport.
type Counter struct {
	Responses, Throttled atomic.Int64
}

type countingTransport struct {
	base http.RoundTripper
	c    *Counter
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err == nil {
		t.c.Responses.Add(1)
		if resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests {
			t.c.Throttled.Add(1)
		}
	}
	return resp, err
}

// NewClient returns an S3 client for endpoint with its own connection pool,
// as a separate host would have, counting responses in c when c is not nil,
// and a function that closes the pool's idle connections. The client uses
// path-style addressing (the fake, MinIO and most S3-compatible servers
// need it) and the standard retry mode; optFns follow these defaults.
func NewClient(endpoint, region string, creds aws.CredentialsProvider, c *Counter, optFns ...func(*s3.Options)) (*s3.Client, func()) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	var rt http.RoundTripper = tr
	if c != nil {
		rt = countingTransport{base: tr, c: c}
	}
	opts := s3.Options{
		Region:       region,
		UsePathStyle: true,
		Credentials:  creds,
		RetryMode:    aws.RetryModeStandard,
		HTTPClient:   &http.Client{Transport: rt},
	}
	if endpoint != "" {
		opts.BaseEndpoint = aws.String(endpoint)
	}
	return s3.New(opts, optFns...), tr.CloseIdleConnections
}

// Seed writes n objects named "obj/0000"... to bucket, of 16 KiB up to
// maxSize bytes of random bytes drawn from seed, over 8 lanes, and returns
// their SHA-256 sums by key.
func Seed(ctx context.Context, c *s3.Client, bucket string, n, maxSize int, seed uint64) (map[string][32]byte, error) {
	const minSize = 16 << 10
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	bodies := make(map[string][]byte, n)
	sums := make(map[string][32]byte, n)
	for i := range n {
		size := minSize
		if maxSize > minSize {
			size += rng.IntN(maxSize - minSize + 1)
		}
		data := make([]byte, size)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		k := fmt.Sprintf("obj/%04d", i)
		bodies[k], sums[k] = data, sha256.Sum256(data)
	}
	work := make(chan string)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			var first error
			for k := range work {
				if first != nil {
					continue
				}
				_, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(k), Body: bytes.NewReader(bodies[k])})
				if err != nil {
					first = fmt.Errorf("seed %s/%s: %w", bucket, k, err)
				}
			}
			errs <- first
		})
	}
	for k := range bodies {
		work <- k
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return sums, nil
}

// Verify reads every key of sums from bucket and counts the objects whose
// bytes match. A missing object counts as lost, not as an error; any other
// failure to read is returned.
func Verify(ctx context.Context, c *s3.Client, bucket string, sums map[string][32]byte) (intact int, err error) {
	for k, want := range sums {
		out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(k)})
		if err != nil {
			var missing *types.NoSuchKey
			if errors.As(err, &missing) {
				continue
			}
			return intact, fmt.Errorf("verify %s/%s: %w", bucket, k, err)
		}
		data, err := io.ReadAll(out.Body)
		out.Body.Close()
		if err != nil {
			return intact, fmt.Errorf("verify %s/%s: %w", bucket, k, err)
		}
		if sha256.Sum256(data) == want {
			intact++
		}
	}
	return intact, nil
}
