// Package intent records cashback events as SMS intents: one
// notifications row per (event, channel), status PENDING, with the
// idempotency key every provider call for it will carry (package compose
// decides what the SMS says). Recording is a database write inside the
// caller's transaction and nothing else: the provider is called later by
// the sender, never while applying an event.
package intent

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/notifications/intent/compose"
)

// Record stores the SMS intent of e in tx, once, and only while e is the
// newest version of its payment (rule 5): it reports recorded = false and
// inserts nothing for a second call for the same event (UNIQUE (event_id,
// channel), behind the inbox's own dedupe), nor for an event whose payment
// has already been notified at its version or a later one, such as a
// CashbackCredited that arrives after its CashbackReversed was applied
// (the inbox applies such a late row; telling the customer "it is in your
// wallet" then would be false), nor for a cashback of 0 paise, whose
// version is still recorded (compose.Intent.NoSMS). The version is recorded in tx, so a
// rolled-back intent leaves no trace of it. The intent row keeps its
// payment and version too: the sender sends a payment's SMS in version
// order. Why an event records no SMS is logged to log at Info.
func Record(ctx context.Context, log *slog.Logger, tx pgx.Tx, e events.Envelope) (recorded bool, err error) {
	in, err := compose.Build(e)
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
		log.InfoContext(ctx, "no SMS: its payment was already notified at this version or a later one",
			"event_id", e.EventID, "event_type", e.EventType, "payment_id", e.AggregateID, "version", e.AggregateVersion)
		return false, nil
	}
	if in.NoSMS != "" {
		log.InfoContext(ctx, "no SMS: "+in.NoSMS,
			"event_id", e.EventID, "event_type", e.EventType, "payment_id", e.AggregateID, "version", e.AggregateVersion)
		return false, nil
	}
	tag, err = tx.Exec(ctx, `INSERT INTO notifications (event_id, event_type, channel, kind, recipient, body, idempotency_key, traceparent,
		aggregate_id, aggregate_version)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (event_id, channel) DO NOTHING`,
		in.EventID, in.EventType, compose.Channel, in.Kind, in.Recipient, in.Body, compose.Key(in.EventID), traceparent(ctx),
		e.AggregateID, e.AggregateVersion)
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

// Handler adapts Record, logging to log, to the inbox processor's handler
// signature.
func Handler(log *slog.Logger) func(context.Context, pgx.Tx, events.Envelope) error {
	return func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		_, err := Record(ctx, log, tx, e)
		return err
	}
}
