//go:build !linux && !darwin

package redistest

// waitStopped cannot observe a stopped process here; SIGSTOP is usually
// effective by the time the next command reaches the server.
func waitStopped(int, <-chan struct{}) {}
