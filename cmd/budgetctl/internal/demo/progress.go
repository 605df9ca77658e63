package demo

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runbudget/runbudget/cmd/budgetctl/internal/clitext"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/term"
)

// progressView shows the hosts' progress during a run: bars on a terminal,
// a line per second otherwise. Its methods are safe for concurrent use.
type progressView interface {
	update(host int, ev WorkerEvent)
	log(line string) // a line from a host's stderr
	finish()         // the run is over: final state, stop drawing
}

func newProgressView(w io.Writer, label string, hosts, objects int) progressView {
	// Bars need a terminal that knows its width: a pseudo-terminal of size
	// zero (some CI runners, script(1)) would hide them entirely.
	if f, ok := w.(*os.File); ok && clitext.IsTerminal(f) {
		if cols, _, err := term.GetSize(int(f.Fd())); err == nil && cols >= 60 {
			return newBarView(w, label, hosts, objects)
		}
	}
	return newLineView(w, label, hosts, objects)
}

// barView draws one bar per host and one for the run with mpb.
type barView struct {
	p         *mpb.Progress
	total     *mpb.Bar
	hosts     []*mpb.Bar
	estimate  int64
	mu        sync.Mutex
	copied    []int64
	failed    []int64
	throttled []int64
	throttles atomic.Int64
	fails     atomic.Int64
}

func newBarView(w io.Writer, label string, hosts, objects int) *barView {
	v := &barView{
		p:         mpb.New(mpb.WithOutput(w), mpb.WithWidth(48), mpb.WithRefreshRate(100*time.Millisecond)),
		estimate:  int64(max(1, objects/hosts)),
		copied:    make([]int64, hosts),
		failed:    make([]int64, hosts),
		throttled: make([]int64, hosts),
	}
	for i := range hosts {
		name := fmt.Sprintf("host-%d", i+1)
		v.hosts = append(v.hosts, v.p.AddBar(v.estimate,
			mpb.PrependDecorators(decor.Name(name, decor.WC{W: 8, C: decor.DindentRight}), decor.CurrentNoUnit("%d", decor.WC{W: 9})),
			mpb.AppendDecorators(decor.Any(func(decor.Statistics) string {
				v.mu.Lock()
				defer v.mu.Unlock()
				return fmt.Sprintf("failed %d  503s %d", v.failed[i], v.throttled[i])
			}, decor.WC{W: 20})),
		))
	}
	v.total = v.p.AddBar(int64(objects),
		mpb.PrependDecorators(decor.Name("total", decor.WC{W: 8, C: decor.DindentRight}), decor.CountersNoUnit("%d/%d", decor.WC{W: 9})),
		mpb.AppendDecorators(decor.Percentage(decor.WC{W: 5}), decor.Name(" "), decor.Elapsed(decor.ET_STYLE_GO),
			decor.Any(func(decor.Statistics) string {
				return fmt.Sprintf("  failed %d  503s %d", v.fails.Load(), v.throttles.Load())
			})),
	)
	return v
}

// update moves the bars: each counts the objects its host is done with,
// copied or given up.
func (v *barView) update(host int, ev WorkerEvent) {
	v.mu.Lock()
	v.copied[host] = ev.Copied
	v.failed[host] = ev.Failed
	v.throttled[host] = ev.Throttled
	var sum, fails, thr int64
	for i := range v.copied {
		sum += v.copied[i] + v.failed[i]
		fails += v.failed[i]
		thr += v.throttled[i]
	}
	v.mu.Unlock()
	v.throttles.Store(thr)
	v.fails.Store(fails)
	bar := v.hosts[host]
	done := ev.Copied + ev.Failed
	if done >= v.estimate {
		// The work is shared dynamically: a host may copy more than its
		// even share. Grow its bar rather than let it look finished.
		bar.SetTotal(done+1, false)
	}
	bar.SetCurrent(done)
	if ev.Type == "done" {
		bar.SetTotal(done, true)
	}
	v.total.SetCurrent(sum)
}

func (v *barView) log(line string) {
	fmt.Fprintln(v.p, line)
}

func (v *barView) finish() {
	for _, b := range append(v.hosts, v.total) {
		if !b.Completed() {
			b.Abort(false)
		}
	}
	v.p.Wait()
}

// lineView prints a status line every second, for logs and pipes.
type lineView struct {
	w       io.Writer
	label   string
	objects int
	start   time.Time
	stop    chan struct{}
	done    sync.WaitGroup

	mu        sync.Mutex
	copied    []int64
	failed    []int64
	throttled []int64
}

func newLineView(w io.Writer, label string, hosts, objects int) *lineView {
	v := &lineView{w: w, label: label, objects: objects, start: time.Now(), stop: make(chan struct{}),
		copied: make([]int64, hosts), failed: make([]int64, hosts), throttled: make([]int64, hosts)}
	v.done.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-v.stop:
				return
			case <-t.C:
				v.print()
			}
		}
	})
	return v
}

func (v *lineView) update(host int, ev WorkerEvent) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.copied[host] = ev.Copied
	v.failed[host] = ev.Failed
	v.throttled[host] = ev.Throttled
}

func (v *lineView) log(line string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	fmt.Fprintln(v.w, line)
}

func (v *lineView) print() {
	v.mu.Lock()
	defer v.mu.Unlock()
	var sum, fails, thr int64
	per := make([]string, len(v.copied))
	for i := range v.copied {
		sum += v.copied[i]
		fails += v.failed[i]
		thr += v.throttled[i]
		per[i] = fmt.Sprintf("%d", v.copied[i])
	}
	fmt.Fprintf(v.w, "  %s %5.1fs  copied %d/%d  failed %d  503s %d  per host %s\n", v.label, time.Since(v.start).Seconds(),
		sum, v.objects, fails, thr, strings.Join(per, " "))
}

func (v *lineView) finish() {
	close(v.stop)
	v.done.Wait()
	v.print()
}
