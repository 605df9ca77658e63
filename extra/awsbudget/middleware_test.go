package awsbudget_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/logging"
	"github.com/aws/smithy-go/middleware"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/extra/awsbudget"
)

// recordingStore wraps the in-process store and records what the budget
// asks of it: one entry per lease (by ID) and every throttle report.
type recordingStore struct {
	budget.Store
	mu        sync.Mutex
	acquired  []budget.Request
	seen      map[string]bool
	throttles []throttleReport
}

type throttleReport struct {
	Domain string
	Pause  time.Duration
}

func newRecordingStore() *recordingStore {
	return &recordingStore{Store: budget.NewLocalStore(), seen: map[string]bool{}}
}

func (s *recordingStore) TryAcquire(ctx context.Context, id string, req budget.Request) (budget.Attempt, error) {
	s.mu.Lock()
	if !s.seen[id] {
		s.seen[id] = true
		s.acquired = append(s.acquired, req)
	}
	s.mu.Unlock()
	return s.Store.TryAcquire(ctx, id, req)
}

func (s *recordingStore) Throttle(ctx context.Context, d budget.Domain, retryAfter time.Duration) (float64, error) {
	s.mu.Lock()
	s.throttles = append(s.throttles, throttleReport{d.ID, retryAfter})
	s.mu.Unlock()
	return s.Store.Throttle(ctx, d, retryAfter)
}

// NonBlocking forwards the in-process store's answer, as a wrapper should.
func (s *recordingStore) NonBlocking() bool {
	nb, ok := s.Store.(budget.NonBlocking)
	return ok && nb.NonBlocking()
}

func (s *recordingStore) Acquired() []budget.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.acquired)
}

func (s *recordingStore) Throttles() []throttleReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.throttles)
}

var unitLimits = budget.Limits{
	InFlight: map[budget.OpClass]int{
		budget.OpList: 8, budget.OpHead: 8, budget.OpGet: 8, budget.OpPut: 8, budget.OpDelete: 8,
	},
	OpenBodies: 8,
}

func newBudget(t *testing.T, limits budget.Limits) (*budget.Budget, *recordingStore) {
	t.Helper()
	st := newRecordingStore()
	b, err := budget.New(limits, budget.WithStore(st))
	if err != nil {
		t.Fatalf("budget.New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b, st
}

// noBackoff retries at once, so retry tests take no time.
var noBackoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })

func retryer(attempts int) aws.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) {
		o.MaxAttempts = attempts
		o.Backoff = noBackoff
	})
}

// newClient returns a client for srv with b installed; attempts bounds the
// SDK's retries.
func newClient(t *testing.T, srv *httptest.Server, b *budget.Budget, attempts int, opts ...awsbudget.Option) *s3.Client {
	t.Helper()
	return s3.New(s3.Options{
		Region:       region,
		BaseEndpoint: aws.String(srv.URL),
		UsePathStyle: true,
		Credentials:  creds,
		Retryer:      retryer(attempts),
		HTTPClient:   srv.Client(),
	}, awsbudget.WithBudget(b, opts...))
}

