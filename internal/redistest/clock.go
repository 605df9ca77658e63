package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A movable clock: the server runs under libfaketime, which shifts what
// its wall clock reads (gettimeofday, clock_gettime(CLOCK_REALTIME), so
// TIME, key expiry and every other wall-clock use inside Redis) by an
// offset read from a file on every call. Redis's timers run on the
// monotonic clock, which stays real (FAKETIME_DONT_FAKE_MONOTONIC), so the
// server keeps its pace while its idea of the date jumps.
//
// Debian's redis-server links jemalloc, which cannot start under
// libfaketime: jemalloc reads the clock while it initializes, libfaketime
// allocates while it initializes, and the two deadlock (libfaketime issues
// 130 and 327). Preloading libc after libfaketime makes malloc and free
// resolve to glibc's, so jemalloc is never used to allocate and never
// initializes first; Redis's few jemalloc-only calls (statistics) still
// resolve to jemalloc and only report its own, idle, arenas.

// faketimePackage is the Debian package that ships libfaketime.
const faketimePackage = "libfaketime"

// errNoMovableClock is wrapped by what lookFaketime returns on an OS where
// an LD_PRELOAD library cannot move a server's clock.
var errNoMovableClock = fmt.Errorf("%w: a movable clock needs Linux (libfaketime through LD_PRELOAD)", errUnfitOS)

// WithMovableClock starts the server (Start only) under libfaketime, so
// that SetClockOffset can move its wall clock while it runs. The test skips
// when libfaketime is not installed (Debian: apt-get install libfaketime),
// and fails instead when CI is set, as for a missing redis-server.
func WithMovableClock() Option { return func(c *config) { c.movable = true } }

// requireMovableClock prepares s to run under libfaketime, or skips or
// fails t as Require does.
func requireMovableClock(t testing.TB, s *Server) {
	t.Helper()
	lib, libc, err := lookFaketime()
	if err != nil {
		fail, msg := verdict(err, faketimePackage, inCI())
		if fail {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	s.clockFile = filepath.Join(s.dir, "faketime.offset")
	s.env = []string{
		"LD_PRELOAD=" + lib + " " + libc,
		"FAKETIME_TIMESTAMP_FILE=" + s.clockFile,
		"FAKETIME_NO_CACHE=1", // read the offset on every call: a move is seen at once
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
	}
}

// multiarch maps GOARCH to Debian's multiarch triple, the directory under
// /usr/lib where the architecture's libraries live.
var multiarch = map[string]string{
	"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu", "386": "i386-linux-gnu",
	"arm": "arm-linux-gnueabihf", "ppc64le": "powerpc64le-linux-gnu", "s390x": "s390x-linux-gnu",
	"riscv64": "riscv64-linux-gnu", "mips64le": "mips64el-linux-gnuabi64", "loong64": "loongarch64-linux-gnu",
}

// lookFaketime finds libfaketime and the libc to preload after it: first
// at Debian's multiarch path, then wherever dpkg says the package put it.
func lookFaketime() (lib, libc string, err error) {
	if runtime.GOOS != "linux" {
		return "", "", errNoMovableClock
	}
	var candidates []string
	if triple, ok := multiarch[runtime.GOARCH]; ok {
		candidates = append(candidates, filepath.Join("/usr/lib", triple, "faketime", "libfaketime.so.1"))
	}
	if out, err := exec.Command("dpkg", "-L", faketimePackage).Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasSuffix(l, "/libfaketime.so.1") {
				candidates = append(candidates, l)
			}
		}
	}
	return pickFaketime(candidates, fileExists)
}

// pickFaketime returns the first candidate that exists, with the libc of
// its architecture: the libc.so.6 in the multiarch directory above
// libfaketime's, or in /lib's of the same name.
func pickFaketime(candidates []string, exists func(string) bool) (lib, libc string, err error) {
	for _, c := range candidates {
		if !exists(c) {
			continue
		}
		arch := filepath.Dir(filepath.Dir(c)) // /usr/lib/<triple>
		for _, l := range []string{filepath.Join(arch, "libc.so.6"), filepath.Join("/lib", filepath.Base(arch), "libc.so.6")} {
			if exists(l) {
				return c, l, nil
			}
		}
		return "", "", fmt.Errorf("redistest: found %s but no libc.so.6 beside it to preload", c)
	}
	return "", "", fmt.Errorf("redistest: libfaketime.so.1 not found (Debian/Ubuntu: apt-get install %s)", faketimePackage)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// writeClockFile writes the current offset where libfaketime reads it, in
// the form it parses: signed seconds with a fraction. No-op for a server
// whose clock is not movable.
func (s *Server) writeClockFile() error {
	if s.clockFile == "" {
		return nil
	}
	s.mu.Lock()
	off := s.offset
	s.mu.Unlock()
	text := strconv.FormatFloat(off.Seconds(), 'f', 6, 64)
	if off >= 0 {
		text = "+" + text
	}
	// Written aside and renamed: libfaketime must never read half a file.
	tmp := s.clockFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(text+"\n"), 0o600); err != nil {
		return fmt.Errorf("redistest: write clock offset: %w", err)
	}
	if err := os.Rename(tmp, s.clockFile); err != nil {
		return fmt.Errorf("redistest: write clock offset: %w", err)
	}
	return nil
}

// errFixedClock is returned by SetClockOffset on a server started without
// WithMovableClock.
var errFixedClock = errors.New("redistest: the server was started without WithMovableClock")

// ClockOffset is how far the server's wall clock is set from the real one.
func (s *Server) ClockOffset() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.offset
}

// SetClockOffset sets the server's wall clock to the real time plus d (a
// jump by the difference to the previous offset, either way) and returns
// once TIME on the server reads it, within 5 s. A paused or stopped server
// takes the offset when it runs again. The offset survives Restart.
func (s *Server) SetClockOffset(d time.Duration) error {
	if s.clockFile == "" {
		return errFixedClock
	}
	s.mu.Lock()
	s.offset = d
	s.mu.Unlock()
	if err := s.writeClockFile(); err != nil {
		return err
	}
	if !s.answering() {
		return nil
	}
	return s.waitClock(d, 5*time.Second)
}

// waitClock polls TIME until the server's clock reads the real time plus
// d. The file is read on every clock call, so the first TIME normally
// shows it; the loop covers a server busy with a slow command.
func (s *Server) waitClock(d, within time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), Password: s.password, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	var last error
	for {
		before := time.Now()
		at, err := c.Time(ctx).Result()
		if err == nil {
			// Redis reports microseconds, read between before and now.
			lo, hi := before.Add(d-time.Millisecond), time.Now().Add(d+time.Millisecond)
			if !at.Before(lo) && !at.After(hi) {
				return nil
			}
			last = fmt.Errorf("TIME reads %v, want %v (offset %v)", at.Sub(before), d, d)
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: the server's clock did not take offset %v: %v", d, last)
		case <-time.After(pollInterval):
		}
	}
}
