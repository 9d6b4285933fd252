package idempotent_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

// creditAll is a set-based BatchEffect over the toy tables: one INSERT for
// every fresh item's credit and one UPDATE for the wallet. It records the
// indexes it was given.
func creditAll(items []idempotent.Item, evs []events.Envelope, amount int64, got *[][]int) idempotent.BatchEffect {
	return func(ctx context.Context, tx pgx.Tx, fresh []int) error {
		*got = append(*got, slices.Clone(fresh))
		ids := make([]uuid.UUID, len(fresh))
		for k, i := range fresh {
			ids[k] = evs[i].EventID
		}
		if _, err := tx.Exec(ctx, `INSERT INTO credits SELECT id, $2 FROM unnest($1::uuid[]) AS t(id)`, ids, amount); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE wallet SET balance = balance + $1 WHERE id = 1`, amount*int64(len(fresh)))
		return err
	}
}

// The batch effect is called once, with exactly the fresh first copies
// (not the keys processed before, not the second copy of a key within the
// batch), and what it writes commits with the keys in one transaction.
func TestHandleBatchWithAppliesOnlyTheFreshFirstCopiesInOneCall(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	evs := make([]events.Envelope, 6)
	for i := range evs {
		evs[i] = newEvent(t, 100)
	}
	if out, _ := c.Handle(ctx, idempotent.MessageOf(evs[1]), credit(evs[1], 100)); out != idempotent.Applied {
		t.Fatal("setup not applied")
	}
	evs = append(evs, evs[3]) // a second copy of item 3 in the same batch
	items := make([]idempotent.Item, len(evs))
	for i, e := range evs {
		items[i] = idempotent.Item{Msg: idempotent.MessageOf(e), Effect: func(context.Context, pgx.Tx) error {
			t.Errorf("item %d's own Effect ran: the batch effect should have applied it", i)
			return nil
		}}
	}
	var calls [][]int
	outs, errs := c.HandleBatchWith(ctx, items, creditAll(items, evs, 100, &calls))
	want := []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate, idempotent.Applied, idempotent.Applied,
		idempotent.Applied, idempotent.Applied, idempotent.Duplicate}
	for i := range outs {
		if outs[i] != want[i] {
			t.Fatalf("item %d: %v (%v), want %v", i, outs[i], errs[i], want[i])
		}
	}
	if len(calls) != 1 || !slices.Equal(calls[0], []int{0, 2, 3, 4, 5}) {
		t.Fatalf("batch effect calls %v, want one call with [0 2 3 4 5]", calls)
	}
	if n := count(t, pool, `SELECT count(*) FROM credits`); n != 6 {
		t.Fatalf("credits = %d, want 6 (1 before + 5)", n)
	}
	if n := count(t, pool, `SELECT balance FROM wallet`); n != 600 {
		t.Fatalf("balance = %d, want 600", n)
	}
	if n := count(t, pool, `SELECT count(DISTINCT xmin::text) FROM processed_messages WHERE message_id <> $1`, evs[1].EventID); n != 1 {
		t.Fatalf("the batch's keys were written by %d transactions, want 1", n)
	}
}

// A batch effect that blames one item (an ItemError) fails that item with
// its error and nothing else: the batch rolls back and the other fresh
// items run alone with their own Effect, each committed once. An error that
// blames no item (or an item it was not given) fails no item: all of them
// run alone.
func TestHandleBatchWithFallsBackToEachItemsOwnEffect(t *testing.T) {
	t.Parallel()
	poison := errors.New("poison")
	for _, tc := range []struct {
		name    string
		err     func(fresh []int) error
		culprit int // -1: none
	}{
		{"an item blamed", func(fresh []int) error { return &idempotent.ItemError{Index: fresh[2], Err: poison} }, 2},
		{"no item blamed", func([]int) error { return errors.New("the set statement failed") }, -1},
		{"an item it was not given", func([]int) error { return &idempotent.ItemError{Index: 99, Err: poison} }, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := setup(t)
			c := newConsumer(t, pool)
			ctx := context.Background()
			evs := make([]events.Envelope, 5)
			items := make([]idempotent.Item, len(evs))
			for i := range evs {
				evs[i] = newEvent(t, 100)
				items[i] = idempotent.Item{Msg: idempotent.MessageOf(evs[i]), Effect: credit(evs[i], 100)}
			}
			var calls [][]int
			set := creditAll(items, evs, 100, &calls)
			outs, errs := c.HandleBatchWith(ctx, items, func(ctx context.Context, tx pgx.Tx, fresh []int) error {
				if err := set(ctx, tx, fresh); err != nil { // its writes happen, then roll back
					return err
				}
				return tc.err(fresh)
			})
			applied := int64(0)
			for i := range outs {
				if i == tc.culprit {
					if outs[i] != idempotent.Failed || !errors.Is(errs[i], poison) {
						t.Fatalf("blamed item %d: %v %v, want Failed with its error", i, outs[i], errs[i])
					}
					continue
				}
				if outs[i] != idempotent.Applied {
					t.Fatalf("item %d: %v %v, want Applied on its own", i, outs[i], errs[i])
				}
				applied++
			}
			if n := count(t, pool, `SELECT count(*) FROM credits`); n != applied {
				t.Fatalf("credits = %d, want %d: the failed batch's writes must be gone", n, applied)
			}
			if n := count(t, pool, `SELECT balance FROM wallet`); n != 100*applied {
				t.Fatalf("balance = %d, want %d", n, 100*applied)
			}
			if n := count(t, pool, `SELECT count(*) FROM processed_messages`); n != applied {
				t.Fatalf("keys = %d, want %d (none for the failed item)", n, applied)
			}
		})
	}
}
