package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// mergeResults adds to rep what the results file at path already holds
// from an earlier run, when this run includes an opt-in section (named in
// optIn): such a section runs alone for minutes, and writing only its
// figures would wipe those of the last full run. Kept are the earlier
// figures and targets this run did not measure again: not the ones whose
// ID this run has, nor those of the opt-in sections run now (IDs
// "<section>."), whatever they were called then. Each kept figure's note
// says which run it comes from. A missing or unreadable file keeps
// nothing: this run's figures are written alone, as without a merge.
func mergeResults(path string, rep *Report, optIn []string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var old Report
	if err := json.Unmarshal(b, &old); err != nil {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%s did not read back (%v): its figures were not kept", path, err))
		return nil
	}
	ours := func(id string) bool {
		for _, s := range optIn {
			if strings.HasPrefix(id, s+".") || id == s {
				return true
			}
		}
		return false
	}
	have := map[string]bool{}
	for _, f := range rep.Figures {
		have[f.ID] = true
	}
	for _, t := range rep.Targets {
		have["target "+t.ID] = true
	}
	from := "from the run of " + old.Started.UTC().Format("2006-01-02 15:04 UTC")
	kept := 0
	for _, f := range old.Figures {
		if have[f.ID] || ours(f.ID) {
			continue
		}
		if !strings.Contains(f.Note, "from the run of ") {
			f.Note = strings.TrimPrefix(f.Note+"; "+from, "; ")
		}
		rep.Figures = append(rep.Figures, f)
		kept++
	}
	for _, t := range old.Targets {
		if have["target "+t.ID] || ours(t.ID) {
			continue
		}
		if !strings.Contains(t.Note, "from the run of ") {
			t.Note = strings.TrimPrefix(t.Note+"; "+from, "; ")
		}
		rep.Targets = append(rep.Targets, t)
		kept++
	}
	for _, n := range old.Notes {
		if !ours(strings.TrimSuffix(strings.Fields(n + " x")[0], ":")) && !strings.HasPrefix(n, "kept ") {
			rep.Notes = append(rep.Notes, n)
		}
	}
	if kept > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("kept %d figures and targets of earlier runs from %s, which this run (%s) did not measure; each one's note names its run",
			kept, path, strings.Join(optIn, ", ")))
	}
	return nil
}
