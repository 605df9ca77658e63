// Command budgetctl looks after runbudget budgets kept in Redis (list,
// inspect, watch, and the repairs an operator needs), and runs the demo that
// shows what one shared budget changes for a job spread over many hosts and
// lanes.
//
// Exit codes, for scripts:
//
//	0  the command did what it was asked
//	1  the operation failed (Redis unreachable or refusing, a worker failed, ...)
//	2  usage error: unknown command or flag, malformed domain, limits or Redis URL
//	3  no budget of that name exists in this Redis
//	4  a destructive command was not confirmed
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/redisstore"
	"github.com/spf13/cobra"
)

// Exit codes; see the package doc.
const (
	exitOK       = 0
	exitFailed   = 1
	exitUsage    = 2
	exitNoBudget = 3
	exitDeclined = 4
)

const exitCodesHelp = `Exit codes:
  0  success
  1  the operation failed (Redis unreachable, a refused password, a failed worker)
  2  usage error (unknown flag or command, malformed domain, limits or URL)
  3  no budget of that name in this Redis
  4  a destructive command was not confirmed`

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// app holds what every command shares: the global flags and the streams.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	redisURL string
	json     bool
	timeout  time.Duration

	// secrets are the credentials found in the Redis URL; every message
	// budgetctl prints goes through redact, which masks them.
	secrets []string
}

// run executes one command line and returns the process exit code. Tests
// call it in-process; main calls it with the real streams.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// go-redis logs dial failures and pool trouble on its own; the commands
	// report what matters in their errors, once, and without credentials.
	redis.SetLogger(quietLogger{})
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	code := exitCode(err)
	fmt.Fprintln(stderr, "budgetctl: "+a.redact(err.Error()))
	if code == exitUsage {
		if _, ok := errors.AsType[*cmdError](err); !ok {
			fmt.Fprintln(stderr, "Run 'budgetctl --help' for usage.")
		}
	}
	return code
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "budgetctl",
		Short: "Operate runbudget budgets in Redis, and run the demo",
		Long: `budgetctl shows and repairs the run budgets that runbudget keeps in Redis,
and runs the demo: a copy job spread over several processes, with and
without one shared budget.

The operator commands need a Redis: --redis URL, or the REDIS_URL
environment variable (redis://[user:password@]host:port/db, or rediss://
for TLS). The URL and its password are never printed.

` + exitCodesHelp,
		SilenceErrors: true,
		SilenceUsage:  true,
		// Bare "budgetctl" prints help and succeeds, like --help.
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError("%v", err) })
	pf := root.PersistentFlags()
	pf.StringVar(&a.redisURL, "redis", "", "Redis URL (default $REDIS_URL)")
	pf.BoolVar(&a.json, "json", false, "print JSON instead of tables (read commands and the demo report)")
	pf.DurationVar(&a.timeout, "timeout", 10*time.Second, "bound on each command's Redis calls")

	root.AddGroup(
		&cobra.Group{ID: "ops", Title: "Operator commands (need a Redis):"},
		&cobra.Group{ID: "demo", Title: "Demo:"},
	)
	for _, c := range []*cobra.Command{a.listCommand(), a.inspectCommand(), a.watchCommand(),
		a.throttleCommand(), a.resetCommand(), a.limitsCommand(), a.dropLeasesCommand(), a.librariesCommand()} {
		c.GroupID = "ops"
		c.Long += "\n\n" + exitCodesHelp
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.demoCommand(), a.workerCommand(), a.providerCommand()} {
		c.GroupID = "demo"
		root.AddCommand(c)
	}
	root.SetHelpCommandGroupID("ops")
	return root
}

// cmdError is an error from a command's own work, carrying its exit code.
// Errors that reach run without this type come from cobra rejecting the
// command line, which makes them usage errors.
type cmdError struct {
	code int
	err  error
}

func (e *cmdError) Error() string { return e.err.Error() }
func (e *cmdError) Unwrap() error { return e.err }

func usageError(format string, args ...any) error {
	return &cmdError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

func failure(format string, args ...any) error {
	return &cmdError{code: exitFailed, err: fmt.Errorf(format, args...)}
}

// classify gives a command's error its exit code, from the sentinel it
// wraps; errors already classified keep theirs.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*cmdError](err); ok {
		return err
	}
	code := exitFailed
	switch {
	case errors.Is(err, redisstore.ErrNoBudget):
		code = exitNoBudget
	case errors.Is(err, budget.ErrInvalidDomain), errors.Is(err, budget.ErrInvalidLimits),
		errors.Is(err, budget.ErrInvalidRequest):
		code = exitUsage
	}
	return &cmdError{code: code, err: err}
}