func serve(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func domainUsage(t *testing.T, b *budget.Budget, id string) budget.DomainUsage {
	t.Helper()
	u, err := b.Usage(context.Background())
	if err != nil {
		// Errorf, not Fatalf: handlers call this off the test goroutine.
		t.Errorf("Usage: %v", err)
	}
	for _, d := range u.Domains {
		if d.Domain.ID == id {
			return d
		}
	}
	return budget.DomainUsage{}
}

// requireIdle fails the test unless b holds nothing and nobody waits.
func requireIdle(t *testing.T, b *budget.Budget) {
	t.Helper()
	u, err := b.Usage(context.Background())
	if err != nil {
		t.Fatalf("Usage: %v", err)
	}
	if u.Waiters != 0 || u.MemoryHeld != 0 {
		t.Errorf("usage: %d waiters, %d bytes held; want none", u.Waiters, u.MemoryHeld)
	}
	for _, d := range u.Domains {
		if len(d.InFlight) != 0 || d.OpenBodies != 0 || d.Waiters != 0 {
			t.Errorf("%s: in flight %v, %d open bodies, %d waiters; want none", d.Domain, d.InFlight, d.OpenBodies, d.Waiters)
		}
	}
}

const bucketDomain = "s3:" + region + ":bkt"

var errStop = errors.New("stack captured")

// TestStackOrder checks the claim of AdmissionID by the SDK's own IDs: the
// admission comes right after the retry loop (so it runs once per attempt)
// and before identity resolution and signing (so no wait ages a signature or
// credentials), for operations of each shape, whichever way it is installed.
func TestStackOrder(t *testing.T) {
	b, _ := newBudget(t, unitLimits)
	var finalize, initialize []string
	capture := func(s *middleware.Stack) error {
		finalize, initialize = s.Finalize.List(), s.Initialize.List()
		return errStop
	}
	viaOption := s3.New(s3.Options{Region: region, Credentials: creds, APIOptions: nil}, awsbudget.WithBudget(b),
		func(o *s3.Options) { o.APIOptions = append(o.APIOptions, capture) })
	viaConfig := s3.NewFromConfig(aws.Config{Region: region, Credentials: creds,
		APIOptions: []func(*middleware.Stack) error{awsbudget.APIOption(b), capture}})
	ops := map[string]func(*s3.Client) error{
		"GetObject": func(c *s3.Client) error {
			_, err := c.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")})
			return err
		},
		"PutObject": func(c *s3.Client) error {
			_, err := c.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k"), Body: strings.NewReader("x")})
			return err
		},
		"CopyObject": func(c *s3.Client) error {
			_, err := c.CopyObject(context.Background(), &s3.CopyObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k"), CopySource: aws.String("src/k")})
			return err
		},
		"ListObjectsV2": func(c *s3.Client) error {
			_, err := c.ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String("bkt")})
			return err
		},
	}
	for name, op := range ops {
		for how, c := range map[string]*s3.Client{"WithBudget": viaOption, "APIOption": viaConfig} {
			finalize, initialize = nil, nil
			if err := op(c); !errors.Is(err, errStop) {
				t.Fatalf("%s via %s: %v, want the capture's error", name, how, err)
			}
			pos := func(id string) int { return slices.Index(finalize, id) }
			retryAt, admitAt := pos("Retry"), pos(awsbudget.AdmissionID)
			if retryAt < 0 || admitAt != retryAt+1 {
				t.Errorf("%s via %s: Finalize %v: want %s right after Retry", name, how, finalize, awsbudget.AdmissionID)
			}
			for _, later := range []string{"GetIdentity", "Signing"} {
				if at := pos(later); at < 0 || at < admitAt {
					t.Errorf("%s via %s: Finalize %v: want %s after %s", name, how, finalize, later, awsbudget.AdmissionID)
				}
			}
			if !slices.Contains(initialize, awsbudget.OperationID) {
				t.Errorf("%s via %s: Initialize %v lacks %s", name, how, initialize, awsbudget.OperationID)
			}
		}
	}
}

func TestInstallErrors(t *testing.T) {
	b, _ := newBudget(t, unitLimits)
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) { t.Errorf("request sent: %s %s", r.Method, r.URL) })
	twice := newClient(t, srv, b, 1, awsbudget.WithConsumer("twice"))
	_, err := twice.HeadBucket(context.Background(), &s3.HeadBucketInput{Bucket: aws.String("bkt")},
		awsbudget.WithBudget(b))
	if err == nil || !strings.Contains(err.Error(), "installed twice") {
		t.Errorf("installed twice: err = %v", err)
	}
	nilBudget := s3.New(s3.Options{Region: region, BaseEndpoint: aws.String(srv.URL), UsePathStyle: true, Credentials: creds},
		awsbudget.WithBudget(nil))
	if _, err := nilBudget.HeadBucket(context.Background(), &s3.HeadBucketInput{Bucket: aws.String("bkt")}); err == nil || !strings.Contains(err.Error(), "nil budget") {
		t.Errorf("nil budget: err = %v", err)
	}
}

