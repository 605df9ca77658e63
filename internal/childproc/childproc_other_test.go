//go:build !unix

package childproc

import (
	"fmt"
	"os"
)

func helperOS(role string) int {
	fmt.Fprintln(os.Stderr, "unknown helper role", role)
	return 100
}
