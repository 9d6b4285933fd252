package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/outbox"
)

// A relay without its pool or its publisher is refused when it is built,
// not found out by a nil-pointer panic at its first claim.
func TestNewRelayNeedsAPoolAndAPublisher(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	_, _, pub := queue(t)
	for name, build := range map[string]func() (*outbox.Relay, error){
		"no pool":      func() (*outbox.Relay, error) { return outbox.NewRelay(nil, pub, outbox.RelayConfig{}) },
		"no publisher": func() (*outbox.Relay, error) { return outbox.NewRelay(pool, nil, outbox.RelayConfig{}) },
	} {
		if r, err := build(); r != nil || err == nil || !strings.Contains(err.Error(), "needs a pool and a publisher") {
			t.Errorf("%s: %v, %v; want no relay and an error saying what it needs", name, r, err)
		}
	}
}

// A Relay runs once: a second Run, during the first or after it, returns
// ErrRelayUsed at once instead of starting a second set of workers (or,
// after the first returned, running without its gauges).
func TestARelayRunsOnce(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	_, _, pub := queue(t)
	r := newRelay(t, pool, pub, outbox.RelayConfig{DisableListen: true})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	time.Sleep(100 * time.Millisecond)
	if err := r.Run(ctx); !errors.Is(err, outbox.ErrRelayUsed) {
		t.Fatalf("Run while running: %v, want ErrRelayUsed", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("the first Run: %v, want nil on cancellation", err)
	}
	if err := r.Run(context.Background()); !errors.Is(err, outbox.ErrRelayUsed) {
		t.Fatalf("Run after it returned: %v, want ErrRelayUsed", err)
	}
}