// TestAdaptiveModeWarns: WithBudget says so when it finds the adaptive
// retry mode, whose client-side limiter double-counts throttles.
func TestAdaptiveModeWarns(t *testing.T) {
	b, _ := newBudget(t, unitLimits)
	for _, mode := range []aws.RetryMode{aws.RetryModeAdaptive, aws.RetryModeStandard} {
		var logged []string
		logger := logging.LoggerFunc(func(c logging.Classification, format string, v ...any) {
			logged = append(logged, string(c)+": "+fmt.Sprintf(format, v...))
		})
		s3.NewFromConfig(aws.Config{Region: region, Credentials: creds, RetryMode: mode, Logger: logger}, awsbudget.WithBudget(b))
		warned := len(logged) == 1 && strings.HasPrefix(logged[0], "WARN: ") && strings.Contains(logged[0], "standard retry mode")
		if warned != (mode == aws.RetryModeAdaptive) {
			t.Errorf("retry mode %q: logged %q", mode, logged)
		}
	}
}

// TestPresignChargesNothing: a presigner's stack has no retry loop and
// sends nothing, so the middleware stays out of it.
func TestPresignChargesNothing(t *testing.T) {
	b, st := newBudget(t, unitLimits)
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) { t.Errorf("request sent: %s %s", r.Method, r.URL) })
	p := s3.NewPresignClient(newClient(t, srv, b, 1))
	req, err := p.PresignGetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")})
	if err != nil {
		t.Fatalf("PresignGetObject: %v", err)
	}
	if !strings.Contains(req.URL, "X-Amz-Signature=") {
		t.Errorf("presigned URL %q is not signed", req.URL)
	}
	if n := len(st.Acquired()); n != 0 {
		t.Errorf("presigning acquired %d leases, want 0", n)
	}
}

// TestGetHoldsBodyUntilClose: a GET's request slot ends with its response
// headers, its body slot only when the caller closes the Body (not at EOF).
func TestGetHoldsBodyUntilClose(t *testing.T) {
	b, st := newBudget(t, unitLimits)
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if d := domainUsage(t, b, bucketDomain); d.InFlight[budget.OpGet] != 1 || d.OpenBodies != 1 {
			t.Errorf("while served: in flight %v, %d open bodies; want 1 get, 1 body", d.InFlight, d.OpenBodies)
		}
		io.WriteString(w, "hello, body")
	})
	c := newClient(t, srv, b, 1)
	out, err := c.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")})
	if err != nil {
		t.Fatalf("GetObject: %v", err)
	}
	if d := domainUsage(t, b, bucketDomain); d.InFlight[budget.OpGet] != 0 || d.OpenBodies != 1 {
		t.Errorf("after headers: in flight %v, %d open bodies; want no request, 1 body", d.InFlight, d.OpenBodies)
	}
	data, err := io.ReadAll(out.Body)
	if err != nil || string(data) != "hello, body" {
		t.Fatalf("body = %q, %v", data, err)
	}
	if d := domainUsage(t, b, bucketDomain); d.OpenBodies != 1 {
		t.Errorf("after EOF: %d open bodies, want 1 until Close", d.OpenBodies)
	}
	if err := out.Body.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	requireIdle(t, b)
	if err := out.Body.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	requireIdle(t, b)
	got := st.Acquired()
	if len(got) != 1 || got[0].Class != budget.OpGet || !got[0].OpensBody ||
		len(got[0].Domains) != 1 || got[0].Domains[0].ID != bucketDomain || got[0].Consumer != "awsbudget/GetObject" {
		t.Errorf("acquired %+v, want one OpGet with a body on %s by awsbudget/GetObject", got, bucketDomain)
	}
}

