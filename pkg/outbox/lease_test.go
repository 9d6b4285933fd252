package outbox_test

import (
	"context"
	"fmt"
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

// The lease (idle_in_transaction_session_timeout) runs from the end of the
// claim, and after the publish the mark must still reach the server, so a
// PublishTimeout must leave the mark part of the lease: MarkTimeout (at
// least 1 s), or half a lease shorter than twice that. Before, NewRelay took
// any PublishTimeout under Lease: with 999ms of a 1s lease a publish that
// ran to its deadline had its session ended by the server before the mark,
// and the rows the queue accepted were left to be sent again.
func TestAPublishTimeoutThatLeavesTheMarkTooLittleOfTheLeaseIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	accepted, slow := newEvent(t, 1), newEvent(t, 2)
	addCommitted(t, ctx, pool, accepted, slow)
	pub := &hangingPublisher{hang: slow.EventID}
	r, err := outbox.NewRelay(pool, pub, outbox.RelayConfig{Lease: time.Second, PublishTimeout: 999 * time.Millisecond})
	if err == nil {
		n, err := r.RelayOnce(ctx)
		t.Fatalf("NewRelay accepted PublishTimeout 999ms of Lease 1s; a publish that hangs to its deadline then claims %d (%v) and leaves the accepted row %+v",
			n, err, state(t, pool, accepted.EventID))
	}
	testenv.WantError(t, "PublishTimeout 999ms of Lease 1s", err,
		"outbox: PublishTimeout 999ms leaves too little of Lease 1s for the mark: want at most 500ms")
	for _, c := range []struct {
		cfg  outbox.RelayConfig
		want string // "" = accepted
	}{
		{outbox.RelayConfig{Lease: time.Second}, ""}, // the default: half the lease
		{outbox.RelayConfig{Lease: time.Second, PublishTimeout: 500 * time.Millisecond}, ""},
		{outbox.RelayConfig{}, ""}, // 15s of 30s
		{outbox.RelayConfig{PublishTimeout: 25 * time.Second}, ""},
		{outbox.RelayConfig{PublishTimeout: 25*time.Second + time.Millisecond}, "leaves too little of Lease 30s for the mark: want at most 25s"},
		{outbox.RelayConfig{PublishTimeout: 21 * time.Second, MarkTimeout: 10 * time.Second}, "want at most 20s"},
		{outbox.RelayConfig{PublishTimeout: 29 * time.Second, MarkTimeout: time.Millisecond}, ""}, // a margin of at least 1s
		{outbox.RelayConfig{PublishTimeout: 29*time.Second + time.Millisecond, MarkTimeout: time.Millisecond}, "want at most 29s"},
	} {
		_, err := outbox.NewRelay(pool, pub, c.cfg)
		testenv.WantError(t, fmt.Sprintf("%+v", c.cfg), err, c.want)
	}
	// The boundary holds: the accepted row is marked, the hung one backed off.
	r = newRelay(t, pool, pub, outbox.RelayConfig{Lease: time.Second, PublishTimeout: 500 * time.Millisecond, RetryBase: time.Minute})
	if n, err := r.RelayOnce(ctx); n != 2 || err != nil {
		t.Fatalf("RelayOnce at the boundary: %d, %v; want 2, nil", n, err)
	}
	if s := state(t, pool, accepted.EventID); !s.Published {
		t.Fatalf("the accepted row at the boundary: %+v; want published", s)
	}
	if s := state(t, pool, slow.EventID); s.Published || s.LastError == nil {
		t.Fatalf("the row that hung: %+v; want rescheduled with its error", s)
	}
}

// A Lease under a millisecond still ends a frozen relay's claim: the
// setting is in whole milliseconds, and 0 turns the timeout off. Before,
// 500µs became idle_in_transaction_session_timeout = 0, and a relay that
// hung mid-batch held its rows for ever instead of for its lease.
func TestASubMillisecondLeaseStillReleasesAFrozenRelaysRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	e := newEvent(t, 1)
	addCommitted(t, ctx, pool, e)
	stuck := &stuckPublisher{started: make(chan struct{}), release: make(chan struct{})}
	frozen := newRelay(t, pool, stuck, outbox.RelayConfig{Lease: 500 * time.Microsecond, DisableListen: true})
	done := make(chan error, 1)
	go func() { _, err := frozen.RelayOnce(ctx); done <- err }()
	<-stuck.started
	defer func() { close(stuck.release); <-done }()
	_, _, pub := queue(t)
	rescuer := newRelay(t, pool, pub, outbox.RelayConfig{DisableListen: true})
	waitFor(t, 5*time.Second, "the frozen relay's claim to end and another relay to publish the row", func() bool {
		n, err := rescuer.RelayOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	if s := state(t, pool, e.EventID); !s.Published || s.Attempts != 1 {
		t.Fatalf("after the rescue: %+v; want published once", s)
	}
}

// A BatchSize past MaxBatchSize is refused, from code and from the
// environment, with the bound in the error: the claim allocates room for
// BatchSize messages on every poll, so a typo of a few zeros would take the
// process's memory instead of failing at start.
func TestABatchSizeAboveTheMaximumIsRefused(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	_, _, pub := queue(t)
	_, err := outbox.NewRelay(pool, pub, outbox.RelayConfig{BatchSize: outbox.MaxBatchSize + 1})
	testenv.WantError(t, "BatchSize MaxBatchSize+1", err, fmt.Sprintf("outbox: BatchSize %d is above MaxBatchSize %d", outbox.MaxBatchSize+1, outbox.MaxBatchSize))
	_, err = outbox.NewRelay(pool, pub, outbox.RelayConfig{BatchSize: outbox.MaxBatchSize})
	testenv.WantError(t, "BatchSize MaxBatchSize", err, "")
	testenv.WantError(t, "RELAY_BATCH_SIZE=1000000000", outbox.RelayEnv{BatchSize: 1_000_000_000}.Validate("RELAY_"),
		fmt.Sprintf("RELAY_BATCH_SIZE=1000000000: want 1..%d, or unset for the default", outbox.MaxBatchSize))
	testenv.WantError(t, "RELAY_BATCH_SIZE=MaxBatchSize", outbox.RelayEnv{BatchSize: outbox.MaxBatchSize}.Validate("RELAY_"), "")
}
