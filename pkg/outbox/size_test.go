package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
)

// paddedEvent is an event whose payload is about n bytes.
func paddedEvent(t *testing.T, n int) events.Envelope {
	t.Helper()
	e, err := events.New("PaymentSucceeded", "pay_big", 1, map[string]string{"pad": strings.Repeat("x", n)})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// An event too large for one queue message can never be published: SQS
// refuses it (and every consumer's events.Decode would). Add and QueueAdd
// refuse it in the producer's transaction, where the caller can still do
// something about it, instead of leaving the relay a row it retries
// forever. One that fits, by a few bytes, is written and relayed.
func TestAddRefusesAnEventTooLargeForOneMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	c, q, pub := queue(t)

	big := paddedEvent(t, outbox.MaxMessageBytes)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, big) })
	if !errors.Is(err, outbox.ErrTooLarge) {
		t.Fatalf("Add of a %d-byte payload: %v, want outbox.ErrTooLarge", len(big.Payload), err)
	}
	if !strings.Contains(err.Error(), big.EventID.String()) {
		t.Errorf("Add's error %q does not name the event", err)
	}
	if err := outbox.QueueAdd(ctx, &pgx.Batch{}, big); !errors.Is(err, outbox.ErrTooLarge) {
		t.Fatalf("QueueAdd of a %d-byte payload: %v, want outbox.ErrTooLarge", len(big.Payload), err)
	}

	// Whitespace that the stored payload loses does not count against it.
	roomy := paddedEvent(t, outbox.MaxMessageBytes/2)
	roomy.Payload = json.RawMessage(strings.Replace(string(roomy.Payload), ":", ":"+strings.Repeat(" ", outbox.MaxMessageBytes/2), 1))
	// The largest payload that fits beside the envelope and the relay's
	// attributes, found by trying: a byte more must be refused. The events
	// tried share one occurred_at: a timestamp is printed without its
	// trailing zeros, so two events a microsecond apart can differ by a byte.
	at := paddedEvent(t, 0).OccurredAt
	sized := func(n int) events.Envelope { e := paddedEvent(t, n); e.OccurredAt = at; return e }
	lo, hi := 0, outbox.MaxMessageBytes
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if outbox.QueueAdd(ctx, &pgx.Batch{}, sized(mid)) == nil {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	if lo < outbox.MaxMessageBytes-1024 {
		t.Fatalf("the largest payload accepted pads %d bytes, want within 1 KiB of %d", lo, outbox.MaxMessageBytes)
	}
	fits := sized(lo)
	addCommitted(t, ctx, pool, roomy, fits)
	if n := count(t, pool, `SELECT count(*) FROM outbox`); n != 2 {
		t.Fatalf("outbox rows = %d, want the 2 that fit", n)
	}
	r := newRelay(t, pool, pub, outbox.RelayConfig{DisableListen: true})
	if n, err := r.RelayOnce(ctx); n != 2 || err != nil {
		t.Fatalf("RelayOnce: %d, %v; want 2, nil", n, err)
	}
	for _, e := range []events.Envelope{roomy, fits} {
		if s := state(t, pool, e.EventID); !s.Published {
			t.Fatalf("row %s: %+v, want published (last error: %v)", e.EventID, s, deref(s.LastError))
		}
	}
	got := receive(t, c, q, 2, 10*time.Second, true)
	if len(got) != 2 {
		t.Fatalf("received %d messages, want 2", len(got))
	}
}

