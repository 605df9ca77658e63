package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runbudget/runbudget/loom"
)

func TestRetryAfterSeconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{math.MinInt64, 0},
		{-time.Second, 0},
		{-1, 0},
		{0, 0},
		{1, 1},
		{999 * time.Millisecond, 1},
		{time.Second, 1},
		{time.Second + 1, 2},
		{1500 * time.Millisecond, 2},
		{time.Hour, 3600},
		{math.MaxInt64 / time.Second * time.Second, 9223372036},
		{math.MaxInt64, 9223372037},
	} {
		for _, allowed := range []bool{false, true} {
			got := RateDecision{Allowed: allowed, RetryAfter: tc.d}.RetryAfterSeconds()
			if got != tc.want {
				t.Errorf("RetryAfterSeconds(%d) = %d, want %d", tc.d, got, tc.want)
			}
		}
	}
}

func TestNewRateAdmission(t *testing.T) {
	check := func(context.Context, string) (RateDecision, error) { return RateDecision{Allowed: true}, nil }
	for _, tc := range []struct {
		name    string
		check   RateCheck
		timeout time.Duration
		ok      bool
	}{
		{"nil check", nil, time.Second, false},
		{"zero timeout", check, 0, false},
		{"negative timeout", check, -time.Second, false},
		{"minimum timeout", check, 1, true},
		{"ok", check, time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := NewRateAdmission(tc.check, tc.timeout)
			if tc.ok != (err == nil) || tc.ok != (a != nil) {
				t.Fatalf("NewRateAdmission = %v, %v; want ok: %v", a, err, tc.ok)
			}
		})
	}
}

// TestRateAdmissionCheckContext checks what the backend is given: the caller's
// values, and the earlier of the caller's deadline and the admission's own.
func TestRateAdmissionCheckContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 100 * time.Millisecond
		var got context.Context
		a, _ := NewRateAdmission(func(ctx context.Context, key string) (RateDecision, error) {
			got = ctx
			return RateDecision{Allowed: true}, nil
		}, timeout)
		base := context.WithValue(context.Background(), ctxKey{}, "caller")

		for _, tc := range []struct {
			name      string
			callerDL  time.Duration // 0: none
			wantAfter time.Duration
		}{
			{"no caller deadline", 0, timeout},
			{"later caller deadline", time.Hour, timeout},
			{"earlier caller deadline", 10 * time.Millisecond, 10 * time.Millisecond},
		} {
			ctx := base
			cancel := context.CancelFunc(func() {})
			if tc.callerDL > 0 {
				ctx, cancel = context.WithTimeout(base, tc.callerDL)
			}
			if _, err := a.Check(ctx, "k"); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			cancel()
			dl, ok := got.Deadline()
			if !ok || !dl.Equal(time.Now().Add(tc.wantAfter)) {
				t.Fatalf("%s: backend deadline %v (set: %v), want now+%v", tc.name, dl, ok, tc.wantAfter)
			}
			if got.Value(ctxKey{}) != "caller" {
				t.Fatalf("%s: backend lost the caller's values", tc.name)
			}
			if got.Err() == nil {
				t.Fatalf("%s: bounded context still live after Check returned", tc.name)
			}
		}
	})
}

