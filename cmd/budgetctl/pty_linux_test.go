package main

import (
	"os"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair: what is written to master reads
// from slave, which is a terminal to the process that gets it as stdin.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, s, err := tryOpenPTY()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); s.Close() })
	return m, s
}

func tryOpenPTY() (master, slave *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil { // unlock the slave
		m.Close()
		return nil, nil, err
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, s, nil
}

// ptyAvailable reports whether this machine can open a pseudo-terminal;
// without one the interactive confirmation cannot be driven.
func ptyAvailable(t *testing.T) bool {
	m, s, err := tryOpenPTY()
	if err != nil {
		t.Logf("no pseudo-terminal (%v): the interactive confirmation is not tested", err)
		return false
	}
	m.Close()
	s.Close()
	return true
}