// A stored row can outgrow what Add measured: jsonb prints a number as
// its digits, so 1e100000 comes back a hundred thousand bytes long. The
// relay finds it too large before any send, reschedules it on its own
// with a last_error that says so, and publishes the rest of its batch.
func TestRelayReschedulesARowThatGrewTooLarge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	c, q, pub := queue(t)
	grown, err := events.New("PaymentSucceeded", "pay_grown", 1, json.RawMessage(`{"a":1e100000,"b":1e100000,"c":1e100000}`))
	if err != nil {
		t.Fatal(err)
	}
	good := newEvent(t, 1)
	addCommitted(t, ctx, pool, grown, good)
	const base = time.Minute
	r := newRelay(t, pool, pub, outbox.RelayConfig{BatchSize: 10, DisableListen: true, RetryBase: base, RetryMax: time.Hour})
	if n, err := r.RelayOnce(ctx); n != 2 || err != nil {
		t.Fatalf("RelayOnce: claimed %d, %v; want 2, nil", n, err)
	}
	if s := state(t, pool, good.EventID); !s.Published {
		t.Fatalf("the row that fits: %+v, want published", s)
	}
	s := state(t, pool, grown.EventID)
	if s.Published || s.Attempts != 1 || s.LastError == nil || !strings.Contains(*s.LastError, "too large") {
		t.Fatalf("the grown row: %+v (last error %q); want unpublished, attempts 1, last_error saying too large", s, deref(s.LastError))
	}
	if s.DueIn < base*3/4-time.Second {
		t.Fatalf("the grown row is due in %v, want a failed send's backoff (about %v)", s.DueIn, base)
	}
	got := receive(t, c, q, 2, 3*time.Second, true)
	if len(got) != 1 || got[0].Attributes["event_id"] != good.EventID.String() {
		t.Fatalf("received %d messages (%v), want only %s", len(got), got, good.EventID)
	}
}

// Adding an event whose id is already in the outbox is refused with
// ErrDuplicateEvent, which a caller can test for, rather than only a
// constraint name in the text.
func TestAddOfTheSameEventTwiceIsErrDuplicateEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	e := newEvent(t, 1)
	addCommitted(t, ctx, pool, e)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, e) })
	if !errors.Is(err, outbox.ErrDuplicateEvent) || !strings.Contains(err.Error(), e.EventID.String()) {
		t.Fatalf("second Add of %s: %v, want outbox.ErrDuplicateEvent naming the event", e.EventID, err)
	}
	// The same through QueueAdd, its batch's results read by Close.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		if err := outbox.QueueAdd(ctx, b, e); err != nil {
			return err
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if !errors.Is(err, outbox.ErrDuplicateEvent) || !strings.Contains(err.Error(), e.EventID.String()) {
		t.Fatalf("QueueAdd of %s again: %v, want outbox.ErrDuplicateEvent naming the event", e.EventID, err)
	}
	// Any other failure of the insert is not a duplicate.
	if _, err := pool.Exec(ctx, `ALTER TABLE outbox ADD CONSTRAINT short_type CHECK (length(event_type) < 5) NOT VALID`); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, newEvent(t, 2)) })
	if err == nil || errors.Is(err, outbox.ErrDuplicateEvent) {
		t.Fatalf("Add failing a check constraint: %v, want an error that is not ErrDuplicateEvent", err)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// A payload may hold any character JSON does, and the queue may refuse
// some: SQS refuses U+FFFE and U+FFFF, and some SQS servers refuse
// everything above U+FFFF (an emoji). The relay sends them escaped: the
// message is accepted and decodes to the same event, with the same Hash.
func TestRelayPublishesCharactersAQueueRefusesEscaped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	c, q, pub := queue(t)
	e, err := events.New("PaymentSucceeded", "pay_😀", 1, map[string]string{"name": "Asha 😀", "note": "x\uffffy\ufffe", "𝄞": "é€"})
	if err != nil {
		t.Fatal(err)
	}
	addCommitted(t, ctx, pool, e)
	r := newRelay(t, pool, pub, outbox.RelayConfig{DisableListen: true})
	if n, err := r.RelayOnce(ctx); n != 1 || err != nil {
		t.Fatalf("RelayOnce: %d, %v; want 1, nil", n, err)
	}
	if s := state(t, pool, e.EventID); !s.Published {
		t.Fatalf("row: %+v, want published (last error: %v)", s, deref(s.LastError))
	}
	got := receive(t, c, q, 1, 10*time.Second, true)
	if len(got) != 1 {
		t.Fatalf("received %d messages, want 1", len(got))
	}
	d, err := events.Decode(got[0].Body)
	if err != nil {
		t.Fatalf("Decode of %q: %v", got[0].Body, err)
	}
	if d.AggregateID != e.AggregateID || string(d.Hash()) != string(e.Hash()) {
		t.Fatalf("received %q: aggregate %q, hash equal %v; want the event as added", got[0].Body, d.AggregateID, string(d.Hash()) == string(e.Hash()))
	}
}
