// Package intent turns cashback events into SMS intents: one
// notifications row per (event, channel), status PENDING, with the
// idempotency key every provider call for it will carry. Recording is a
// database write inside the caller's transaction and nothing else: the
// provider is called later by the sender, never while applying an event.
package intent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// Channel is the only channel so far.
const Channel = "sms"

// Message kinds: each has its own SENDING policy (see package sender).
const (
	KindCashback         = "cashback"          // CashbackCredited
	KindCashbackReversed = "cashback_reversed" // CashbackReversed
)

// Kinds lists every kind, for configuration.
var Kinds = []string{KindCashback, KindCashbackReversed}

// Key is the provider idempotency key of the SMS for an event (rule 6, docs/design.md):
// derived from the event id, so every attempt, by any sender, after any
// crash, carries the same one.
func Key(eventID uuid.UUID) string { return "sms:" + eventID.String() }

// cashbackPayload is the part of CashbackCredited / CashbackReversed this
// service reads (services/rewards/cashback writes them).
type cashbackPayload struct {
	PaymentID   string `json:"payment_id"`
	UserID      string `json:"user_id"`
	AmountPaise int64  `json:"amount_paise"`
	Recipient   string `json:"recipient"`
}

// Intent is what Record stores.
type Intent struct {
	EventID   uuid.UUID
	EventType string
	Kind      string
	Recipient string
	Body      string
}

// Build derives the SMS intent of an event. Unknown event types and
// unusable payloads are permanent errors.
func Build(e events.Envelope) (Intent, error) {
	var p cashbackPayload
	if err := json.Unmarshal(e.Payload, &p); err != nil {
		return Intent{}, sqstransport.Permanent(fmt.Errorf("%s payload: %w", e.EventType, err))
	}
	if p.PaymentID == "" {
		p.PaymentID = e.AggregateID
	}
	to := p.Recipient
	if to == "" {
		to = p.UserID
	}
	if to == "" {
		return Intent{}, sqstransport.Permanent(fmt.Errorf("%s payload: no recipient nor user_id", e.EventType))
	}
	if !contract.ValidPhone(to) && !events.ValidID(to) {
		// The value stays out of the error: it may be a malformed number.
		return Intent{}, sqstransport.Permanent(fmt.Errorf("%s payload: recipient is neither an E.164 number nor a user id", e.EventType))
	}
	if !events.ValidID(p.PaymentID) {
		return Intent{}, sqstransport.Permanent(fmt.Errorf("%s payload: payment_id is not an id", e.EventType))
	}
	if p.AmountPaise < 0 {
		// Credits and reversals carry magnitudes: a negative one is a
		// producer's bug, not an SMS to send.
		return Intent{}, sqstransport.Permanent(fmt.Errorf("%s payload: amount_paise %d is negative", e.EventType, p.AmountPaise))
	}
	in := Intent{EventID: e.EventID, EventType: e.EventType, Recipient: to}
	switch e.EventType {
	case contract.CashbackCredited:
		in.Kind = KindCashback
		in.Body = fmt.Sprintf("You got %s cashback on payment %s. It is in your wallet.", Rupees(p.AmountPaise), p.PaymentID)
	case contract.CashbackReversed:
		in.Kind = KindCashbackReversed
		in.Body = fmt.Sprintf("The %s cashback on payment %s was reversed: the payment was refunded.", Rupees(p.AmountPaise), p.PaymentID)
	default:
		return Intent{}, sqstransport.Permanent(fmt.Errorf("notifications does not handle event type %q", e.EventType))
	}
	return in, nil
}

// Rupees formats paise the Indian way: "₹1,23,456.78" (the last three
// digits of the rupees, then groups of two).
func Rupees(paise int64) string {
	sign, abs := "", uint64(paise)
	if paise < 0 {
		// In uint64, so that -MinInt64 does not overflow back to itself.
		sign, abs = "-", -uint64(paise)
	}
	whole := fmt.Sprint(abs / 100)
	if len(whole) > 3 {
		head, tail := whole[:len(whole)-3], whole[len(whole)-3:]
		for i := len(head) - 2; i > 0; i -= 2 {
			head = head[:i] + "," + head[i:]
		}
		whole = head + "," + tail
	}
	return fmt.Sprintf("%s₹%s.%02d", sign, whole, abs%100)
}

// Record stores the SMS intent of e in tx, once, and only while e is the
// newest version of its payment (rule 5): it reports recorded = false and
// inserts nothing for a second call for the same event (UNIQUE (event_id,
// channel), behind the inbox's own dedupe), nor for an event whose payment
// has already been notified at its version or a later one, such as a
// CashbackCredited that arrives after its CashbackReversed was applied
// (the inbox applies such a late row; telling the customer "it is in your
// wallet" then would be false). The version is recorded in tx, so a
// rolled-back intent leaves no trace of it.
func Record(ctx context.Context, tx pgx.Tx, e events.Envelope) (recorded bool, err error) {
	in, err := Build(e)
	if err != nil {
		return false, err
	}
	tag, err := tx.Exec(ctx, `INSERT INTO notification_versions (aggregate_id, version, event_id) VALUES ($1, $2, $3)
		ON CONFLICT (aggregate_id) DO UPDATE SET version = EXCLUDED.version, event_id = EXCLUDED.event_id, updated_at = now()
		WHERE notification_versions.version < EXCLUDED.version`, e.AggregateID, e.AggregateVersion, e.EventID)
	if err != nil {
		return false, fmt.Errorf("record the notified version: %w", err)
	}
	if tag.RowsAffected() == 0 {
		slog.InfoContext(ctx, "no SMS: its payment was already notified at this version or a later one",
			"event_id", e.EventID, "event_type", e.EventType, "payment_id", e.AggregateID, "version", e.AggregateVersion)
		return false, nil
	}
	tag, err = tx.Exec(ctx, `INSERT INTO notifications (event_id, event_type, channel, kind, recipient, body, idempotency_key, traceparent)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (event_id, channel) DO NOTHING`,
		in.EventID, in.EventType, Channel, in.Kind, in.Recipient, in.Body, Key(in.EventID), traceparent(ctx))
	if err != nil {
		return false, fmt.Errorf("record notification intent: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// traceparent is the W3C trace context of ctx's span, or nil outside one.
func traceparent(ctx context.Context) *string {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	if tp := c["traceparent"]; tp != "" {
		return &tp
	}
	return nil
}

// Handler adapts Record to the inbox processor's handler signature.
func Handler(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
	_, err := Record(ctx, tx, e)
	return err
}