// TestClassesCharged runs one operation of each mapped shape through the
// middleware and checks the request it acquired.
func TestClassesCharged(t *testing.T) {
	b, st := newBudget(t, unitLimits)
	srv := serve(t, okS3)
	c := newClient(t, srv, b, 1)
	ctx := context.Background()
	bkt, key := aws.String("bkt"), aws.String("k")
	calls := []struct {
		class   budget.OpClass
		domains []string
		call    func() error
	}{
		{budget.OpList, []string{bucketDomain}, func() error {
			_, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: bkt})
			return err
		}},
		{budget.OpList, []string{"s3:" + region + ":"}, func() error {
			_, err := c.ListBuckets(ctx, &s3.ListBucketsInput{})
			return err
		}},
		{budget.OpHead, []string{bucketDomain}, func() error {
			_, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: bkt, Key: key})
			return err
		}},
		{budget.OpPut, []string{bucketDomain}, func() error {
			_, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: bkt, Key: key, Body: strings.NewReader("data")})
			return err
		}},
		{budget.OpDelete, []string{bucketDomain}, func() error {
			_, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: bkt, Key: key})
			return err
		}},
		{budget.OpPut, []string{bucketDomain, "s3:" + region + ":src"}, func() error {
			_, err := c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: bkt, Key: key, CopySource: aws.String("src/k")})
			return err
		}},
		{budget.OpPut, []string{bucketDomain}, func() error { // within one bucket: one domain
			_, err := c.UploadPartCopy(ctx, &s3.UploadPartCopyInput{Bucket: bkt, Key: key, CopySource: aws.String("bkt/other"),
				PartNumber: aws.Int32(1), UploadId: aws.String("u")})
			return err
		}},
	}
	for i, tc := range calls {
		if err := tc.call(); err != nil {
			t.Fatalf("call %d (%s): %v", i, tc.class, err)
		}
		got := st.Acquired()
		if len(got) != i+1 {
			t.Fatalf("call %d: %d leases acquired in all, want %d", i, len(got), i+1)
		}
		req := got[i]
		var ids []string
		for _, d := range req.Domains {
			ids = append(ids, d.ID)
		}
		if req.Class != tc.class || req.OpensBody || !slices.Equal(ids, tc.domains) {
			t.Errorf("call %d: acquired %s on %v (body %v), want %s on %v", i, req.Class, ids, req.OpensBody, tc.class, tc.domains)
		}
		requireIdle(t, b)
	}
}

// okS3 answers every request as S3 would a success, with the smallest
// valid body for the operation.
func okS3(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("ETag", `"etag"`)
	switch {
	case r.Header.Get("X-Amz-Copy-Source") != "":
		io.WriteString(w, `<CopyObjectResult><ETag>"etag"</ETag></CopyObjectResult>`)
	case r.Method == http.MethodGet && r.URL.Path == "/":
		io.WriteString(w, `<ListAllMyBucketsResult><Buckets></Buckets></ListAllMyBucketsResult>`)
	case r.Method == http.MethodGet && strings.Count(r.URL.Path, "/") == 1:
		io.WriteString(w, `<ListBucketResult><Name>bkt</Name><KeyCount>0</KeyCount></ListBucketResult>`)
	case r.Method == http.MethodDelete:
		w.WriteHeader(http.StatusNoContent)
	}
}

// TestAttemptsAdmittedOneByOne: each retry is a new admission, holding the
// slot while the provider serves it.
func TestAttemptsAdmittedOneByOne(t *testing.T) {
	b, st := newBudget(t, unitLimits)
	var attempts atomic.Int64
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if d := domainUsage(t, b, bucketDomain); d.InFlight[budget.OpHead] != 1 {
			t.Errorf("attempt %d served with %v in flight, want 1 head", attempts.Load()+1, d.InFlight)
		}
		if attempts.Add(1) < 3 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
	})
	c := newClient(t, srv, b, 3)
	if _, err := c.HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")}); err != nil {
		t.Fatalf("HeadObject: %v", err)
	}
	if n := attempts.Load(); n != 3 {
		t.Fatalf("%d attempts, want 3", n)
	}
	if n := len(st.Acquired()); n != 3 {
		t.Errorf("%d leases for 3 attempts, want one per attempt", n)
	}
	if n := len(st.Throttles()); n != 0 {
		t.Errorf("500s reported as %d throttles, want none", n)
	}
	requireIdle(t, b)
}

