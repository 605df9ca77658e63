package redistest

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPickFaketime(t *testing.T) {
	t.Parallel()
	have := map[string]bool{
		"/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1": true,
		"/lib/x86_64-linux-gnu/libc.so.6":                     true,
		"/opt/faketime/libfaketime.so.1":                      true,
	}
	exists := func(p string) bool { return have[p] }
	lib, libc, err := pickFaketime([]string{"/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
		"/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"}, exists)
	if err != nil || lib != "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1" || libc != "/lib/x86_64-linux-gnu/libc.so.6" {
		t.Errorf("pickFaketime = %q, %q, %v; want the amd64 library and /lib's libc", lib, libc, err)
	}
	if _, _, err := pickFaketime([]string{"/opt/faketime/libfaketime.so.1"}, exists); err == nil || !strings.Contains(err.Error(), "libc") {
		t.Errorf("a library without a libc beside it: %v, want an error naming libc", err)
	}
	_, _, err = pickFaketime(nil, exists)
	if err == nil || !strings.Contains(err.Error(), "apt-get install libfaketime") {
		t.Fatalf("nothing found: %v, want the install hint", err)
	}
	if fail, msg := verdict(err, faketimePackage, true); !fail || !strings.Contains(msg, "CI is set") {
		t.Errorf("missing libfaketime under CI: fail=%v %q, want a failure", fail, msg)
	}
	if fail, _ := verdict(err, faketimePackage, false); fail {
		t.Error("missing libfaketime off CI fails, want a skip")
	}
	if fail, _ := verdict(errNoMovableClock, faketimePackage, true); fail {
		t.Error("no movable clock on this OS fails under CI, want a skip: no install can fix it")
	}
}

func TestSetClockOffsetNeedsMovableClock(t *testing.T) {
	t.Parallel()
	s := Start(t)
	if err := s.SetClockOffset(time.Minute); !errors.Is(err, errFixedClock) {
		t.Fatalf("SetClockOffset on a plain server: %v, want errFixedClock", err)
	}
}

// TestMovableClock checks what the fault scenarios rely on: moving the
// clock moves TIME as a script reads it, both ways, and key expiry
// follows the moved clock (Redis 7 expires by its wall clock).
func TestMovableClock(t *testing.T) {
	t.Parallel()
	s := Start(t, WithMovableClock())
	c := s.Client(t)
	scriptTime := func() time.Duration {
		t.Helper()
		v, err := c.Eval(ctxTimeout(t, 2*time.Second), "local t = redis.call('TIME') return t[1] * 1000000 + t[2]", nil).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return time.UnixMicro(v).Sub(time.Now())
	}
	near := func(got, want time.Duration) bool { return (got - want).Abs() < time.Second }
	if d := scriptTime(); !near(d, 0) {
		t.Fatalf("TIME in a script is %v off before any move", d)
	}
	ctx := ctxTimeout(t, 10*time.Second)
	c.Set(ctx, "short", "v", time.Minute)
	c.Set(ctx, "long", "v", 10*time.Minute)

	if err := s.SetClockOffset(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	if d := scriptTime(); !near(d, 2*time.Minute) {
		t.Fatalf("TIME in a script is %v off after a move of +2m", d)
	}
	if n := c.Exists(ctx, "short").Val(); n != 0 {
		t.Errorf("a key with a 1m TTL survived a jump of +2m")
	}
	if ttl := c.PTTL(ctx, "long").Val(); !near(ttl, 8*time.Minute) {
		t.Errorf("a 10m TTL reads %v after a jump of +2m, want about 8m", ttl)
	}

	if err := s.SetClockOffset(-2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	if d := scriptTime(); !near(d, -2*time.Minute) {
		t.Fatalf("TIME in a script is %v off after a move to -2m", d)
	}
	if ttl := c.PTTL(ctx, "long").Val(); !near(ttl, 12*time.Minute) {
		t.Errorf("a 10m TTL reads %v with the clock 2m behind, want about 12m", ttl)
	}

	s.Restart(t) // the offset outlives a restart
	if d := scriptTime(); !near(d, -2*time.Minute) {
		t.Fatalf("TIME is %v off after a restart, want the offset of -2m kept", d)
	}
	if s.ClockOffset() != -2*time.Minute {
		t.Errorf("ClockOffset() = %v", s.ClockOffset())
	}
}