func exitCode(err error) int {
	if e, ok := errors.AsType[*cmdError](err); ok {
		return e.code
	}
	return exitUsage
}

// runE adapts a command body: its errors are classified for the exit code.
func runE(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error { return classify(fn(cmd, args)) }
}

// exactArgs is cobra.ExactArgs with a usage error that names what is
// missing.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return usageError("%s takes %d argument(s) (%s), got %d", cmd.Name(), len(names), strings.Join(names, " "), len(args))
		}
		return nil
	}
}

// opContext bounds one command's Redis work by --timeout.
func (a *app) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.timeout)
}

// opAdmin is the start of an operator command: a context bounded by
// --timeout, and operator access through a fresh client. done releases
// both.
func (a *app) opAdmin(cmd *cobra.Command) (ctx context.Context, adm *redisstore.Admin, done func(), err error) {
	ctx, cancel := a.opContext(cmd.Context())
	adm, release, err := a.admin(ctx)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return ctx, adm, func() { release(); cancel() }, nil
}

// admin connects and returns operator access; done releases the client.
func (a *app) admin(ctx context.Context) (adm *redisstore.Admin, done func(), err error) {
	c, err := a.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	adm, err = redisstore.NewAdmin(c)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return adm, func() { c.Close() }, nil
}

// connect opens a client for --redis (or $REDIS_URL) and checks it with a
// PING, so a wrong address or password fails here with a clear message.
func (a *app) connect(ctx context.Context) (*redis.Client, error) {
	raw, err := a.redisTarget()
	if err != nil {
		return nil, err
	}
	return a.dial(ctx, raw)
}

// dial opens a client for the Redis URL raw and checks it as connect does.
// A malformed URL is a usage error that never shows the URL.
func (a *app) dial(ctx context.Context, raw string) (*redis.Client, error) {
	opt, err := redisOptions(raw)
	if err != nil {
		return nil, err
	}
	c := redis.NewClient(opt)
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, describeRedisError(opt.Addr, err)
	}
	return c, nil
}

// redisTarget returns the Redis URL from --redis or $REDIS_URL, and
// remembers its credentials for redaction.
func (a *app) redisTarget() (string, error) {
	raw := a.redisURL
	if raw == "" {
		raw = os.Getenv("REDIS_URL")
	}
	if raw == "" {
		return "", usageError("no Redis given: pass --redis URL or set REDIS_URL")
	}
	a.secrets = append(a.secrets, urlSecrets(raw)...)
	return raw, nil
}

// redisOptions parses a Redis URL into client options with the settings
// budgetctl needs: deadlines that bound every call (redisstore requires
// ContextTimeoutEnabled), short dial and read timeouts, and one retry.
func redisOptions(raw string) (*redis.Options, error) {
	opt, err := parseRedisURL(raw)
	if err != nil {
		return nil, err
	}
	opt.ContextTimeoutEnabled = true
	opt.DialTimeout = 3 * time.Second
	opt.ReadTimeout = 3 * time.Second
	opt.WriteTimeout = 3 * time.Second
	opt.MaxRetries = 1
	return opt, nil
}

// describeRedisError turns a failed first call into a message that names
// the problem and the address, never the URL.
func describeRedisError(addr string, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "WRONGPASS"), strings.Contains(msg, "invalid password"),
		strings.Contains(msg, "invalid username-password"):
		return failure("Redis at %s refused the credentials in the URL (%s)", addr, firstLine(msg))
	case strings.Contains(msg, "NOAUTH"):
		return failure("Redis at %s needs a password, and the URL has none", addr)
	case errors.Is(err, context.DeadlineExceeded):
		return failure("Redis at %s did not answer in time", addr)
	}
	return failure("cannot reach Redis at %s: %s", addr, firstLine(msg))
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// redact masks every credential budgetctl has seen in a Redis URL.
func (a *app) redact(s string) string { return redactSecrets(s, a.secrets) }

func redactSecrets(s string, secrets []string) string {
	for _, sec := range secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, "[redacted]")
		}
	}
	return s
}