// TestLeaseReleasedOnErrors: whatever way an attempt fails, nothing stays
// held afterwards.
func TestLeaseReleasedOnErrors(t *testing.T) {
	get := func(ctx context.Context, c *s3.Client) error {
		out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")})
		if err == nil {
			out.Body.Close()
			return errors.New("GetObject succeeded")
		}
		return err
	}
	list := func(ctx context.Context, c *s3.Client) error {
		_, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("bkt")})
		return err
	}
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		call    func(context.Context, *s3.Client) error
		ctx     func() (context.Context, context.CancelFunc)
	}{
		{name: "500", handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }, call: get},
		{name: "404 NoSuchKey", handler: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(404)
			io.WriteString(w, `<Error><Code>NoSuchKey</Code><Message>no</Message></Error>`)
		}, call: get},
		{name: "400 on a list", handler: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(400)
			io.WriteString(w, `<Error><Code>InvalidArgument</Code></Error>`)
		}, call: list},
		{name: "malformed XML", handler: func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, `<ListBucketResult><KeyCount>not a number`)
		}, call: list},
		{name: "connection dropped", handler: func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}, call: get},
		{name: "ctx ends during the request", handler: func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		}, call: get, ctx: func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, st := newBudget(t, unitLimits)
			srv := serve(t, tc.handler)
			c := newClient(t, srv, b, 1)
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tc.ctx != nil {
				ctx, cancel = tc.ctx()
			}
			defer cancel()
			if err := tc.call(ctx, c); err == nil {
				t.Fatal("call succeeded, want an error")
			}
			if n := len(st.Acquired()); n != 1 {
				t.Errorf("%d leases acquired, want 1", n)
			}
			requireIdle(t, b)
		})
	}
}

// TestLeaseReleasedOnPanic: a panic below the admission (here a middleware
// after signing) still releases the lease.
func TestLeaseReleasedOnPanic(t *testing.T) {
	b, st := newBudget(t, unitLimits)
	srv := serve(t, okS3)
	c := newClient(t, srv, b, 1)
	boom := middleware.FinalizeMiddlewareFunc("boom", func(context.Context, middleware.FinalizeInput, middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
		panic("boom")
	})
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want the middleware's panic", r)
			}
		}()
		c.HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")},
			func(o *s3.Options) {
				o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error { return s.Finalize.Add(boom, middleware.After) })
			})
	}()
	if n := len(st.Acquired()); n != 1 {
		t.Errorf("%d leases acquired, want 1", n)
	}
	requireIdle(t, b)
}

// TestCancelWhileWaiting: a ctx that ends while the attempt waits for
// admission sends nothing, returns the SDK's canceled error wrapping ctx's,
// and is not retried.
func TestCancelWhileWaiting(t *testing.T) {
	b, _ := newBudget(t, budget.Limits{InFlight: map[budget.OpClass]int{budget.OpHead: 1}})
	var sent atomic.Int64
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) { sent.Add(1) })
	hold, err := b.Acquire(context.Background(), budget.Request{Domains: []budget.Domain{{Version: 1, ID: bucketDomain}}, Class: budget.OpHead})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, srv, b, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")})
	var canceled *aws.RequestCanceledError
	if !errors.As(err, &canceled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want *aws.RequestCanceledError wrapping context.DeadlineExceeded", err)
	}
	if n := sent.Load(); n != 0 {
		t.Errorf("%d requests sent while not admitted", n)
	}
	// The budget takes a cancelled waiter out of line in the background, so
	// the slot may come back a moment after Release: the next attempt on
	// the one slot can only start once it has, and then nothing is left.
	hold.Release()
	if _, err := c.HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")}); err != nil {
		t.Fatalf("HeadObject after the slot came free: %v", err)
	}
	if n := sent.Load(); n != 1 {
		t.Errorf("%d requests sent, want the second call's 1", n)
	}
	requireIdle(t, b)
}

