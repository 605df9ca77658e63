// Package redistest runs real redis-server processes, standalone or as a Redis
// Cluster, for tests that need what an embedded fake cannot give: real Lua and
// TIME semantics, persistence across restarts, and faults such as a killed,
// paused or restarted server.
//
// Every server listens on a random loopback port in its own temporary
// directory and dies with its test, so test packages can run in parallel.
// It runs on Unix-like systems (Linux, macOS, the BSDs); on Linux a server
// also dies with a crashed test binary. Elsewhere Require and Start skip
// the test and say why.
package redistest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/internal/childproc"
	"github.com/runbudget/runbudget/internal/loopback"
)

const (
	// readyTimeout bounds how long one start waits for PING to answer. A
	// fresh server answers in milliseconds; the slack covers loaded CI
	// machines and replaying a large AOF after Restart.
	readyTimeout = 10 * time.Second
	// startAttempts bounds retries after losing a port race: a port is
	// probed free and then closed, so another process may take it before
	// redis-server binds it.
	startAttempts = 5
	// stopTimeout bounds a graceful Stop before it escalates to SIGKILL:
	// Redis 7 waits for lagging replicas on SIGTERM (shutdown-timeout, 10s).
	stopTimeout = 15 * time.Second
	// clusterTimeout bounds forming a cluster and waiting for it to be ok.
	clusterTimeout = 30 * time.Second
	// pollInterval is the readiness polling period: no event tells us that
	// another process is ready, so polling is the honest tool here.
	pollInterval = 20 * time.Millisecond
	// logTailLines is how much of a server's log a failure message carries.
	logTailLines = 30
)

// Path returns the redis-server binary path, or an error naming what is
// missing and how to install it, or why this OS cannot run the harness.
func Path() (string, error) { return lookTool("redis-server") }

func lookTool(name string) (string, error) {
	if errPlatform != nil {
		return "", errPlatform
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("redistest: %w (Debian/Ubuntu: apt-get install redis-server redis-tools)", err)
	}
	return p, nil
}

// Require skips the test when redis-server cannot run here, and says why:
// it is missing, or this OS lacks what the harness needs (Unix signals;
// macOS and the BSDs have them, Windows does not). A missing redis-server
// fails the test instead when the environment says CI (CI=true, or any
// value strconv.ParseBool accepts as true): a CI run that silently skipped
// every Redis test would look green while testing nothing. An unfit OS
// skips even under CI, since no install can fix it.
func Require(t testing.TB) {
	t.Helper()
	requireTool(t, "redis-server")
}

