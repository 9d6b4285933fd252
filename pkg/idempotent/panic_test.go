package idempotent_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/errs"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

// panicking is an Effect that panics as a hostile payload makes one: a
// write to a nil map.
func panicking(context.Context, pgx.Tx) error {
	var m map[string]int
	m["boom"]++
	return nil
}

// An Effect that panics (the commonest poison message) fails its own item
// of HandleBatch, with a *errs.PanicError logged with its stack, and
// nothing of it stays; its neighbours still commit and get their outcomes.
// Before, the panic escaped HandleBatch: the batch rolled back, no item ran
// on its own, and the caller got no outcome at all.
func TestAPanickingEffectFailsItsOwnItemAndItsNeighboursCommit(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var logs testenv.Buffer
	c := newConsumer(t, pool, idempotent.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ctx := context.Background()
	good, poison, after := newEvent(t, 100), newEvent(t, 200), newEvent(t, 300)
	items := []idempotent.Item{
		{Msg: idempotent.MessageOf(good), Effect: credit(good, 100)},
		{Msg: idempotent.MessageOf(poison), Effect: panicking},
		{Msg: idempotent.MessageOf(after), Effect: credit(after, 300)},
	}
	var outs []idempotent.Outcome
	var ierrs []error
	if p := func() (p any) {
		defer func() { p = recover() }()
		outs, ierrs = c.HandleBatch(ctx, items)
		return nil
	}(); p != nil {
		t.Fatalf("HandleBatch panicked (%v): credits=%d", p, count(t, pool, `SELECT count(*) FROM credits`))
	}
	want := []idempotent.Outcome{idempotent.Applied, idempotent.Failed, idempotent.Applied}
	for i := range want {
		if outs[i] != want[i] {
			t.Fatalf("outcomes %v (%v), want %v", outs, ierrs, want)
		}
	}
	if !errs.IsPanic(ierrs[1]) || !strings.Contains(ierrs[1].Error(), "nil map") {
		t.Errorf("the panicking item's error %v, want a *errs.PanicError naming the panic", ierrs[1])
	}
	if n := count(t, pool, `SELECT count(*) FROM credits`); n != 2 {
		t.Errorf("credits = %d, want 2 (the neighbours)", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_messages WHERE message_id = $1`, poison.EventID); n != 0 {
		t.Errorf("the panicking item's key was kept (%d rows): its redelivery would be a duplicate", n)
	}
	if l := logs.String(); !strings.Contains(l, "panicked") || !strings.Contains(l, "panic_test.go") {
		t.Errorf("the panic was not logged with its stack:\n%s", l)
	}
}

// A BatchEffect that panics rolls the batch back and the items run one at
// a time with their own Effects: every item that does not panic commits.
func TestAPanickingBatchEffectFallsBackToEachItemsOwnEffect(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	a, b := newEvent(t, 100), newEvent(t, 100)
	items := []idempotent.Item{
		{Msg: idempotent.MessageOf(a), Effect: credit(a, 100)},
		{Msg: idempotent.MessageOf(b), Effect: credit(b, 100)},
	}
	var outs []idempotent.Outcome
	var ierrs []error
	if p := func() (p any) {
		defer func() { p = recover() }()
		outs, ierrs = c.HandleBatchWith(ctx, items, func(context.Context, pgx.Tx, []int) error { panic("set-based effect bug") })
		return nil
	}(); p != nil {
		t.Fatalf("HandleBatchWith panicked: %v", p)
	}
	if outs[0] != idempotent.Applied || outs[1] != idempotent.Applied {
		t.Fatalf("outcomes %v (%v), want both applied by their own Effect", outs, ierrs)
	}
	if n := count(t, pool, `SELECT count(*) FROM credits`); n != 2 {
		t.Errorf("credits = %d, want 2", n)
	}
}

// Handle recovers a panicking Effect too: Failed with a *errs.PanicError,
// rolled back, key included, so a redelivery runs it again (and a
// subscriber counts it towards MaxPanics, as a panic that reached it).
func TestHandleTurnsAPanickingEffectIntoAFailureAndKeepsNothing(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	e := newEvent(t, 100)
	var out idempotent.Outcome
	var err error
	if p := func() (p any) {
		defer func() { p = recover() }()
		out, err = c.Handle(ctx, idempotent.MessageOf(e), panicking)
		return nil
	}(); p != nil {
		t.Fatalf("Handle panicked: %v", p)
	}
	if out != idempotent.Failed || !errs.IsPanic(err) || errs.IsPermanent(err) {
		t.Fatalf("Handle: %v, %v; want Failed with a *errs.PanicError, not permanent", out, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("processed_messages = %d after a panic, want 0", n)
	}
	if out, err := c.Handle(ctx, idempotent.MessageOf(e), credit(e, 100)); out != idempotent.Applied {
		t.Fatalf("redelivery: %v, %v; want applied", out, err)
	}
}
