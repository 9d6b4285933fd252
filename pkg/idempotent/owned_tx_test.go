package idempotent_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

// An effect that ends the transaction it was lent (a helper written for a
// pool, "...; return tx.Commit(ctx)") is refused: its Commit and Rollback
// return an error and the message fails, rolled back. Before, in a batch,
// its Commit committed every item's claim while only the effects so far
// had run: the next item failed on a closed tx, the fallback found the
// others' keys and acked them as duplicates, and their effects were never
// applied. Each path (Handle, HandleBatch, HandleBatchWith, whose batch
// effect failing falls back to the items' own effects) ends with as many
// dedupe keys as effects, and every message applied once.
func TestAnEffectThatCommitsOrRollsBackItsTxIsRefusedAndNothingIsLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ending := map[string]func(context.Context, pgx.Tx) error{
		"commit":   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		"rollback": func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
	}
	for name, end := range ending {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			c := newConsumer(t, pool)
			a, b, d := newEvent(t, 100), newEvent(t, 200), newEvent(t, 300)
			rude := func(ctx context.Context, tx pgx.Tx) error {
				if err := credit(a, 100)(ctx, tx); err != nil {
					return err
				}
				return end(ctx, tx)
			}
			if out, err := c.Handle(ctx, idempotent.MessageOf(a), rude); out != idempotent.Failed || err == nil {
				t.Errorf("Handle with an effect that ends its tx: %v %v, want failed", out, err)
			}
			outs, errs := c.HandleBatch(ctx, []idempotent.Item{
				{Msg: idempotent.MessageOf(a), Effect: rude},
				{Msg: idempotent.MessageOf(b), Effect: credit(b, 200)},
				{Msg: idempotent.MessageOf(d), Effect: credit(d, 300)},
			})
			if outs[0] != idempotent.Failed || errs[0] == nil || outs[1] != idempotent.Applied || outs[2] != idempotent.Applied {
				t.Errorf("HandleBatch: outcomes %v errors %v, want the one that ends its tx failed and the others applied", outs, errs)
			}
			// The transport redelivers the failed one; its effect is fixed.
			if out, err := c.Handle(ctx, idempotent.MessageOf(a), credit(a, 100)); out != idempotent.Applied || err != nil {
				t.Errorf("redelivery of the failed one: %v %v, want applied", out, err)
			}
			e := newEvent(t, 400)
			outs, errs = c.HandleBatchWith(ctx, []idempotent.Item{{Msg: idempotent.MessageOf(e), Effect: credit(e, 400)}},
				func(ctx context.Context, tx pgx.Tx, _ []int) error { return end(ctx, tx) })
			// The batch effect's ErrTxOwned fails the batch; the fallback
			// applies the item through its own Effect.
			if outs[0] != idempotent.Applied || errs[0] != nil {
				t.Errorf("HandleBatchWith with a batch effect that ends its tx: %v %v, want applied by the fallback", outs, errs)
			}
			keys := count(t, pool, `SELECT count(*) FROM processed_messages`)
			credits := count(t, pool, `SELECT count(*) FROM credits`)
			if keys != 4 || credits != 4 {
				t.Errorf("%d dedupe keys and %d credits committed; want 4 of each (a, b, d and e once each)", keys, credits)
			}
		})
	}
}
