package cashback

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/contract"
	"github.com/effectively-once/payments-cashback/services/rewards/cashback/terms"
)

// batchItem is one fresh event of a batch and the context of its delivery.
type batchItem struct {
	ctx context.Context
	eff *effect
}

// applyAll is the idempotent.BatchEffect of a receive: it writes what each
// event's own effect would, in far fewer statements. The common case, a
// PaymentSucceeded for a payment this service has never seen, is applied
// set-based: one round trip records every such payment and reads every
// rate, one more writes every credit, the wallets (one row per user, the
// sum of its credits) and every CashbackCredited. Everything else (a
// refund, a payment seen before, two events of one payment in the batch)
// runs its own effect, in batch order among the events of its payment, so
// the outcome is the one-at-a-time outcome: events of different payments
// touch different rows except the wallets, whose additions commute.
//
// An error names the failing item (an *idempotent.ItemError indexing
// batch) when there is one; any error rolls the whole batch back and the
// consumer falls back to one event at a time.
func applyAll(ctx context.Context, tx pgx.Tx, batch []batchItem) error {
	perPayment := make(map[string]int, len(batch))
	for _, b := range batch {
		perPayment[b.eff.pay.PaymentID]++
	}
	var set, rest []int // indexes in batch
	for k, b := range batch {
		if b.eff.e.EventType == contract.PaymentSucceeded && perPayment[b.eff.pay.PaymentID] == 1 {
			set = append(set, k)
		} else {
			rest = append(rest, k)
		}
	}
	// Rows are locked in payment order (and wallets in user order), so two
	// batches never wait on each other in a cycle over these statements.
	slices.SortFunc(set, func(a, b int) int { return cmp.Compare(batch[a].eff.pay.PaymentID, batch[b].eff.pay.PaymentID) })
	seen, err := creditNew(ctx, tx, batch, set)
	if err != nil {
		return err
	}
	for _, k := range set {
		if seen[k] {
			rest = append(rest, k) // the payment has a history: its own effect reads it
		}
	}
	slices.Sort(rest)
	for _, k := range rest {
		b := batch[k]
		r, err := b.eff.apply(b.ctx, tx)
		if err != nil {
			return &idempotent.ItemError{Index: k, Err: err}
		}
		b.eff.res = r
	}
	// The test hook fails after every write of the batch, as it does after
	// every write of one effect.
	for k, b := range batch {
		if b.eff.p.fail != nil {
			if err := b.eff.p.fail.Check(b.eff.e.EventID); err != nil {
				return &idempotent.ItemError{Index: k, Err: err}
			}
		}
	}
	return nil
}

// creditNew credits, set-based, the PaymentSucceeded events batch[set]
// whose payment has no row in payment_versions yet, and returns the others
// (seen[k]: the payment has a history, nothing was written for it).
func creditNew(ctx context.Context, tx pgx.Tx, batch []batchItem, set []int) (seen map[int]bool, err error) {
	if len(set) == 0 {
		return nil, nil
	}
	isNew, rates, err := recordPayments(ctx, tx, batch, set)
	if err != nil {
		return nil, err
	}
	var credits []newCredit
	for j, k := range set {
		f := batch[k].eff
		if !isNew[f.pay.PaymentID] {
			if seen == nil {
				seen = map[int]bool{}
			}
			seen[k] = true
			continue
		}
		if rates[j] == nil {
			return nil, &idempotent.ItemError{Index: k, Err: fmt.Errorf("%w (%s)", ErrNoRate, f.e.OccurredAt.Format(time.RFC3339Nano))}
		}
		c := newCredit{item: batch[k], rate: *rates[j]}
		if c.amount, err = terms.Amount(f.pay.AmountPaise, c.rate); err != nil {
			return nil, &idempotent.ItemError{Index: k, Err: sqstransport.Permanent(err)}
		}
		if c.event, err = creditedEvent(f.e, *f.pay, c.rate, c.amount); err != nil {
			return nil, &idempotent.ItemError{Index: k, Err: err}
		}
		credits = append(credits, c)
	}
	if err := writeCredits(ctx, tx, credits); err != nil {
		return nil, err
	}
	for _, c := range credits {
		c.item.eff.res = Credited
	}
	return seen, nil
}

