// Package cashback is the rewards service's domain: it turns payment events
// into cashback credits, wallet movements and CashbackCredited /
// CashbackReversed events, each exactly once.
//
// Every payment event is applied through an idempotent.Consumer named
// "rewards", so the dedupe row (rewards, event_id), the credit, the wallet
// change and the outbox row commit in one transaction or not at all. Behind
// the dedupe key stand two more guards:
//
//   - the business key: cashback_credits.payment_id is UNIQUE, so the same
//     payment under a second event id (a buggy upstream) credits nothing
//     the second time; that copy is logged as a warning and acked;
//   - versioned state per payment (payment_versions): a refund is terminal.
//     PaymentRefunded reverses the credit once; a PaymentSucceeded copy that
//     arrives after the refund (stale, or overtaken by it) credits nothing.
//
// The rate is the one in force at the event's occurred_at (cashback_rates),
// never "now", so a retry after a rate change credits what the first
// attempt would have.
package cashback

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/contract"
	"github.com/effectively-once/payments-cashback/services/rewards/cashback/terms"
)

// ConsumerName scopes this service's dedupe keys in processed_messages.
const ConsumerName = "rewards"

// Result says what applying one payment event did. It is logged and
// counted (rewards_events_total{result}).
type Result string

const (
	// Credited: a new credit, a wallet credit and a CashbackCredited event.
	Credited Result = "credited"
	// DuplicatePayment: the payment was already credited under another
	// event id (rule 3, docs/design.md). Nothing changed; the dedupe row commits and the
	// message is acked.
	DuplicatePayment Result = "duplicate_payment"
	// IgnoredAfterRefund: a PaymentSucceeded for a payment already seen
	// REFUNDED at the same or a later version (rule 5, docs/design.md). Nothing changed.
	IgnoredAfterRefund Result = "ignored_after_refund"
	// Reversed: the credit was reversed, the wallet debited and a
	// CashbackReversed event written.
	Reversed Result = "reversed"
	// RefundBeforeCredit: the refund overtook its PaymentSucceeded. The
	// payment is recorded REFUNDED, so the later PaymentSucceeded credits
	// nothing; there was nothing to reverse.
	RefundBeforeCredit Result = "refund_before_credit"
	// DuplicateRefund: the payment was already REFUNDED (a second refund
	// event id). Nothing changed.
	DuplicateRefund Result = "duplicate_refund"
)

// Processor applies payment events. Its HandleDelivery is the
// sqstransport.Handler of the payments-events subscriber.
type Processor struct {
	consumer *idempotent.Consumer
	wake     *outbox.Notifier // nil: the relays find new rows by polling
	fail     Injector
	log      *slog.Logger
	results  metric.Int64Counter
}

// Injector injects failures for tests (FailHook): Check runs inside the
// effect's transaction, after its writes, and its error rolls it back.
type Injector interface {
	Check(eventID uuid.UUID) error
}

// NewProcessor returns a Processor deduplicating through consumer (named
// ConsumerName). fail is nil in production (no injected failures).
func NewProcessor(consumer *idempotent.Consumer, fail Injector, log *slog.Logger) (*Processor, error) {
	if log == nil {
		log = slog.Default()
	}
	c, err := otel.Meter(otelScope).Int64Counter("rewards_events_total",
		metric.WithDescription("Payment events applied by rewards, by event type and result."))
	if err != nil {
		return nil, err
	}
	return &Processor{consumer: consumer, fail: fail, log: log, results: c}, nil
}

// WakeRelays makes every commit that wrote an outbox row (a credit, a
// reversal) ask n to wake the relays.
func (p *Processor) WakeRelays(n *outbox.Notifier) { p.wake = n }

// HandleDelivery is the subscriber's handler: nil means committed (now or
// before), so the message may be deleted.
func (p *Processor) HandleDelivery(ctx context.Context, d sqstransport.Delivery) error {
	return p.Handle(ctx, d.Envelope)
}

// Handle applies e at most once. It returns nil when e's effect is
// committed (Applied or Duplicate), a permanent error (parked in the DLQ:
// unknown type, bad payload, reused event id, older than the dedupe
// window, a contradiction in the payment's history) or a transient one
// (rolled back; the redelivery tries again).
func (p *Processor) Handle(ctx context.Context, e events.Envelope) error {
	eff, err := p.effect(ctx, e)
	if err != nil {
		return err
	}
	out, err := p.consumer.Handle(ctx, idempotent.MessageOf(e), eff.run)
	return p.finish(ctx, eff, out, err)
}