func TestRateAdmissionCheckOutcomes(t *testing.T) {
	const secretKey, secretText = "tenant-4711-secret", "dial tcp 10.0.0.7:6379: password=hunter2"
	decide := func(d RateDecision, err error) RateCheck {
		return func(context.Context, string) (RateDecision, error) { return d, err }
	}
	for _, tc := range []struct {
		name    string
		check   RateCheck
		want    RateDecision
		wantErr string // "" for success, else the ServiceError name
		timeout bool   // the ServiceError must have Timeout set
	}{
		{"allowed", decide(RateDecision{Allowed: true, Version: 3}, nil), RateDecision{Allowed: true, Version: 3}, "", false},
		{"denied, delay known", decide(RateDecision{RetryAfter: time.Second, Version: 2}, nil), RateDecision{RetryAfter: time.Second, Version: 2}, "", false},
		{"denied, delay unknown", decide(RateDecision{}, nil), RateDecision{}, "", false},
		{"backend error", decide(RateDecision{}, errors.New(secretText+" "+secretKey)), RateDecision{}, "rate_limit_unavailable", false},
		{"backend error with an allowed decision", decide(RateDecision{Allowed: true}, errors.New(secretText)), RateDecision{}, "rate_limit_unavailable", false},
		{"allowed with RetryAfter", decide(RateDecision{Allowed: true, RetryAfter: time.Second}, nil), RateDecision{}, "rate_limit_unavailable", false},
		{"allowed with negative RetryAfter", decide(RateDecision{Allowed: true, RetryAfter: -1}, nil), RateDecision{}, "rate_limit_unavailable", false},
		{"denied with negative RetryAfter", decide(RateDecision{RetryAfter: -time.Second}, nil), RateDecision{}, "rate_limit_unavailable", false},
		{"backend honors the timeout", func(ctx context.Context, _ string) (RateDecision, error) {
			<-ctx.Done()
			return RateDecision{}, fmt.Errorf("%s: %w", secretText, ctx.Err())
		}, RateDecision{}, "rate_limit_unavailable", true},
		{"backend ignores the timeout, then allows", func(ctx context.Context, _ string) (RateDecision, error) {
			time.Sleep(time.Minute)
			return RateDecision{Allowed: true}, nil
		}, RateDecision{}, "rate_limit_unavailable", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var gotKey string
				a, _ := NewRateAdmission(func(ctx context.Context, key string) (RateDecision, error) {
					gotKey = key
					return tc.check(ctx, key)
				}, 50*time.Millisecond)
				d, err := a.Check(context.Background(), secretKey)
				if gotKey != secretKey {
					t.Fatalf("backend got key %q", gotKey)
				}
				if d != tc.want {
					t.Fatalf("decision %+v, want %+v", d, tc.want)
				}
				if tc.wantErr == "" {
					if err != nil {
						t.Fatalf("error %v", err)
					}
					return
				}
				se := wantServiceError(t, err, tc.wantErr)
				if se.Timeout != tc.timeout {
					t.Fatalf("Timeout %v, want %v", se.Timeout, tc.timeout)
				}
				wantNoLeak(t, err, secretKey, "hunter2", "10.0.0.7", "dial")
			})
		})
	}
}

func TestRateAdmissionCallerCancel(t *testing.T) {
	t.Run("done before the check", func(t *testing.T) {
		called := false
		a, _ := NewRateAdmission(func(context.Context, string) (RateDecision, error) {
			called = true
			return RateDecision{Allowed: true}, nil
		}, time.Second)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if d, err := a.Check(ctx, "k"); err != context.Canceled || d.Allowed {
			t.Fatalf("Check = %+v, %v; want context.Canceled", d, err)
		}
		if called {
			t.Fatal("backend called for a done context")
		}
	})
	t.Run("canceled during the check", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		a, _ := NewRateAdmission(func(c context.Context, _ string) (RateDecision, error) {
			cancel()
			<-c.Done()
			return RateDecision{Allowed: true}, errors.New("backend saw the cancel")
		}, time.Hour)
		if d, err := a.Check(ctx, "k"); err != context.Canceled || d.Allowed {
			t.Fatalf("Check = %+v, %v; want context.Canceled", d, err)
		}
	})
	t.Run("caller deadline earlier than the timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			defer cancel()
			a, _ := NewRateAdmission(func(c context.Context, _ string) (RateDecision, error) {
				<-c.Done()
				return RateDecision{}, c.Err()
			}, time.Hour)
			if _, err := a.Check(ctx, "k"); err != context.DeadlineExceeded {
				t.Fatalf("Check error %v; want the caller's context.DeadlineExceeded", err)
			}
		})
	})
}