func requireTool(t testing.TB, name string) string {
	t.Helper()
	p, err := lookTool(name)
	if err == nil {
		return p
	}
	fail, msg := verdict(err, name, inCI())
	if fail {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// errUnfitOS is wrapped by errPlatform on an OS the harness cannot run on.
var errUnfitOS = errors.New("redistest: this OS cannot run redis-server tests")

// verdict decides what a test does when name cannot be used: fail (true)
// or skip, with the message to give.
func verdict(err error, name string, ci bool) (fail bool, msg string) {
	switch {
	case errors.Is(err, errUnfitOS):
		return false, fmt.Sprintf("%v; skipping (also under CI: no install can fix this)", err)
	case ci:
		return true, fmt.Sprintf("%v; CI is set, so a missing %s fails the test instead of skipping it", err, name)
	}
	return false, fmt.Sprintf("%v; skipping (with CI=true this is a failure)", err)
}

func inCI() bool {
	ci, err := strconv.ParseBool(os.Getenv("CI"))
	return err == nil && ci
}

// Option configures a server started by Start or StartCluster.
type Option func(*config)

type config struct {
	lines []string
	// cluster makes every start pick a client port whose bus port is free too.
	cluster bool
	// sentinel holds the lines WithSentinelConfig adds to every sentinel.conf
	// of StartSentinel.
	sentinel []string
	// pickPort chooses a port per start attempt; tests replace it to force a
	// bind failure.
	pickPort func(cluster bool) (int, error)
	// movable starts the server under libfaketime (WithMovableClock).
	movable bool
}

// WithConfig appends redis.conf lines, for example "maxmemory 10mb",
// "appendonly yes" or "requirepass s3cret". They come after the harness's own
// lines, so they override its defaults (save "", appendonly no, ...). A string
// may hold several lines separated by newlines. The directives bind, port,
// dir, daemonize, logfile, unixsocket, cluster-port and include are refused
// (the test fails): the harness owns them, because they decide where the
// server listens and whether it can be found, stopped and cleaned up.
func WithConfig(lines ...string) Option {
	return func(c *config) {
		for _, l := range lines {
			c.lines = append(c.lines, strings.Split(l, "\n")...)
		}
	}
}

// ownedDirectives are the config directives the harness sets and refuses to
// take from WithConfig.
var ownedDirectives = map[string]bool{
	"bind": true, "port": true, "dir": true, "daemonize": true,
	"logfile": true, "unixsocket": true, "cluster-port": true,
	// An included file could rebind the server, so it is refused as well.
	"include": true,
}

// checkLines rejects lines that would move the server off its loopback port
// or out of its directory, and returns the password set by the last
// requirepass line, if any.
func checkLines(lines []string) (password string, err error) {
	for _, l := range lines {
		name, arg := directive(l)
		switch {
		case ownedDirectives[name]:
			return "", fmt.Errorf("redistest: WithConfig may not set %q: the harness owns it", name)
		case name == "requirepass":
			password = unquoteArg(arg)
		}
	}
	return password, nil
}

// directive splits a config line into its lowercased name and the rest.
func directive(line string) (name, arg string) {
	line = strings.TrimSpace(line)
	if line == "" || line[0] == '#' {
		return "", ""
	}
	i := strings.IndexAny(line, " \t")
	if i < 0 {
		return strings.ToLower(line), ""
	}
	return strings.ToLower(line[:i]), strings.TrimSpace(line[i+1:])
}

// unquoteArg undoes the quoting a redis.conf argument may carry; Redis's
// escapes within double quotes are a subset of Go's.
func unquoteArg(arg string) string {
	if len(arg) >= 2 && (arg[0] == '"' || arg[0] == '\'') && arg[len(arg)-1] == arg[0] {
		if arg[0] == '\'' {
			return arg[1 : len(arg)-1]
		}
		if s, err := strconv.Unquote(arg); err == nil {
			return s
		}
	}
	return arg
}

// quoteArg quotes a path for redis.conf: t.TempDir names keep spaces and
// other characters of the test name.
func quoteArg(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\r", `\r`)
	return `"` + r.Replace(s) + `"`
}

// freePort picks a loopback port for a server (see loopback.FreePort).
func freePort(cluster bool) (int, error) {
	port, err := loopback.FreePort(cluster)
	if err != nil {
		return 0, fmt.Errorf("redistest: %w", err)
	}
	return port, nil
}

// Server is one redis-server process owned by a test. Its methods are safe
// for concurrent use, so a test can kill or pause it while other goroutines
// use it.
type Server struct {
	bin      string
	dir      string
	conf     string
	logPath  string
	stdio    string
	password string
	lines    []string
	cluster  bool
	args     []string // after the config file on the command line ("--sentinel")
	// env is added to the server's environment (the libfaketime preload of
	// WithMovableClock); nil for a plain server.
	env []string
	// clockFile holds the wall-clock offset libfaketime applies, rewritten
	// before every launch so that a restart keeps the offset; "" when the
	// clock is not movable.
	clockFile string

	mu     sync.Mutex
	offset time.Duration // the server's wall clock minus the real one
	port   int
	proc   *process // the latest process; nil before the first start
	paused bool     // SIGSTOP sent and no SIGCONT since
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once Wait returned
	err  error         // Wait's result, readable after done is closed
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Start starts a redis-server on a random free 127.0.0.1 port, in its own
// t.TempDir, and returns once it answers PING. It skips or fails the test as
// Require does when redis-server is missing, and fails the test when the
// server cannot start; the error carries the tail of the server's log. The
// server is killed, and waited for, when the test and its subtests finish.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	bin := requireTool(t, "redis-server")
	cfg := config{pickPort: freePort}
	for _, o := range opts {
		o(&cfg)
	}
	s, err := newServer(t, bin, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.movable {
		requireMovableClock(t, s)
	}
	if err := s.startFresh(cfg.pickPort); err != nil {
		t.Fatal(err)
	}
	return s
}

// newServer prepares the directory and registers the cleanup; it starts
// nothing.
func newServer(t testing.TB, bin string, cfg config) (*Server, error) {
	password, err := checkLines(cfg.lines)
	if err != nil {
		return nil, err
	}
	// TempDir before Cleanup: cleanups run last-registered first, so the
	// process is dead before its directory is removed under it.
	dir := t.TempDir()
	s := &Server{
		bin:      bin,
		dir:      dir,
		conf:     filepath.Join(dir, "redis.conf"),
		logPath:  filepath.Join(dir, "redis.log"),
		stdio:    filepath.Join(dir, "stdio.log"),
		password: password,
		lines:    cfg.lines,
		cluster:  cfg.cluster,
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("redistest: %s log tail:\n%s", s.Addr(), s.logTail())
		}
		s.Kill()
	})
	return s, nil
}

// startFresh starts the first process, on a new port for every attempt that
// loses a port race.
func (s *Server) startFresh(pickPort func(bool) (int, error)) error {
	var err error
	for range startAttempts {
		var port int
		if port, err = pickPort(s.cluster); err != nil {
			return err
		}
		s.mu.Lock()
		s.port = port
		s.mu.Unlock()
		// A failed attempt may have left state behind (a cluster node writes
		// nodes.conf, naming its old port, before it binds): start clean.
		if err := s.clearDir(); err != nil {
			return err
		}
		if err = s.launch(); err == nil || !errors.Is(err, errAddrInUse) {
			return err
		}
	}
	return err
}

func (s *Server) clearDir() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
			return fmt.Errorf("redistest: %w", err)
		}
	}
	return nil
}

