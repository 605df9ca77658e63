package main

import (
	"strconv"
	"strings"
	"time"

	"github.com/runbudget/runbudget/budget"
)

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

// limitsSetString prints the limits kept in Redis (all but memory) in --set
// syntax, ready to paste back.
func limitsSetString(l budget.Limits) string {
	parts := []string{
		"rps=" + strconv.FormatFloat(l.RequestsPerSecond, 'f', -1, 64),
		"burst=" + strconv.Itoa(l.Burst),
	}
	for _, c := range budget.Classes() {
		parts = append(parts, string(c)+"="+strconv.Itoa(l.InFlight[c]))
	}
	parts = append(parts, "bodies="+strconv.Itoa(l.OpenBodies))
	return strings.Join(parts, ",")
}

func formatDomains(ds []budget.Domain) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, ",")
}