// recordPayments is creditNew's first round trip: it records the payments
// of batch[set] that have no history (the INSERT that serialises every
// event of a payment, as lockPayment's does) and reads the rate in force at
// each event's occurred_at (rule 4 of docs/design.md; nil: none).
func recordPayments(ctx context.Context, tx pgx.Tx, batch []batchItem, set []int) (isNew map[string]bool, rates []*int, err error) {
	n := len(set)
	pays, versions, at := make([]string, n), make([]int64, n), make([]time.Time, n)
	// [16]byte, not uuid.UUID: pgx encodes it as is, where a uuid.UUID goes
	// through its driver.Valuer (a string, parsed back) at ~20 allocations.
	ids := make([][16]byte, n)
	for j, k := range set {
		e := batch[k].eff.e
		pays[j], versions[j], ids[j], at[j] = batch[k].eff.pay.PaymentID, e.AggregateVersion, e.EventID, e.OccurredAt
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO payment_versions (payment_id, status, version, last_event_id)
		SELECT p, 'SUCCEEDED', v, id FROM unnest($1::text[], $2::int8[], $3::uuid[]) WITH ORDINALITY AS t(p, v, id, n)
		ORDER BY n
		ON CONFLICT (payment_id) DO NOTHING RETURNING payment_id`, pays, versions, ids)
	b.Queue(`SELECT (SELECT rate_bp FROM cashback_rates WHERE effective_from <= t.at ORDER BY effective_from DESC LIMIT 1)
		FROM unnest($1::timestamptz[]) WITH ORDINALITY AS t(at, n) ORDER BY n`, at)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	rows, err := br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("record payment versions: %w", err)
	}
	recorded, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, nil, fmt.Errorf("record payment versions: %w", err)
	}
	if rows, err = br.Query(); err != nil {
		return nil, nil, fmt.Errorf("read rates: %w", err)
	}
	if rates, err = pgx.CollectRows(rows, pgx.RowTo[*int]); err != nil {
		return nil, nil, fmt.Errorf("read rates: %w", err)
	}
	if len(rates) != n {
		return nil, nil, fmt.Errorf("read rates: %d rows for %d events", len(rates), n)
	}
	isNew = make(map[string]bool, len(recorded))
	for _, p := range recorded {
		isNew[p] = true
	}
	return isNew, rates, br.Close()
}

// newCredit is one credit creditNew writes.
type newCredit struct {
	item   batchItem
	rate   int
	amount int64
	event  events.Envelope // its CashbackCredited
}

// writeCredits is creditNew's second round trip: every credit, the wallets
// (one row per user, the sum of its credits, in user order) and every
// CashbackCredited.
func writeCredits(ctx context.Context, tx pgx.Tx, credits []newCredit) error {
	if len(credits) == 0 {
		return nil
	}
	n := len(credits)
	var (
		pays, users, recipients = make([]string, n), make([]string, n), make([]string, n)
		paid, amounts, versions = make([]int64, n), make([]int64, n), make([]int64, n)
		rates                   = make([]int32, n)
		ids                     = make([][16]byte, n) // not uuid.UUID: see recordPayments
		at                      = make([]time.Time, n)
	)
	b := &pgx.Batch{}
	for i, c := range credits {
		f := c.item.eff
		if err := outbox.QueueAdd(c.item.ctx, b, c.event); err != nil {
			return err
		}
		pays[i], users[i], recipients[i] = f.pay.PaymentID, f.pay.UserID, f.pay.Recipient()
		paid[i], amounts[i], versions[i] = f.pay.AmountPaise, c.amount, f.e.AggregateVersion
		rates[i], ids[i], at[i] = int32(c.rate), f.e.EventID, f.e.OccurredAt
	}
	b.Queue(`INSERT INTO cashback_credits
		(payment_id, user_id, recipient, payment_amount_paise, currency, rate_bp, amount_paise, event_id, payment_version, occurred_at)
		SELECT p, u, r, pa, $5, rb, a, id, v, at
		FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $6::int4[], $7::int8[], $8::uuid[], $9::int8[], $10::timestamptz[])
			WITH ORDINALITY AS t(p, u, r, pa, rb, a, id, v, at, n)
		ORDER BY n
		ON CONFLICT (payment_id) DO NOTHING`,
		pays, users, recipients, paid, terms.Currency, rates, amounts, ids, versions, at)
	// PostgreSQL sums each user's credits, not Go: sum()::int8 refuses a
	// total past a bigint, as one event at a time does, where an int64
	// would wrap and commit it. Users in byte order (COLLATE "C"): the
	// order every batch locks wallets in.
	b.Queue(`INSERT INTO wallets (user_id, balance_paise)
		SELECT u, sum(a)::int8 FROM unnest($1::text[], $2::int8[]) AS t(u, a)
		GROUP BY u ORDER BY u COLLATE "C"
		ON CONFLICT (user_id) DO UPDATE SET balance_paise = wallets.balance_paise + EXCLUDED.balance_paise, updated_at = now()`,
		users, amounts)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	for range n {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("add CashbackCredited: %w", err)
		}
	}
	tag, err := br.Exec()
	if err != nil {
		return fmt.Errorf("insert credits: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("move wallets: %w", err)
	}
	if tag.RowsAffected() != int64(n) {
		// A payment with no recorded version but a credit: impossible
		// while both commit together; let each event's own effect decide.
		return fmt.Errorf("insert credits: %d of %d inserted", tag.RowsAffected(), n)
	}
	return br.Close()
}
