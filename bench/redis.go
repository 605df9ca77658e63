package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/internal/childproc"
	"github.com/runbudget/runbudget/internal/loopback"
)

// server is a redis-server this program started for itself: loopback only,
// no persistence, in a temporary directory, killed when the program ends.
type server struct {
	addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has been waited for
}

// startServer starts bin (a redis-server) on a free 127.0.0.1 port. A lost
// port race (another process bound the port between our probe and the
// server's bind) is retried on a new port. With cluster set the server is
// a Cluster node without slots (cluster-enabled yes); startCluster forms
// the cluster.
func startServer(ctx context.Context, bin string, cluster bool) (*server, error) {
	var lastErr error
	for range 5 {
		s, err := launchServer(ctx, bin, cluster)
		if err == nil {
			return s, nil
		}
		lastErr = err
		if !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	return nil, lastErr
}

func launchServer(ctx context.Context, bin string, cluster bool) (*server, error) {
	port, err := loopback.FreePort(cluster)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "runbudget-bench-redis-")
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "redis.log")
	// The config goes in on stdin ("-" as the file name), so nothing but the
	// log is written to disk. save "" and appendonly no: no persistence, no
	// fork for a background save in the middle of a measurement.
	conf := strings.Join([]string{
		"bind 127.0.0.1",
		"protected-mode yes",
		"port " + strconv.Itoa(port),
		"dir " + strconv.Quote(dir),
		"logfile " + strconv.Quote(logPath),
		"daemonize no",
		`save ""`,
		"appendonly no",
		"maxmemory-policy noeviction",
		"slowlog-max-len 4096",
	}, "\n") + "\n"
	if cluster {
		// nodes.conf goes in the temporary directory with the log.
		conf += "cluster-enabled yes\ncluster-config-file nodes.conf\n"
	}
	cmd := exec.Command(bin, "-")
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(conf)
	childproc.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	track(cmd.Process.Pid)
	s := &server{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(s.done)
	}()
	if err := s.waitReady(ctx); err != nil {
		tail := tailFile(logPath, 20)
		s.stop()
		return nil, fmt.Errorf("%w\n%s", err, tail)
	}
	return s, nil
}

// waitReady polls PING on fresh connections until the server answers. No
// event says another process is ready, so polling is what is left.
func (s *server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		c := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, DialTimeout: time.Second, PoolSize: 1})
		err := c.Ping(ctx).Err()
		c.Close()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return errors.New("redis-server exited before answering PING")
		case <-ctx.Done():
			return fmt.Errorf("redis-server on %s did not answer PING: %v", s.addr, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop kills the server, waits for it and removes its directory. It is safe
// to call more than once.
func (s *server) stop() {
	s.cmd.Process.Kill()
	<-s.done
	untrack(s.cmd.Process.Pid)
	os.RemoveAll(s.dir)
}

func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// cmdStat is one line of INFO commandstats.
type cmdStat struct {
	Calls int64
	Usec  int64
	// Failed and Rejected count calls answered with an error: during
	// execution, or before it (MOVED, CROSSSLOT, arity, ...).
	Failed, Rejected int64
}

// stats is a snapshot of INFO commandstats, keyed by command name
// (lowercase, without the cmdstat_ prefix). Redis 7 counts the commands a
// script runs under their own names as well as the FCALL or EVALSHA that
// ran them.
type stats map[string]cmdStat

func commandStats(ctx context.Context, c *redis.Client) (stats, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	return parseCommandStats(info), nil
}

// parseCommandStats reads the cmdstat_ lines of an INFO reply.
func parseCommandStats(info string) stats {
	out := stats{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st cmdStat
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				st.Calls = n
			case "usec":
				st.Usec = n
			case "failed_calls":
				st.Failed = n
			case "rejected_calls":
				st.Rejected = n
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out
}

// statsDelta is what happened between two snapshots.
type statsDelta map[string]cmdStat

// since returns after - before. The INFO call that took before is counted in
// after; it is taken out, so a delta holds only the work being measured.
func (after stats) since(before stats) statsDelta {
	d := statsDelta{}
	for k, a := range after {
		b := before[k]
		if a != b {
			d[k] = cmdStat{Calls: a.Calls - b.Calls, Usec: a.Usec - b.Usec, Failed: a.Failed - b.Failed, Rejected: a.Rejected - b.Rejected}
		}
	}
	if i, ok := d["info"]; ok {
		i.Calls--
		if i.Calls == 0 {
			delete(d, "info")
		} else {
			d["info"] = i
		}
	}
	return d
}

// scripts is the number of script calls: the round trips of a budget,
// since every store operation is one script.
func (d statsDelta) scripts() cmdStat {
	var c cmdStat
	for _, name := range []string{"evalsha", "eval", "fcall"} {
		c.Calls += d[name].Calls
		c.Usec += d[name].Usec
	}
	return c
}

// total is every command Redis ran, the ones run inside scripts included.
func (d statsDelta) total() int64 {
	var n int64
	for _, s := range d {
		n += s.Calls
	}
	return n
}

// usecPerCall is the mean server time of the script calls in d.
func (d statsDelta) usecPerCall() float64 {
	s := d.scripts()
	if s.Calls == 0 {
		return 0
	}
	return float64(s.Usec) / float64(s.Calls)
}

// infoField reads one field of an INFO section.
func infoField(ctx context.Context, c *redis.Client, section, field string) (string, error) {
	info, err := c.Info(ctx, section).Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("INFO %s has no %s", section, field)
}

// keysMemory sums MEMORY USAGE (exact: SAMPLES 0) over every key matching
// pattern, and counts them.
func keysMemory(ctx context.Context, c *redis.Client, pattern string) (bytes, keys int64, err error) {
	var cursor uint64
	for {
		ks, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return 0, 0, err
		}
		if len(ks) > 0 {
			pipe := c.Pipeline()
			cmds := make([]*redis.IntCmd, len(ks))
			for i, k := range ks {
				cmds[i] = pipe.MemoryUsage(ctx, k, 0)
			}
			if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
				return 0, 0, err
			}
			for _, cmd := range cmds {
				if n, err := cmd.Result(); err == nil {
					bytes += n
					keys++
				}
			}
		}
		if cursor = next; cursor == 0 {
			return bytes, keys, nil
		}
	}
}

// unlinkMatching deletes every key matching pattern.
func unlinkMatching(ctx context.Context, c *redis.Client, pattern string) error {
	var cursor uint64
	for {
		ks, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return err
		}
		if len(ks) > 0 {
			if err := c.Unlink(ctx, ks...).Err(); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// redisCPU is the CPU time redis-server has used, user and system, in
// seconds (INFO cpu).
func redisCPU(ctx context.Context, c *redis.Client) (float64, error) {
	var total float64
	for _, f := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := infoField(ctx, c, "cpu", f)
		if err != nil {
			return 0, err
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s: %q", f, v)
		}
		total += x
	}
	return total, nil
}
