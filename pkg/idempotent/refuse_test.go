package idempotent_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

// A key that is not a UUIDv7 cannot be kept: processed_messages is
// partitioned by the time in the id, and a random (v4) id names a time
// decades away, or none. Handle and HandleBatch refuse it with a permanent
// ErrNotUUIDv7 before any write, so the copy is parked, not redelivered
// until its queue gives up; the batch's other items are applied. A Message
// without a hash, which would store a key no copy could be compared with,
// is refused the same way.
func TestHandleRefusesAKeyItCannotKeep(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	e := newEvent(t, 100)
	v4 := idempotent.MessageOf(e)
	v4.EventID = uuid.New()
	noHash := idempotent.MessageOf(newEvent(t, 100))
	noHash.Hash = nil

	for name, msg := range map[string]idempotent.Message{"v4 id": v4, "no hash": noHash} {
		out, err := c.Handle(ctx, msg, credit(e, 100))
		if out != idempotent.Failed || !errors.Is(err, idempotent.ErrInvalidMessage) || !idempotent.IsPermanent(err) {
			t.Errorf("Handle of a message with a %s: %v, %v; want Failed and a permanent ErrInvalidMessage", name, out, err)
		}
	}
	good := newEvent(t, 7)
	outs, errs := c.HandleBatch(ctx, []idempotent.Item{
		{Msg: v4, Effect: credit(e, 100)},
		{Msg: idempotent.MessageOf(good), Effect: credit(good, 7)},
	})
	if outs[0] != idempotent.Failed || !errors.Is(errs[0], idempotent.ErrInvalidMessage) || !idempotent.IsPermanent(errs[0]) {
		t.Errorf("HandleBatch, the v4 item: %v, %v; want Failed and a permanent ErrInvalidMessage", outs[0], errs[0])
	}
	if outs[1] != idempotent.Applied || errs[1] != nil {
		t.Errorf("HandleBatch, the good item: %v, %v; want Applied", outs[1], errs[1])
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_messages`); n != 1 {
		t.Fatalf("processed_messages has %d rows, want only the good item's", n)
	}
	if n := count(t, pool, `SELECT coalesce(sum(amount), 0) FROM credits`); n != 7 {
		t.Fatalf("credits sum to %d, want only the good item's 7", n)
	}
}

// A nil Effect is a programming error, told as one (ErrNilEffect,
// permanent) rather than as a recovered nil-pointer panic; nothing is kept.
func TestHandleRefusesANilEffect(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	out, err := c.Handle(ctx, idempotent.MessageOf(newEvent(t, 1)), nil)
	if out != idempotent.Failed || !errors.Is(err, idempotent.ErrNilEffect) {
		t.Errorf("Handle with a nil effect: %v, %v; want Failed, ErrNilEffect", out, err)
	}
	outs, errs := c.HandleBatch(ctx, []idempotent.Item{{Msg: idempotent.MessageOf(newEvent(t, 1))}})
	if outs[0] != idempotent.Failed || !errors.Is(errs[0], idempotent.ErrNilEffect) {
		t.Errorf("HandleBatch with a nil effect: %v, %v; want Failed, ErrNilEffect", outs[0], errs[0])
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("processed_messages has %d rows, want none", n)
	}
}