func TestRateAdmissionUnbuilt(t *testing.T) {
	for name, a := range map[string]*RateAdmission{"nil": nil, "zero": new(RateAdmission)} {
		t.Run(name, func(t *testing.T) {
			d, err := a.Check(context.Background(), "k")
			wantServiceError(t, err, "rate_limit_unavailable")
			if d.Allowed {
				t.Fatal("unbuilt admission allowed a call")
			}
			defer func() {
				if recover() == nil {
					t.Fatal("Middleware on an unbuilt admission did not panic")
				}
			}()
			a.Middleware(func(context.Context, any) (string, error) { return "", nil }, func(RateDecision) error { return nil })
		})
	}
}

func TestRateAdmissionMiddlewareConstructionPanics(t *testing.T) {
	a, _ := NewRateAdmission(func(context.Context, string) (RateDecision, error) { return RateDecision{}, nil }, time.Second)
	key := func(context.Context, any) (string, error) { return "", nil }
	denied := func(RateDecision) error { return errors.New("denied") }
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"nil key", func() { a.Middleware(nil, denied) }},
		{"nil denied", func() { a.Middleware(key, nil) }},
		{"nil endpoint", func() { a.Middleware(key, denied)(nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			tc.f()
		})
	}
}

// errDenied is an application's declared denial error, carrying the delay.
type errDenied struct{ retryAfter int64 }

func (e *errDenied) Error() string { return fmt.Sprintf("rate limited; retry in %ds", e.retryAfter) }

func TestRateAdmissionMiddleware(t *testing.T) {
	const secretKey = "user-31337"
	type outcome struct {
		decision RateDecision
		err      error
	}
	for _, tc := range []struct {
		name      string
		keyErr    error
		backend   outcome
		denyNil   bool
		wantNext  bool
		wantErr   string // ServiceError name, "denied" for the application's error, "" for none
		wantDelay int64
	}{
		{name: "allowed", backend: outcome{RateDecision{Allowed: true}, nil}, wantNext: true},
		{name: "denied with delay", backend: outcome{RateDecision{RetryAfter: 1500 * time.Millisecond}, nil}, wantErr: "denied", wantDelay: 2},
		{name: "denied without delay", backend: outcome{RateDecision{}, nil}, wantErr: "denied", wantDelay: 0},
		{name: "denial callback returns nil", backend: outcome{RateDecision{RetryAfter: time.Second}, nil}, denyNil: true, wantErr: "rate_limit_unavailable"},
		{name: "key error", keyErr: errors.New("no identity for " + secretKey), wantErr: "rate_limit_unavailable"},
		{name: "backend error", backend: outcome{RateDecision{Allowed: true}, errors.New("redis down near " + secretKey)}, wantErr: "rate_limit_unavailable"},
		{name: "malformed decision", backend: outcome{RateDecision{Allowed: true, RetryAfter: time.Second}, nil}, wantErr: "rate_limit_unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var backendKey string
			a, _ := NewRateAdmission(func(ctx context.Context, key string) (RateDecision, error) {
				backendKey = key
				return tc.backend.decision, tc.backend.err
			}, time.Second)
			var deniedWith *RateDecision
			mw := a.Middleware(
				func(ctx context.Context, req any) (string, error) {
					if tc.keyErr != nil {
						return "", tc.keyErr
					}
					return req.(string), nil
				},
				func(d RateDecision) error {
					deniedWith = &d
					if tc.denyNil {
						return nil
					}
					return &errDenied{retryAfter: d.RetryAfterSeconds()}
				})
			ctx := context.WithValue(context.Background(), ctxKey{}, "v")
			var nextCtx context.Context
			ep := mw(func(ctx context.Context, req any) (any, error) {
				nextCtx = ctx
				return "ok:" + req.(string), nil
			})
			res, err := ep(ctx, secretKey)

			if tc.keyErr == nil && backendKey != secretKey {
				t.Fatalf("backend got key %q, want the key function's %q", backendKey, secretKey)
			}
			if tc.wantNext != (nextCtx != nil) {
				t.Fatalf("next called: %v, want %v", nextCtx != nil, tc.wantNext)
			}
			switch tc.wantErr {
			case "":
				if err != nil || res != "ok:"+secretKey {
					t.Fatalf("got %v, %v", res, err)
				}
				if nextCtx != ctx {
					t.Fatal("next did not get the caller's own context")
				}
			case "denied":
				var de *errDenied
				if !errors.As(err, &de) || de.retryAfter != tc.wantDelay {
					t.Fatalf("error %v, want the denial error with delay %d", err, tc.wantDelay)
				}
				if deniedWith == nil || *deniedWith != tc.backend.decision {
					t.Fatalf("denied called with %v, want %+v", deniedWith, tc.backend.decision)
				}
			default:
				wantServiceError(t, err, tc.wantErr)
				wantNoLeak(t, err, secretKey, "redis")
			}
			if err != nil && res != nil {
				t.Fatalf("refused call returned %v", res)
			}
		})
	}
}

