package idempotent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/internal/pgid"
)

// Item is one message of a batch and its effect.
type Item struct {
	Msg    Message
	Effect Effect
	// Ctx, if set, is the context the item's effect runs with (its own
	// trace span, say); the transaction is the batch's all the same.
	Ctx context.Context
}

func (it Item) ctx(batch context.Context) context.Context {
	if it.Ctx != nil {
		return it.Ctx
	}
	return batch
}

// ItemError is the error of one item of a batch: a BatchEffect returns it
// to say that item Index's effect failed with Err. That item is Failed with
// Err, just as if it had been handled alone (a permanent Err parks it; any
// other leaves it for redelivery), and the others run one at a time.
type ItemError struct {
	Index int // in the items given to HandleBatch or HandleBatchWith
	Err   error
}

func (f *ItemError) Error() string {
	return fmt.Sprintf("idempotent: batch item %d: %v", f.Index, f.Err)
}
func (f *ItemError) Unwrap() error { return f.Err }

// BatchEffect applies the effects of a whole batch at once, in the batch's
// transaction, for effects that are cheaper set-based (one statement for
// every message) than one by one. fresh holds the indexes, in the items
// given to HandleBatchWith, of the messages to apply: the first copy of
// each key the batch's claim inserted, in the items' order. Duplicates,
// conflicts and expired copies are never in fresh.
//
// It must write exactly what the fresh items' own Effects would have, or
// return an error: then the transaction rolls back, nothing of the batch
// stays, and the items run one at a time through Handle with their own
// Effect (an *ItemError names the item to fail instead of re-running it).
// A panic in it is recovered and treated as an error that names no item.
// Each item's context is items[i].Ctx, for a trace span or an outbox row's
// trace context. Like an Effect's, its tx is lent: Commit and Rollback
// return ErrTxOwned.
type BatchEffect func(ctx context.Context, tx pgx.Tx, fresh []int) error

// HandleBatch is Handle for up to a receive's worth of messages at once: one
// multi-row INSERT ... ON CONFLICT DO NOTHING RETURNING claims every new key,
// the effects of the new ones run in the same transaction, and one COMMIT
// makes them all durable. That is one fsync for the batch instead of one per
// message, with the same guarantee per message as Handle.
//
// If anything fails (an effect, the claim, the COMMIT), the batch
// transaction rolls back and nothing of it stays: a crash mid-batch leaves
// nothing half-applied. Then the items run one at a time through Handle,
// each in its own transaction, except the one whose effect failed: it is
// Failed with its effect's error (a permanent one parks it; any other
// leaves it for redelivery), just as if it had been handled alone. An
// effect that panics is such a failure: recovered, its item Failed with a
// *errs.PanicError (logged with its stack), the others run on their own.
// So one poison message costs its neighbours a retry but never their
// commit, and HandleBatch always returns every item's outcome. One limit:
// the fallback runs on ctx, so an effect that hangs until ctx's deadline
// leaves its neighbours Failed with ctx's error, untried; hand those over
// again on a fresh deadline (sqstransport's batch subscriber does).
// Serialization failures and deadlocks retry the whole batch first.
// Outcomes and errors come back in items' order; ack exactly the items
// whose Outcome is Done.
func (c *Consumer) HandleBatch(ctx context.Context, items []Item) ([]Outcome, []error) {
	return c.HandleBatchWith(ctx, items, nil)
}

// HandleBatchWith is HandleBatch with the fresh items applied by one call of
// apply instead of one call of each item's Effect; the claim, the outcomes,
// the fallback and the guarantees are HandleBatch's. Each Item.Effect must
// still be set: it is what runs when the batch falls back to one message at
// a time. A nil apply is HandleBatch.
func (c *Consumer) HandleBatchWith(ctx context.Context, items []Item, apply BatchEffect) ([]Outcome, []error) {
	outs := make([]Outcome, len(items))
	errs := make([]error, len(items))
	var live []int // indexes still to decide
	for i, it := range items {
		if out, err := c.refuse(it.Msg, it.Effect); err != nil {
			outs[i], errs[i] = out, err
			continue
		}
		live = append(live, i)
	}
	if len(live) > 0 {
		_, err := c.retry(ctx, func() (Outcome, error) { return c.batchTx(ctx, items, live, outs, errs, apply) })
		if err != nil {
			culprit := -1
			var f *ItemError
			if errors.As(err, &f) {
				culprit = f.Index
				outs[f.Index], errs[f.Index] = Failed, f.Err
			} else {
				c.log.WarnContext(ctx, "batch failed: applying its messages one at a time", "consumer", c.name, "messages", len(live), "error", err)
			}
			for _, i := range live {
				if i != culprit {
					outs[i], errs[i] = c.handle(items[i].ctx(ctx), items[i].Msg, items[i].Effect)
				}
			}
		}
	}
	for i, it := range items {
		c.record(it.ctx(ctx), it.Msg, outs[i], errs[i])
	}
	return outs, errs
}

