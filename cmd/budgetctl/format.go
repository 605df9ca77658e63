package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/runbudget/runbudget/budget"
	"golang.org/x/term"
)

// writeJSON prints v as one line of JSON.
func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// isTerminal reports whether f (an *os.File) is a terminal.
func isTerminal(f any) bool {
	file, ok := f.(*os.File)
	return ok && term.IsTerminal(int(file.Fd()))
}

// quote prints operator-facing text from Redis (budget names, consumers)
// quoted, so that control characters in it cannot rewrite the terminal or
// forge lines.
func quote(s string) string { return strconv.Quote(s) }

// formatDuration rounds for reading: milliseconds below a second, tenths of
// a second below a minute, whole seconds above; "-" for zero.
func formatDuration(d time.Duration) string {
	neg := d < 0
	if neg {
		d = -d
	}
	var s string
	switch {
	case d == 0:
		return "-"
	case d < time.Millisecond:
		s = "<1ms"
	case d < time.Second:
		s = d.Round(time.Millisecond).String()
	case d < time.Minute:
		s = strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	default:
		s = d.Round(time.Second).String()
	}
	if neg {
		s = "-" + s
	}
	return s
}

// formatBytes prints a size in binary units, exact where it can be.
func formatBytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f := float64(n)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if i == 0 {
		return strconv.FormatInt(n, 10) + "B"
	}
	if f == float64(int64(f)) {
		return strconv.FormatInt(int64(f), 10) + units[i]
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + units[i]
}

// exactBytes prints a size that parseBytes reads back exactly: in binary
// units when it is a whole number of them, in bytes otherwise.
func exactBytes(n int64) string {
	if s := formatBytes(n); !strings.Contains(s, ".") {
		return s
	}
	return strconv.FormatInt(n, 10)
}

// ceiling prints a limit, "-" when it is zero (unbounded).
func ceiling(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

// formatLimits prints limits on one line; "-" marks an unbounded dimension.
func formatLimits(l budget.Limits) string {
	var b strings.Builder
	if l.RequestsPerSecond > 0 {
		fmt.Fprintf(&b, "rate %s/s burst %d", strconv.FormatFloat(l.RequestsPerSecond, 'f', -1, 64), l.Burst)
	} else {
		b.WriteString("rate -")
	}
	b.WriteString(";  in flight")
	for _, c := range budget.Classes() {
		fmt.Fprintf(&b, " %s %s", c, ceiling(l.InFlight[c]))
	}
	fmt.Fprintf(&b, ";  open bodies %s;  memory ", ceiling(l.OpenBodies))
	if l.MemoryBytes > 0 {
		b.WriteString(formatBytes(l.MemoryBytes))
	} else {
		b.WriteString("-")
	}
	return b.String()
}

// limitsSetString prints limits in --set syntax, ready to paste back.
func limitsSetString(l budget.Limits) string {
	parts := []string{
		"rps=" + strconv.FormatFloat(l.RequestsPerSecond, 'f', -1, 64),
		"burst=" + strconv.Itoa(l.Burst),
	}
	for _, c := range budget.Classes() {
		parts = append(parts, string(c)+"="+strconv.Itoa(l.InFlight[c]))
	}
	parts = append(parts, "bodies="+strconv.Itoa(l.OpenBodies), "memory="+exactBytes(l.MemoryBytes))
	return strings.Join(parts, ",")
}

func formatDomains(ds []budget.Domain) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, ",")
}
