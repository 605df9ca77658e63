package s3fake

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		method, target string
		copySource     bool
		bucket, class  string
	}{
		{"GET", "/", false, "", List},
		{"GET", "/b?list-type=2&prefix=x", false, "b", List},
		{"GET", "/b/k?uploadId=7", false, "b", List},
		{"HEAD", "/b", false, "b", Head},
		{"HEAD", "/b/k", false, "b", Head},
		{"GET", "/b/k?tagging", false, "b", Head},
		{"GET", "/b/dir/k", false, "b", Get},
		{"PUT", "/b/k", false, "b", Put},
		{"PUT", "/b/k", true, "b", Put},
		{"PUT", "/b/k?partNumber=1&uploadId=7", false, "b", Put},
		{"POST", "/b/k?uploads", false, "b", Put},
		{"POST", "/b?delete", false, "b", Delete},
		{"DELETE", "/b/k", false, "b", Delete},
		{"DELETE", "/b/k?uploadId=7", false, "b", Delete},
	} {
		r := httptest.NewRequest(tc.method, tc.target, nil)
		if tc.copySource {
			r.Header.Set("X-Amz-Copy-Source", "src/k")
		}
		if b, c := Classify(r); b != tc.bucket || c != tc.class {
			t.Errorf("Classify(%s %s) = %q, %q; want %q, %q", tc.method, tc.target, b, c, tc.bucket, tc.class)
		}
	}
}

// TestOverRateIsSlowDown: past its write rate, a bucket answers 503
// SlowDown with both forms of advice, and only that bucket does.
func TestOverRateIsSlowDown(t *testing.T) {
	s := Start(Limits{WriteRate: 0.5, Burst: 2})
	defer s.Close()
	for _, b := range []string{"a", "b"} {
		if err := s.CreateBucket(b); err != nil {
			t.Fatal(err)
		}
	}
	put := func(bucket string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPut, s.URL+"/"+bucket+"/k", strings.NewReader("x"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for i := range 2 {
		if resp := put("a"); resp.StatusCode != http.StatusOK {
			t.Fatalf("put %d within the burst: %s", i, resp.Status)
		}
	}
	resp := put("a")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("put over the rate: %s, want 503", resp.Status)
	}
	ms, err := strconv.Atoi(resp.Header.Get("X-Amz-Retry-After"))
	if err != nil || ms < 100 || ms > 2000 {
		t.Errorf("x-amz-retry-after %q, want the time to the next token (up to 2000 ms)", resp.Header.Get("X-Amz-Retry-After"))
	}
	if ra := resp.Header.Get("Retry-After"); ra != "1" && ra != "2" {
		t.Errorf("Retry-After %q, want the same advice in whole seconds, rounded up", ra)
	}
	if resp := put("b"); resp.StatusCode != http.StatusOK {
		t.Errorf("put on another bucket: %s, want 200", resp.Status)
	}
	st := s.Stats()
	if st.Requests != 4 || st.Throttled != 1 || st.ByClass[Put] != 4 {
		t.Errorf("stats %+v, want 4 requests, 1 throttled, 4 puts", st)
	}
	s.ResetStats()
	if st := s.Stats(); st.Requests != 0 || st.Throttled != 0 || len(st.ByClass) != 0 {
		t.Errorf("stats after reset %+v", st)
	}
}