var errAddrInUse = errors.New("address already in use")

// launch writes the config, starts a process on s.port and waits for PING.
func (s *Server) launch() error {
	port := s.Port()
	if err := os.WriteFile(s.conf, []byte(s.configText(port)), 0o600); err != nil {
		return fmt.Errorf("redistest: write config: %w", err)
	}
	if err := s.writeClockFile(); err != nil {
		return err
	}
	stdio, err := os.OpenFile(s.stdio, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	// Redis reports config errors on stderr, before it opens its logfile.
	cmd := exec.Command(s.bin, append([]string{s.conf}, s.args...)...)
	cmd.Dir = s.dir
	if s.env != nil {
		cmd.Env = append(os.Environ(), s.env...)
	}
	cmd.Stdout = stdio
	cmd.Stderr = stdio
	childproc.DieWithParent(cmd) // no orphan server if the test binary crashes
	err = cmd.Start()
	stdio.Close() // the child holds its own copy
	if err != nil {
		return fmt.Errorf("redistest: start %s: %w", s.bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.mu.Lock()
	s.proc = p
	s.paused = false
	s.mu.Unlock()

	if err := s.waitReady(p); err != nil {
		_ = p.cmd.Process.Kill()
		<-p.done
		tail := s.logTail()
		if strings.Contains(tail, "Address already in use") {
			err = fmt.Errorf("%w: %w", err, errAddrInUse)
		}
		return fmt.Errorf("%w\n%s", err, tail)
	}
	return nil
}

func (s *Server) configText(port int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "bind 127.0.0.1\nport %d\ndir %s\nlogfile %s\n", port, quoteArg(s.dir), quoteArg(s.logPath))
	b.WriteString("daemonize no\nprotected-mode yes\nsave \"\"\nappendonly no\n")
	for _, l := range s.lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// waitReady polls PING until it answers, the process exits or readyTimeout
// passes. A restarted server answers LOADING while it replays its AOF or RDB:
// that counts as not ready yet.
func (s *Server) waitReady(p *process) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	// A PING must not outlive the process: after a lost port race it may have
	// reached whoever holds the port, which never answers.
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		err := ping(pctx, s.Addr(), s.password)
		pcancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			if p.exited() {
				return fmt.Errorf("redistest: redis-server on %s exited before answering PING: %v", s.Addr(), p.err)
			}
			return fmt.Errorf("redistest: redis-server on %s did not answer PING within %v: %v", s.Addr(), readyTimeout, err)
		case <-tick.C:
		}
	}
}

// ping sends AUTH (with a password) and PING on a fresh connection and checks
// the replies. It speaks RESP directly rather than through go-redis because a
// go-redis pool that failed to dial hands out that error for a while and
// redials in the background, at its own pace, logging each failure: wrong for
// polling a server that is still starting.
func ping(ctx context.Context, addr, password string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	var req bytes.Buffer
	want := []string{"+PONG"}
	if password != "" {
		writeCommand(&req, "AUTH", password)
		want = []string{"+OK", "+PONG"}
	}
	writeCommand(&req, "PING")
	if _, err := conn.Write(req.Bytes()); err != nil {
		return err
	}
	r := bufio.NewReader(conn)
	for _, w := range want {
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if line = strings.TrimRight(line, "\r\n"); line != w {
			return fmt.Errorf("reply %q, want %q", line, w)
		}
	}
	return nil
}