// HandleBatchDeliveries is the batch subscriber's handler: the events of
// one receive applied in one transaction (idempotent.Consumer.HandleBatch),
// each falling back to its own transaction if anything in the batch fails.
// The errors mean what Handle's do, one per delivery.
func (p *Processor) HandleBatchDeliveries(ctx context.Context, ds []sqstransport.Delivery) []error {
	errs := make([]error, len(ds))
	effs := make([]*effect, len(ds))
	items := make([]idempotent.Item, 0, len(ds))
	var at []int // index in ds of each item
	for i, d := range ds {
		dctx := d.Ctx
		if dctx == nil {
			dctx = ctx
		}
		eff, err := p.effect(dctx, d.Envelope)
		if err != nil {
			errs[i] = err
			continue
		}
		effs[i] = eff
		items = append(items, idempotent.Item{Msg: idempotent.MessageOf(d.Envelope), Effect: eff.run, Ctx: dctx})
		at = append(at, i)
	}
	if len(items) == 0 {
		return errs
	}
	outs, ierrs := p.consumer.HandleBatchWith(ctx, items, func(ctx context.Context, tx pgx.Tx, fresh []int) error {
		batch := make([]batchItem, len(fresh))
		for k, i := range fresh {
			batch[k] = batchItem{ctx: items[i].Ctx, eff: effs[at[i]]}
		}
		err := applyAll(ctx, tx, batch)
		var f *idempotent.ItemError
		if errors.As(err, &f) {
			f.Index = fresh[f.Index] // from batch's index to items'
		}
		return err
	})
	for k, i := range at {
		errs[i] = p.finish(items[k].Ctx, effs[i], outs[k], ierrs[k])
	}
	return errs
}

// effect is one event's decoded effect and, once it ran, what it did.
type effect struct {
	p     *Processor
	e     events.Envelope
	apply apply
	pay   *terms.PaymentPayload // decoded, for applyAll

	res Result
}

// effect decodes e and picks its effect; the error is permanent.
func (p *Processor) effect(ctx context.Context, e events.Envelope) (*effect, error) {
	apply, pay, err := p.effectFor(e)
	if err != nil {
		p.log.ErrorContext(ctx, "payment event refused", "event_id", e.EventID, "event_type", e.EventType, "error", err)
		return nil, sqstransport.Permanent(err)
	}
	return &effect{p: p, e: e, apply: apply, pay: pay}, nil
}

// run is the idempotent.Effect. It may run more than once (a batch that
// fell back, a retried serialization failure); res is the last run's.
func (f *effect) run(ctx context.Context, tx pgx.Tx) error {
	r, err := f.apply(ctx, tx)
	if err != nil {
		return err
	}
	// The test hook fails after every write of the effect, so an
	// injected failure also proves that a failed attempt commits nothing.
	if f.p.fail != nil {
		if err := f.p.fail.Check(f.e.EventID); err != nil {
			return err
		}
	}
	f.res = r
	return nil
}

// finish logs and counts what the consumer decided for f's event and
// returns the subscriber's verdict.
func (p *Processor) finish(ctx context.Context, f *effect, out idempotent.Outcome, err error) error {
	e, res := f.e, f.res
	if !out.Done() {
		return err // permanent ones (conflict, expired, contradiction) are parked by the subscriber
	}
	if out == idempotent.Duplicate {
		p.log.InfoContext(ctx, "duplicate copy acked: already applied", "event_id", e.EventID, "event_type", e.EventType)
		return nil
	}
	if res == Credited || res == Reversed {
		p.wake.Notify()
	}
	p.results.Add(ctx, 1, metric.WithAttributes(attribute.String("event_type", e.EventType), attribute.String("result", string(res))))
	log := p.log.With("event_id", e.EventID, "event_type", e.EventType, "payment_id", e.AggregateID,
		"aggregate_version", e.AggregateVersion, "result", string(res))
	switch res {
	case DuplicatePayment:
		log.WarnContext(ctx, "payment already credited under another event id: no second credit (upstream emitted it twice)")
	case IgnoredAfterRefund:
		log.WarnContext(ctx, "PaymentSucceeded after the payment's refund: stale copy ignored")
	case DuplicateRefund:
		log.WarnContext(ctx, "payment already refunded under another event id: nothing to do")
	default:
		log.InfoContext(ctx, "payment event applied")
	}
	return nil
}

