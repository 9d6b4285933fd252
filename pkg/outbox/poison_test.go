package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
)

// A row the relay cannot encode (here an occurred_at past year 9999, which
// Add now refuses but an older producer, or a hand-written INSERT, may have
// stored) fails on its own, as a refused send does: it is rescheduled with
// last_error and backoff, and the rest of its batch is published. Before,
// the whole claim failed and rolled back, and every later claim took the
// same row first: the relay was stopped by one row.
func TestOneUnencodableRowDoesNotStopTheRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	c, q, pub := queue(t)
	poison := newEvent(t, 0)
	poison.OccurredAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = outbox.Add(ctx, tx, poison)
	_ = tx.Rollback(ctx)
	if !events.IsDecodeError(err) {
		t.Errorf("Add of an occurred_at in year 10000: %v, want a *events.DecodeError", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		VALUES ($1, $2, $3, $4, $5, $6)`, poison.EventID, poison.AggregateID, poison.AggregateVersion,
		poison.EventType, []byte(poison.Payload), poison.OccurredAt); err != nil {
		t.Fatal(err)
	}
	good := newEvent(t, 1)
	addCommitted(t, ctx, pool, good)

	r := newRelay(t, pool, pub, outbox.RelayConfig{BatchSize: 10, DisableListen: true, RetryBase: badRowBase, RetryMax: time.Hour})
	onlyTheGoodRowIsPublished(t, pool, r, c, q, good, poison, "occurred_at")
}

// badRowBase is the RetryBase of the bad-row tests: a rescheduled bad row
// is due about that far ahead.
const badRowBase = time.Minute

// onlyTheGoodRowIsPublished runs one claim of r, due rows bad (first) and
// good, and checks the outcome of a bad row: good published and on the
// queue alone; bad unpublished, released, attempts 1, last_error holding
// each of reason, due after the backoff of a failed send; and the next
// claim finds nothing rather than the same row again.
func onlyTheGoodRowIsPublished(t *testing.T, pool *pgxpool.Pool, r *outbox.Relay, c *sqs.Client, q string,
	good, bad events.Envelope, reason ...string) {
	t.Helper()
	ctx := context.Background()
	if n, err := r.RelayOnce(ctx); n != 2 || err != nil {
		t.Fatalf("RelayOnce with the bad row due first: claimed %d, %v; want 2, nil", n, err)
	}
	if s := state(t, pool, good.EventID); !s.Published {
		t.Fatalf("the valid row: %+v, want published", s)
	}
	s := state(t, pool, bad.EventID)
	ok := !s.Published && !s.Claimed && s.Attempts == 1 && s.LastError != nil
	for _, w := range reason {
		ok = ok && strings.Contains(*s.LastError, w)
	}
	if !ok {
		t.Fatalf("the bad row: %+v; want unpublished, attempts 1, last_error naming %v", s, reason)
	}
	if s.DueIn < badRowBase*3/4-time.Second {
		t.Fatalf("the bad row is due in %v, want the backoff of a failed send (about %v)", s.DueIn, badRowBase)
	}
	got := receive(t, c, q, 2, 3*time.Second, true)
	if len(got) != 1 || got[0].Attributes["event_id"] != good.EventID.String() {
		t.Fatalf("received %d messages (%v), want only the valid event %s", len(got), got, good.EventID)
	}
	if n, err := r.RelayOnce(ctx); n != 0 || err != nil {
		t.Fatalf("RelayOnce after: claimed %d, %v; want 0 (the bad row is backed off)", n, err)
	}
}

// A row whose columns do not scan (occurred_at = 'infinity', which a
// producer writing the table in SQL can store and no time.Time holds) is
// a bad row as an unencodable one is: rescheduled with last_error saying
// why, while the rest of its claim is published. Before, the scan error
// failed the whole claim, the transaction rolled back with nothing
// recorded, and every later claim took the same row first.
func TestARowThatDoesNotScanIsRescheduledAndTheRestPublish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	c, q, pub := queue(t)
	poison := newEvent(t, 0)
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_id, aggregate_version, event_type, payload, occurred_at, next_attempt_at)
		VALUES ($1, $2, $3, $4, $5, 'infinity', now() - interval '1 minute')`, poison.EventID, poison.AggregateID,
		poison.AggregateVersion, poison.EventType, []byte(poison.Payload)); err != nil {
		t.Fatal(err)
	}
	good := newEvent(t, 1)
	addCommitted(t, ctx, pool, good)

	r := newRelay(t, pool, pub, outbox.RelayConfig{DisableListen: true, RetryBase: badRowBase, RetryMax: time.Hour})
	onlyTheGoodRowIsPublished(t, pool, r, c, q, good, poison, "occurred_at", "infinity")
}
