package testenv

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Background runs run(ctx) in a goroutine until the returned stop (also
// registered as a cleanup) cancels ctx and waits for run to return: an
// error from run, or no return within 30 s, fails the test.
func Background(t testing.TB, name string, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: %v", name, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("%s did not return 30s after cancel", name)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