// batchTx runs one attempt of the batch. It fills outs/errs for live items
// only when it commits (or when nothing needs committing).
func (c *Consumer) batchTx(ctx context.Context, items []Item, live []int, outs []Outcome, errs []error, apply BatchEffect) (Outcome, error) {
	ids := make([]uuid.UUID, len(live))
	hashes := make([][]byte, len(live))
	for k, i := range live {
		ids[k], hashes[k] = items[i].Msg.EventID, items[i].Msg.Hash
	}
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return Failed, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, `INSERT INTO processed_messages (consumer, message_id, payload_hash)
		SELECT $1, id, h FROM unnest($2::uuid[], $3::bytea[]) AS k(id, h)
		ON CONFLICT DO NOTHING RETURNING message_id`, c.name, pgid.All(ids), hashes)
	if err != nil {
		return Failed, claimError(err)
	}
	inserted, err := pgid.Collect(rows)
	if err != nil {
		return Failed, claimError(err)
	}
	fresh := make(map[uuid.UUID]bool, len(inserted))
	for _, id := range inserted {
		fresh[id] = true
	}
	var known map[uuid.UUID][]byte
	if len(inserted) < len(live) {
		if known, err = c.existingBatch(ctx, tx, ids, fresh); err != nil {
			return Failed, err
		}
	}
	decided := make([]Outcome, len(live))
	var toApply []int // for apply
	for k, i := range live {
		id := ids[k]
		if fresh[id] {
			// The first copy of an id in the batch applies it; any later
			// copy in the same batch is judged against it below.
			delete(fresh, id)
			if apply != nil {
				toApply = append(toApply, i)
			} else if err := c.run(items[i].ctx(ctx), items[i].Msg, func() error { return items[i].Effect(items[i].ctx(ctx), lentTx{tx}) }); err != nil {
				return Failed, &ItemError{Index: i, Err: err}
			}
			decided[k] = Applied
			if known == nil {
				known = map[uuid.UUID][]byte{}
			}
			known[id] = hashes[k]
			continue
		}
		h, ok := known[id]
		switch {
		case !ok:
			return Failed, fmt.Errorf("idempotent: key %s neither inserted nor found", id)
		case bytes.Equal(h, hashes[k]):
			decided[k] = Duplicate
		default:
			decided[k] = Conflict
		}
	}
	if len(toApply) > 0 {
		// A panic in apply names no item: all of them fall back.
		if err := c.run(ctx, Message{}, func() error { return apply(ctx, lentTx{tx}, toApply) }); err != nil {
			var f *ItemError
			if errors.As(err, &f) && !slices.Contains(toApply, f.Index) {
				// Not an item it was given: fail none, fall back for all.
				return Failed, fmt.Errorf("idempotent: batch effect blamed item %d, which it was not given: %w", f.Index, f.Err)
			}
			return Failed, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return Failed, err
	}
	for k, i := range live {
		outs[i] = decided[k]
		if decided[k] == Conflict {
			errs[i] = ErrConflict
		}
	}
	return Applied, nil
}

func (c *Consumer) existingBatch(ctx context.Context, tx pgx.Tx, ids []uuid.UUID, fresh map[uuid.UUID]bool) (map[uuid.UUID][]byte, error) {
	var old []uuid.UUID
	for _, id := range ids {
		if !fresh[id] {
			old = append(old, id)
		}
	}
	rows, err := tx.Query(ctx, `SELECT message_id, payload_hash FROM processed_messages
		WHERE consumer = $1 AND message_id = ANY($2)`, c.name, pgid.All(old))
	if err != nil {
		return nil, err
	}
	known := map[uuid.UUID][]byte{}
	var id uuid.UUID
	var h []byte
	_, err = pgx.ForEachRow(rows, []any{pgid.Scan(&id), &h}, func() error {
		known[id] = append([]byte(nil), h...)
		return nil
	})
	return known, err
}