// TestBadMappingFailsBeforeSending: a domain or class the budget refuses is
// the operation's error, with the budget's sentinel, and nothing is sent.
func TestBadMappingFailsBeforeSending(t *testing.T) {
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) { t.Errorf("request sent: %s %s", r.Method, r.URL) })
	for _, tc := range []struct {
		name string
		opt  awsbudget.Option
		want error
	}{
		{"invalid domain", awsbudget.WithDomain(func(awsbudget.Resource) budget.Domain { return budget.Domain{Version: 1} }), budget.ErrInvalidDomain},
		{"unknown class", awsbudget.WithClass(func(string) budget.OpClass { return "scan" }), budget.ErrInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := newBudget(t, unitLimits)
			c := newClient(t, srv, b, 3, tc.opt)
			_, err := c.HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")})
			if !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestWithDomainAndClass(t *testing.T) {
	b, st := newBudget(t, unitLimits)
	srv := serve(t, okS3)
	var seen []awsbudget.Resource
	c := newClient(t, srv, b, 1,
		awsbudget.WithDomain(func(r awsbudget.Resource) budget.Domain {
			seen = append(seen, r)
			prefix, _, _ := strings.Cut(r.Key, "/")
			return budget.Domain{Version: 2, ID: r.Bucket + "/" + prefix}
		}),
		awsbudget.WithClass(func(op string) budget.OpClass {
			if op == "HeadObject" {
				return budget.OpGet // no body in the output: the slot is given back
			}
			return awsbudget.DefaultClass(op)
		}),
		awsbudget.WithConsumer("job-7"))
	if _, err := c.HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String("bkt"), Key: aws.String("logs/2026/a")}); err != nil {
		t.Fatal(err)
	}
	want := awsbudget.Resource{Operation: "HeadObject", Region: region, Bucket: "bkt", Key: "logs/2026/a"}
	if len(seen) != 1 || seen[0] != want {
		t.Errorf("domain function saw %+v, want [%+v]", seen, want)
	}
	got := st.Acquired()
	if len(got) != 1 || got[0].Domains[0] != (budget.Domain{Version: 2, ID: "bkt/logs"}) || got[0].Class != budget.OpGet || got[0].Consumer != "job-7/HeadObject" {
		t.Errorf("acquired %+v", got)
	}
	requireIdle(t, b)
}

