package idempotent

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
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

// itemFailed aborts a batch transaction because item i's effect failed:
// that item gets its own error, the others run one by one.
type itemFailed struct {
	i   int
	err error
}

func (f *itemFailed) Error() string { return fmt.Sprintf("idempotent: batch item %d: %v", f.i, f.err) }
func (f *itemFailed) Unwrap() error { return f.err }

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
// leaves it for redelivery), just as if it had been handled alone. So one
// poison message costs its neighbours a retry but never their commit.
// Serialization failures and deadlocks retry the whole batch first.
// Outcomes and errors come back in items' order; ack exactly the items
// whose Outcome is Done.
func (c *Consumer) HandleBatch(ctx context.Context, items []Item) ([]Outcome, []error) {
	outs := make([]Outcome, len(items))
	errs := make([]error, len(items))
	var live []int // indexes still to decide
	for i, it := range items {
		if c.expired(it.Msg) {
			outs[i], errs[i] = Expired, ErrExpired
			continue
		}
		if err := c.ahead(it.Msg); err != nil {
			outs[i], errs[i] = Failed, err
			continue
		}
		live = append(live, i)
	}
	if len(live) > 0 {
		_, err := c.retry(ctx, func() (Outcome, error) { return c.batchTx(ctx, items, live, outs, errs) })
		if err != nil {
			culprit := -1
			var f *itemFailed
			if errors.As(err, &f) {
				culprit = f.i
				outs[f.i], errs[f.i] = Failed, f.err
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
func (c *Consumer) batchTx(ctx context.Context, items []Item, live []int, outs []Outcome, errs []error) (Outcome, error) {
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
		ON CONFLICT DO NOTHING RETURNING message_id`, c.name, ids, hashes)
	if err != nil {
		return Failed, err
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return Failed, err
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
	for k, i := range live {
		id := ids[k]
		if fresh[id] {
			// The first copy of an id in the batch applies it; any later
			// copy in the same batch is judged against it below.
			delete(fresh, id)
			if err := items[i].Effect(items[i].ctx(ctx), tx); err != nil {
				return Failed, &itemFailed{i: i, err: err}
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
		WHERE consumer = $1 AND message_id = ANY($2)`, c.name, old)
	if err != nil {
		return nil, err
	}
	known := map[uuid.UUID][]byte{}
	var id uuid.UUID
	var h []byte
	_, err = pgx.ForEachRow(rows, []any{&id, &h}, func() error {
		known[id] = append([]byte(nil), h...)
		return nil
	})
	return known, err
}
