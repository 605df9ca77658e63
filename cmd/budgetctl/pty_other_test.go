//go:build !linux

package main

import (
	"os"
	"testing"
)

func openPTY(t *testing.T) (master, slave *os.File) {
	t.Fatal("pseudo-terminals are only opened on Linux")
	return nil, nil
}

func ptyAvailable(t *testing.T) bool {
	t.Log("pseudo-terminals are only opened on Linux: the interactive confirmation is not tested")
	return false
}