// TestThrottles: a throttled attempt reports the provider's pause (capped)
// on every domain of its request; other errors report nothing.
func TestThrottles(t *testing.T) {
	slowDown := func(status int, hdr map[string]string, code string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			for k, v := range hdr {
				w.Header().Set(k, v)
			}
			w.WriteHeader(status)
			if code != "" && r.Method != http.MethodHead {
				fmt.Fprintf(w, `<Error><Code>%s</Code><Message>slow</Message></Error>`, code)
			}
		}
	}
	head := func(c *s3.Client) error {
		_, err := c.HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")})
		return err
	}
	put := func(c *s3.Client) error {
		_, err := c.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k"), Body: strings.NewReader("x")})
		return err
	}
	copyObj := func(c *s3.Client) error {
		_, err := c.CopyObject(context.Background(), &s3.CopyObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k"), CopySource: aws.String("src/k")})
		return err
	}
	src := "s3:" + region + ":src"
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		call    func(*s3.Client) error
		opts    []awsbudget.Option
		want    []throttleReport
	}{
		{"503 SlowDown, x-amz-retry-after", slowDown(503, map[string]string{"X-Amz-Retry-After": "1500"}, "SlowDown"), put, nil,
			[]throttleReport{{bucketDomain, 1500 * time.Millisecond}}},
		{"503 both headers: ms wins", slowDown(503, map[string]string{"X-Amz-Retry-After": "1200", "Retry-After": "2"}, "SlowDown"), put, nil,
			[]throttleReport{{bucketDomain, 1200 * time.Millisecond}}},
		{"503 HEAD, no body, Retry-After", slowDown(503, map[string]string{"Retry-After": "3"}, ""), head, nil,
			[]throttleReport{{bucketDomain, 3 * time.Second}}},
		{"429, malformed advice", slowDown(429, map[string]string{"Retry-After": "soon"}, ""), put, nil,
			[]throttleReport{{bucketDomain, 0}}},
		{"SlowDown code on a 400", slowDown(400, nil, "SlowDown"), put, nil,
			[]throttleReport{{bucketDomain, 0}}},
		{"capped by default", slowDown(503, map[string]string{"X-Amz-Retry-After": "3600000"}, "SlowDown"), put, nil,
			[]throttleReport{{bucketDomain, awsbudget.DefaultMaxPause}}},
		{"capped by WithMaxPause", slowDown(503, map[string]string{"X-Amz-Retry-After": "5000"}, "SlowDown"), put,
			[]awsbudget.Option{awsbudget.WithMaxPause(2 * time.Second)},
			[]throttleReport{{bucketDomain, 2 * time.Second}}},
		{"copy: both buckets", slowDown(503, map[string]string{"X-Amz-Retry-After": "800"}, "SlowDown"), copyObj, nil,
			[]throttleReport{{bucketDomain, 800 * time.Millisecond}, {src, 800 * time.Millisecond}}},
		{"500 is no throttle", slowDown(500, nil, "InternalError"), put, nil, nil},
		{"503 not counted when statuses are off", slowDown(503, nil, "ServiceUnavailable"), put,
			[]awsbudget.Option{awsbudget.WithThrottleStatus()}, nil},
		{"403 is no throttle", slowDown(403, nil, "AccessDenied"), put, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, st := newBudget(t, unitLimits)
			c := newClient(t, serve(t, tc.handler), b, 1, tc.opts...)
			if err := tc.call(c); err == nil {
				t.Fatal("call succeeded, want the provider's error")
			}
			if got := st.Throttles(); !slices.Equal(got, tc.want) {
				t.Errorf("throttles reported %v, want %v", got, tc.want)
			}
			if len(tc.want) > 0 {
				d := domainUsage(t, b, bucketDomain)
				if d.RateFactor >= 1 {
					t.Errorf("rate factor %v after a throttle, want below 1", d.RateFactor)
				}
				if p := tc.want[0].Pause; d.Paused > p || (p > 0 && d.Paused <= 0) {
					t.Errorf("paused %v, want up to %v", d.Paused, p)
				}
			}
		})
	}
}

// TestCopiesCannotDeadlock guards the choice of one admission per copy.
// Charging a copy as two leases taken one after the other (destination,
// then source) deadlocks under the budget's FIFO fairness as soon as the
// destination class is at its ceiling: every holder of a put slot waits
// for its source lease behind an older waiter that wants a put slot. Here
// 24 lanes copy within one bucket and between two buckets both ways with
// 2 put slots; every copy must finish, and each holds a put slot on both of
// its buckets while the provider serves it. (Measured with the two-lease
// design in the middleware: 4 of the 240 copies were done when every lane's
// 20 s deadline ran out.)
func TestCopiesCannotDeadlock(t *testing.T) {
	b, _ := newBudget(t, budget.Limits{InFlight: map[budget.OpClass]int{budget.OpPut: 2}})
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		dst, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		src, _, _ := strings.Cut(strings.TrimPrefix(r.Header.Get("X-Amz-Copy-Source"), "/"), "/")
		for _, bkt := range []string{dst, src} {
			if d := domainUsage(t, b, "s3:"+region+":"+bkt); d.InFlight[budget.OpPut] < 1 || d.InFlight[budget.OpPut] > 2 {
				t.Errorf("copy %s -> %s served with %v in flight on %s", src, dst, d.InFlight, bkt)
			}
		}
		okS3(w, r)
	})
	c := newClient(t, srv, b, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pairs := [][2]string{{"a", "a"}, {"a", "b"}, {"b", "a"}}
	var wg sync.WaitGroup
	var done atomic.Int64
	for lane := range 24 {
		wg.Go(func() {
			for i := range 10 {
				p := pairs[(lane+i)%len(pairs)]
				_, err := c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String(p[1]), Key: aws.String("k"), CopySource: aws.String(p[0] + "/k")})
				if err != nil {
					t.Errorf("copy %s -> %s: %v", p[0], p[1], err)
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if n := done.Load(); n != 240 {
		t.Errorf("%d of 240 copies done", n)
	}
	requireIdle(t, b)
}
