package admission

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestVetReportsCopies runs go vet over a file that copies a Concurrency and
// a Rate, and expects its copylocks check to report each copy: the mutex each
// type holds is what turns "must not be copied" into a vet finding.
func TestVetReportsCopies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go vet")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go tool not found (go test puts it on PATH): %v", err)
	}
	src := `package copycheck

import "github.com/runbudget/runbudget/admission"

func byValue(c admission.Concurrency) {}

func copies(c *admission.Concurrency, r *admission.Rate) {
	c2 := *c
	r2 := *r
	_, _ = &c2, &r2
}
`
	file := filepath.Join(t.TempDir(), "copy.go")
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	// Run from this package's directory so the file resolves imports against
	// this module.
	out, err := exec.Command(goTool, "vet", file).CombinedOutput()
	if err == nil {
		t.Fatalf("go vet accepted copies of Concurrency and Rate:\n%s", out)
	}
	for _, want := range []string{
		"byValue passes lock by value: github.com/runbudget/runbudget/admission.Concurrency",
		"assignment copies lock value to c2: github.com/runbudget/runbudget/admission.Concurrency",
		"assignment copies lock value to r2: github.com/runbudget/runbudget/admission.Rate",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("go vet output lacks %q:\n%s", want, out)
		}
	}
}