func TestRateAdmissionMiddlewareCanceled(t *testing.T) {
	keyCalled := false
	a, _ := NewRateAdmission(func(context.Context, string) (RateDecision, error) { return RateDecision{Allowed: true}, nil }, time.Second)
	ep := a.Middleware(
		func(context.Context, any) (string, error) { keyCalled = true; return "k", nil },
		func(RateDecision) error { return errors.New("denied") },
	)(func(context.Context, any) (any, error) { t.Fatal("next ran"); return nil, nil })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ep(ctx, nil); err != context.Canceled {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if keyCalled {
		t.Fatal("key function called for a done context")
	}

	// A key function that fails because the caller left reports the caller's
	// reason, not an unavailable backend.
	ctx2, cancel2 := context.WithCancel(context.Background())
	ep2 := a.Middleware(
		func(context.Context, any) (string, error) { cancel2(); return "", errors.New("lookup aborted") },
		func(RateDecision) error { return errors.New("denied") },
	)(func(context.Context, any) (any, error) { t.Fatal("next ran"); return nil, nil })
	if _, err := ep2(ctx2, nil); err != context.Canceled {
		t.Fatalf("error %v, want context.Canceled", err)
	}
}

func TestRateAdmissionMiddlewarePanicsPropagate(t *testing.T) {
	a, _ := NewRateAdmission(func(context.Context, string) (RateDecision, error) { return RateDecision{}, nil }, time.Second)
	key := func(context.Context, any) (string, error) { return "k", nil }
	next := func(context.Context, any) (any, error) { return nil, nil }
	for _, tc := range []struct {
		name string
		ep   loom.Endpoint
	}{
		{"key", a.Middleware(func(context.Context, any) (string, error) { panic("key") }, func(RateDecision) error { return nil })(next)},
		{"denied", a.Middleware(key, func(RateDecision) error { panic("denied") })(next)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if r := recover(); r != tc.name {
					t.Fatalf("recovered %v, want %q", r, tc.name)
				}
			}()
			tc.ep(context.Background(), nil)
		})
	}
	allow, _ := NewRateAdmission(func(context.Context, string) (RateDecision, error) { return RateDecision{Allowed: true}, nil }, time.Second)
	ep := allow.Middleware(key, func(RateDecision) error { return nil })(func(context.Context, any) (any, error) { panic("next") })
	defer func() {
		if r := recover(); r != "next" {
			t.Fatalf("recovered %v, want \"next\"", r)
		}
	}()
	ep(context.Background(), nil)
}

// TestRateAdmissionWithRate runs a local Rate through RateAdmission end to end.
func TestRateAdmissionWithRate(t *testing.T) {
	r, _ := NewRate(RatePolicy{PerSecond: 1e-6, Burst: 2})
	a, _ := NewRateAdmission(func(ctx context.Context, _ string) (RateDecision, error) { return r.Allow(ctx) }, time.Second)
	for i, want := range []bool{true, true, false} {
		d, err := a.Check(context.Background(), "any")
		if err != nil || d.Allowed != want || d.Version != 1 {
			t.Fatalf("call %d: %+v, %v; want allowed %v at version 1", i, d, err, want)
		}
		if !want && d.RetryAfterSeconds() != 1_000_000 {
			t.Fatalf("RetryAfterSeconds %d, want 1000000", d.RetryAfterSeconds())
		}
	}
}