// writeCommand encodes a command as a RESP array of bulk strings.
func writeCommand(b *bytes.Buffer, args ...string) {
	fmt.Fprintf(b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(b, "$%d\r\n%s\r\n", len(a), a)
	}
}

// logTail returns the last lines of the server's log and of its stdout and
// stderr, for failure messages.
func (s *Server) logTail() string {
	return "--- redis.log (tail) ---\n" + tailFile(s.logPath, logTailLines) +
		"--- stdout/stderr (tail) ---\n" + tailFile(s.stdio, logTailLines)
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)\n", err)
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, nil))
}

// Port returns the server's port; it never changes after Start returns.
func (s *Server) Port() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.port
}

// Addr returns "127.0.0.1:port".
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port()))
}

// URL returns "redis://127.0.0.1:port/0", with the password when the config
// set requirepass, in the form redis.ParseURL accepts.
func (s *Server) URL() string {
	u := url.URL{Scheme: "redis", Host: s.Addr(), Path: "/0"}
	if s.password != "" {
		u.User = url.UserPassword("", s.password)
	}
	return u.String()
}

// Dir returns the server's data directory, where its config, log, RDB and
// AOF files live.
func (s *Server) Dir() string { return s.dir }

// Pid returns the process ID of the latest redis-server process, which may
// have exited; 0 before the first start.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

// Client returns a client for this server with ContextTimeoutEnabled, so a
// ctx deadline bounds every call. It is closed when the test finishes; it
// keeps working across Restart because the address does not change.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  s.Addr(),
		Password:              s.password,
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *Server) current() *process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// Kill sends SIGKILL and waits for the process to exit: a crash, with no
// final AOF fsync or RDB save. It works on a paused server too. Killing an
// exited server does nothing.
func (s *Server) Kill() {
	p := s.current()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Stop shuts the server down gracefully with SIGTERM and waits for it to
// exit. SIGTERM rather than SHUTDOWN NOSAVE because it needs no connection
// and reaches a paused server (SIGCONT follows it). With the default config
// (save "") nothing is saved, as with NOSAVE; with save points or AOF set, the
// server saves or fsyncs as on any clean shutdown. If it has not exited after
// 15s it is killed. Stopping an exited server does nothing.
func (s *Server) Stop() {
	p := s.current()
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(sigTerm)
	_ = p.cmd.Process.Signal(sigCont)
	s.setPaused(false)
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Pause freezes the server with SIGSTOP: connections stay open but nothing is
// answered, like a stalled host or a partition that drops no packets. On Linux
// Pause returns once the kernel reports the process stopped, so a command sent
// afterwards cannot slip through. Resume undoes it.
func (s *Server) Pause() {
	p := s.current()
	if p == nil || p.exited() {
		return
	}
	if p.cmd.Process.Signal(sigStop) == nil {
		s.setPaused(true)
		waitStopped(p.cmd.Process.Pid, p.done)
	}
}

// Resume continues a paused server with SIGCONT. Resuming a running or exited
// server does nothing.
func (s *Server) Resume() {
	p := s.current()
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(sigCont)
	s.setPaused(false)
}

func (s *Server) setPaused(paused bool) {
	s.mu.Lock()
	s.paused = paused
	s.mu.Unlock()
}

// answering reports whether the server can answer now: running and not
// paused.
func (s *Server) answering() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil && !s.proc.exited() && !s.paused
}

// Restart starts the server again on the same port and in the same directory,
// so its AOF, RDB and (for a cluster node) nodes.conf are reused, and waits
// until it answers PING. A running server is stopped first, as by Stop. If the
// port has been taken meanwhile, Restart retries for a few seconds and then
// fails the test; it never moves to another port.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	var err error
	for i := range startAttempts {
		if err = s.launch(); err == nil || !errors.Is(err, errAddrInUse) {
			break
		}
		time.Sleep(time.Duration(i+1) * 200 * time.Millisecond) // wait for the port's other user to go
	}
	if err != nil {
		t.Fatalf("redistest: restart: %v", err)
	}
}

// withPortPicker replaces how ports are chosen, so tests can force a lost
// port race.
func withPortPicker(pick func(cluster bool) (int, error)) Option {
	return func(c *config) { c.pickPort = pick }
}
