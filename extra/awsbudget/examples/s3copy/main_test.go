package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestRunAgainstFake runs the example end to end on its defaults (the fake
// provider and the embedded Redis), smaller, and checks the budgeted run's
// report: nothing failed, every object intact.
func TestRunAgainstFake(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	args := []string{"--objects", "40", "--hosts", "2", "--lanes", "4", "--max-kib", "32"}
	if err := run(ctx, args, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	report := out.String()
	t.Log("\n" + report)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^plain SDK: 2 hosts x 4 lanes: copied \d+, failed \d+ of 40 listed`),
		regexp.MustCompile(`(?m)^budget: +2 hosts x 4 lanes: copied 40, failed 0 of 40 listed; \d+ of \d+ responses were 503/429; .*; 40 of 40 intact in dst-budget$`),
	} {
		if !want.MatchString(report) {
			t.Errorf("report does not match %s", want)
		}
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--run", "sometimes"},
		{"--copy", "teleport"},
		{"--hosts", "0"},
		{"--rate", "-1"},
	} {
		var out strings.Builder
		if err := run(context.Background(), args, &out); err == nil {
			t.Errorf("run(%q) succeeded, want an error", args)
		}
	}
}