// apply is the body of one event's transaction, after the dedupe row.
type apply func(ctx context.Context, tx pgx.Tx) (Result, error)

// effectFor decodes e and picks its effect, and returns its payload; an
// error is permanent.
func (p *Processor) effectFor(e events.Envelope) (apply, *terms.PaymentPayload, error) {
	switch e.EventType {
	case contract.PaymentSucceeded:
		pay, err := terms.DecodeSucceeded(e)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, tx pgx.Tx) (Result, error) { return credit(ctx, tx, e, pay) }, &pay, nil
	case contract.PaymentRefunded:
		pay, err := terms.DecodeRefunded(e)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, tx pgx.Tx) (Result, error) { return reverse(ctx, tx, e, pay) }, &pay, nil
	default:
		return nil, nil, fmt.Errorf("rewards does not handle event type %q", e.EventType)
	}
}

// lockPayment records the payment's state (status at version, set by
// eventID) if it is the first event seen for it, else locks its row. Every
// event of one payment serialises here: the INSERT waits on the primary
// key for a concurrent transaction of the same payment (claim with an
// INSERT that can conflict, never SELECT-then-INSERT). It returns the state
// before this event, or inserted = true.
func lockPayment(ctx context.Context, tx pgx.Tx, paymentID, status string, version int64, eventID uuid.UUID) (inserted bool, prevStatus string, prevVersion int64, err error) {
	tag, err := tx.Exec(ctx, `INSERT INTO payment_versions (payment_id, status, version, last_event_id)
		VALUES ($1, $2, $3, $4) ON CONFLICT (payment_id) DO NOTHING`, paymentID, status, version, eventID)
	if err != nil {
		return false, "", 0, fmt.Errorf("record payment version: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return true, "", 0, nil
	}
	err = tx.QueryRow(ctx, `SELECT status, version FROM payment_versions WHERE payment_id = $1 FOR UPDATE`,
		paymentID).Scan(&prevStatus, &prevVersion)
	if err != nil {
		return false, "", 0, fmt.Errorf("lock payment version: %w", err)
	}
	return false, prevStatus, prevVersion, nil
}

// credit applies PaymentSucceeded.
func credit(ctx context.Context, tx pgx.Tx, e events.Envelope, pay terms.PaymentPayload) (Result, error) {
	inserted, status, version, err := lockPayment(ctx, tx, pay.PaymentID, "SUCCEEDED", e.AggregateVersion, e.EventID)
	if err != nil {
		return "", err
	}
	if !inserted {
		if status == "REFUNDED" {
			if e.AggregateVersion > version {
				// A refund is terminal: a payment cannot succeed again after
				// it. Park it for a human rather than guess.
				return "", sqstransport.Permanent(fmt.Errorf(
					"PaymentSucceeded version %d is newer than the payment's refund (version %d): contradictory history",
					e.AggregateVersion, version))
			}
			return IgnoredAfterRefund, nil
		}
		if _, err := tx.Exec(ctx, `UPDATE payment_versions SET version = $2, updated_at = now()
			WHERE payment_id = $1 AND version < $2`, pay.PaymentID, e.AggregateVersion); err != nil {
			return "", err
		}
	}

	rate, err := RateAt(ctx, tx, e.OccurredAt) // rule 4 of docs/design.md: the rate at occurred_at, not now
	if err != nil {
		return "", err
	}
	amount, err := terms.Amount(pay.AmountPaise, rate)
	if err != nil {
		return "", sqstransport.Permanent(err)
	}
	tag, err := tx.Exec(ctx, `INSERT INTO cashback_credits
		(payment_id, user_id, recipient, payment_amount_paise, currency, rate_bp, amount_paise, event_id, payment_version, occurred_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
		ON CONFLICT (payment_id) DO NOTHING`,
		pay.PaymentID, pay.UserID, pay.Recipient(), pay.AmountPaise, terms.Currency, rate, amount, e.EventID, e.AggregateVersion, e.OccurredAt)
	if err != nil {
		return "", fmt.Errorf("insert credit: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return DuplicatePayment, nil // rule 3 of docs/design.md: UNIQUE (payment_id)
	}
	if err := moveWallet(ctx, tx, pay.UserID, amount); err != nil {
		return "", err
	}
	ev, err := creditedEvent(e, pay, rate, amount)
	if err != nil {
		return "", err
	}
	return Credited, outbox.Add(ctx, tx, ev)
}

// creditedEvent is the CashbackCredited of a credit of amount at rate for
// the PaymentSucceeded e.
func creditedEvent(e events.Envelope, pay terms.PaymentPayload, rate int, amount int64) (events.Envelope, error) {
	return events.New(contract.CashbackCredited, pay.PaymentID, terms.CreditedVersion, terms.CreditedPayload{
		PaymentID: pay.PaymentID, UserID: pay.UserID, AmountPaise: amount, RateBP: rate,
		PaymentAmountPaise: pay.AmountPaise, Currency: terms.Currency, Recipient: pay.Recipient(),
		SourceEventID: e.EventID.String(),
	})
}

// reverse applies PaymentRefunded: the whole credit is reversed (partial
// refunds are not modelled: any refund takes the cashback back).
func reverse(ctx context.Context, tx pgx.Tx, e events.Envelope, pay terms.PaymentPayload) (Result, error) {
	inserted, status, _, err := lockPayment(ctx, tx, pay.PaymentID, "REFUNDED", e.AggregateVersion, e.EventID)
	if err != nil {
		return "", err
	}
	if inserted {
		// The refund overtook its PaymentSucceeded: nothing is credited yet,
		// and the REFUNDED row makes the later PaymentSucceeded a no-op.
		return RefundBeforeCredit, nil
	}
	if status == "REFUNDED" {
		return DuplicateRefund, nil
	}
	if _, err := tx.Exec(ctx, `UPDATE payment_versions SET status = 'REFUNDED', version = greatest(version, $2),
		last_event_id = $3, updated_at = now() WHERE payment_id = $1`, pay.PaymentID, e.AggregateVersion, e.EventID); err != nil {
		return "", err
	}
	var c struct {
		UserID, Recipient string
		Amount            int64
		RateBP            int
	}
	err = tx.QueryRow(ctx, `UPDATE cashback_credits SET status = 'REVERSED', reversed_at = now(), reversal_event_id = $2
		WHERE payment_id = $1 AND status = 'CREDITED'
		RETURNING user_id, recipient, amount_paise, rate_bp`, pay.PaymentID, e.EventID).Scan(&c.UserID, &c.Recipient, &c.Amount, &c.RateBP)
	if errors.Is(err, pgx.ErrNoRows) {
		// SUCCEEDED seen but no credit row: cannot happen (they commit
		// together), unless the credit was refused; nothing to reverse.
		return RefundBeforeCredit, nil
	}
	if err != nil {
		return "", fmt.Errorf("reverse credit: %w", err)
	}
	if err := moveWallet(ctx, tx, c.UserID, -c.Amount); err != nil {
		return "", err
	}
	ev, err := events.New(contract.CashbackReversed, pay.PaymentID, terms.ReversedVersion, terms.ReversedPayload{
		PaymentID: pay.PaymentID, UserID: c.UserID, AmountPaise: c.Amount, RateBP: c.RateBP, Currency: terms.Currency,
		Recipient: c.Recipient, Reason: "payment refunded", SourceEventID: e.EventID.String(),
	})
	if err != nil {
		return "", err
	}
	return Reversed, outbox.Add(ctx, tx, ev)
}

// moveWallet adds delta paise to the user's wallet, creating it at 0.
func moveWallet(ctx context.Context, tx pgx.Tx, userID string, delta int64) error {
	_, err := tx.Exec(ctx, `INSERT INTO wallets (user_id, balance_paise) VALUES ($1, $2)
		ON CONFLICT (user_id) DO UPDATE SET balance_paise = wallets.balance_paise + EXCLUDED.balance_paise, updated_at = now()`,
		userID, delta)
	if err != nil {
		return fmt.Errorf("move wallet: %w", err)
	}
	return nil
}

// otelScope names this package's instrumentation (meter, tracer) by its import
// path, read from the compiled package rather than written out, so that a
// copy under another module path (gonew) names itself.
var otelScope = reflect.TypeFor[Processor]().PkgPath()
