package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
)

// The claim hands Lease to idle_in_transaction_session_timeout, an int4 of
// milliseconds (at most about 24.8 days): a longer lease made every claim
// fail with SQLSTATE 22023, and the relay never published anything. A
// RELAY_LEASE above MaxLease is refused at start, named; a Lease from code
// is clamped to MaxLease, and the relay publishes.
func TestALeaseAboveTheMaximumIsClampedInCodeAndRefusedFromTheEnvironment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lease := 25 * 24 * time.Hour
	testenv.WantError(t, "RELAY_LEASE=600h", outbox.RelayEnv{Lease: lease}.Validate("RELAY_"),
		"RELAY_LEASE=600h0m0s: want 1s..24h0m0s, or unset for the default")
	testenv.WantError(t, "RELAY_LEASE=24h", outbox.RelayEnv{Lease: 24 * time.Hour}.Validate("RELAY_"), "")

	pool := setup(t)
	c, q, pub := queue(t)
	e := newEvent(t, 1)
	addCommitted(t, ctx, pool, e)
	r := newRelay(t, pool, pub, outbox.RelayConfig{Lease: lease, DisableListen: true})
	if n, err := r.RelayOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RelayOnce with Lease %v: claimed %d, %v; want 1, nil", lease, n, err)
	}
	if s := state(t, pool, e.EventID); !s.Published {
		t.Fatalf("row after RelayOnce: %+v, want published", s)
	}
	if got := receive(t, c, q, 1, 3*time.Second, true); len(got) != 1 {
		t.Fatalf("received %d messages, want 1", len(got))
	}
}
