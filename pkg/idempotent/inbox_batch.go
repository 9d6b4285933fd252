package idempotent

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/internal/pgid"
)

// Incoming is one message of a ReceiveBatch.
type Incoming struct {
	// Ctx is the message's own context: its trace, stored with the row.
	// Nil: the batch's context.
	Ctx         context.Context
	Envelope    events.Envelope
	OrderingKey string
}

// ReceiveBatch is Receive for a whole receive's worth of messages: the
// valid ones are stored with ONE multi-row INSERT ... ON CONFLICT DO
// NOTHING (autocommitted: one commit, one WAL flush, for the batch), and
// the ones that were there already are checked for duplicate or conflict
// with one more query. It returns one error per message, in order, each
// meaning what Receive's error means for it: nil = stored or a duplicate
// (ack it); permanent = refused (expired, reused id, invalid); other =
// nothing stored for it, leave it for redelivery. Two copies of one event
// in the same batch store it once; the later one is its duplicate.
func (in *Inbox) ReceiveBatch(ctx context.Context, ms []Incoming) []error {
	errs := make([]error, len(ms))
	outs := make([]receiveOutcome, len(ms))
	var live []int
	for i, m := range ms {
		if out, err := in.check(m.Envelope, m.OrderingKey); err != nil {
			outs[i], errs[i] = out, err
			continue
		}
		live = append(live, i)
	}
	if len(live) > 0 {
		in.storeBatch(ctx, ms, live, outs, errs)
	}
	stored := 0
	for i, m := range ms {
		mctx := m.Ctx
		if mctx == nil {
			mctx = ctx
		}
		in.recordReceive(mctx, m.Envelope, outs[i], errs[i])
		if outs[i] == receivedStored {
			stored++
		}
	}
	in.wake(stored)
	return errs
}

// check is what Receive refuses before touching the database.
func (in *Inbox) check(e events.Envelope, orderingKey string) (receiveOutcome, error) {
	if err := e.Validate(); err != nil {
		return receivedInvalid, Permanent(fmt.Errorf("idempotent: inbox %s: %w", in.consumer, err))
	}
	if orderingKey == "" {
		return receivedInvalid, Permanent(fmt.Errorf("idempotent: inbox %s: empty ordering key for event %s", in.consumer, e.EventID))
	}
	if beyondWindow(e.EventID, e.OccurredAt, in.cfg.Now(), in.cfg.Retention) {
		return receivedExpired, ErrExpired
	}
	return "", nil
}

func (in *Inbox) storeBatch(ctx context.Context, ms []Incoming, live []int, outs []receiveOutcome, errs []error) {
	n := len(live)
	ids := make([]uuid.UUID, n)
	keys := make([]string, n)
	types := make([]string, n)
	aggs := make([]string, n)
	versions := make([]int64, n)
	occurred := make([]time.Time, n)
	payloads := make([]string, n)
	hashes := make([][]byte, n)
	tps := make([]*string, n)
	for k, i := range live {
		e := ms[i].Envelope
		ids[k], keys[k], types[k], aggs[k], versions[k], occurred[k] = e.EventID, ms[i].OrderingKey, e.EventType, e.AggregateID, e.AggregateVersion, e.OccurredAt
		payloads[k], hashes[k] = string(e.Payload), e.Hash()
		mctx := ms[i].Ctx
		if mctx == nil {
			mctx = ctx
		}
		if tp, ok := traceparent(mctx).(string); ok {
			tps[k] = &tp
		}
	}
	fail := func(err error) {
		for _, i := range live {
			outs[i], errs[i] = receivedFailed, fmt.Errorf("idempotent: inbox %s: store %s: %w", in.consumer, ms[i].Envelope.EventID, err)
		}
	}
	// WITH ORDINALITY keeps the batch's order, so that of two copies of one
	// event in the batch the first is the one stored.
	rows, err := in.pool.Query(ctx, `INSERT INTO inbox
		(consumer, message_id, ordering_key, event_type, aggregate_id, aggregate_version, occurred_at, payload, payload_hash, traceparent)
		SELECT $1, id, k, t, a, v, o, p::jsonb, h, tp
		FROM unnest($2::uuid[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::timestamptz[], $8::text[], $9::bytea[], $10::text[])
			WITH ORDINALITY AS m(id, k, t, a, v, o, p, h, tp, n)
		ORDER BY n
		ON CONFLICT DO NOTHING
		RETURNING message_id`,
		in.consumer, pgid.All(ids), keys, types, aggs, versions, occurred, payloads, hashes, tps)
	if err != nil {
		fail(err)
		return
	}
	inserted, err := pgid.Collect(rows)
	if err != nil {
		fail(err)
		return
	}
	fresh := make(map[uuid.UUID]bool, len(inserted))
	for _, id := range inserted {
		fresh[id] = true
	}
	var old []uuid.UUID
	for k, i := range live {
		if fresh[ids[k]] {
			delete(fresh, ids[k]) // a later copy in this batch is a duplicate of this one
			outs[i] = receivedStored
			continue
		}
		old = append(old, ids[k])
	}
	if len(old) == 0 {
		return
	}
	// 0 rows for these: their keys are committed already (ON CONFLICT
	// waited for any concurrent inserter). Same content or not?
	have := map[uuid.UUID][]byte{}
	var id uuid.UUID
	var h []byte
	rows, err = in.pool.Query(ctx, `SELECT message_id, payload_hash FROM inbox WHERE consumer = $1 AND message_id = ANY($2)`, in.consumer, pgid.All(old))
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{pgid.Scan(&id), &h}, func() error { have[id] = append([]byte(nil), h...); return nil })
	}
	for k, i := range live {
		if outs[i] == receivedStored {
			continue
		}
		got, ok := have[ids[k]]
		switch {
		case err != nil:
			outs[i], errs[i] = receivedFailed, fmt.Errorf("idempotent: inbox %s: read existing %s: %w", in.consumer, ids[k], err)
		case !ok:
			outs[i], errs[i] = receivedFailed, fmt.Errorf("idempotent: inbox %s: row %s vanished while checking a duplicate", in.consumer, ids[k])
		case string(got) != string(hashes[k]):
			outs[i], errs[i] = receivedConflict, ErrConflict
		default:
			outs[i] = receivedDuplicate
		}
	}
}
