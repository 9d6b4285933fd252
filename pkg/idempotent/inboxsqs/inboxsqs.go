// Package inboxsqs feeds an idempotent.Inbox from an SQS queue:
//
//	in, _ := idempotent.NewInbox(pool, "notifications", idempotent.InboxConfig{})
//	sub, _ := sqstransport.NewSubscriber(client, cfg, inboxsqs.Handler(in, idempotent.ByAggregate))
//
// Each delivery is stored with one INSERT and acked as soon as that commits,
// however long the inbox's Processor later takes to apply it. It lives in its
// own package so that pkg/idempotent does not depend on the AWS SDK.
package inboxsqs

import (
	"context"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// Handler returns an sqstransport.Handler that stores each delivery's
// envelope in in under key(envelope) (nil key: idempotent.ByAggregate).
// The subscriber then deletes the message when it was stored or was a
// duplicate; parks it in the DLQ when the inbox refuses it permanently (too
// old for the dedupe window, an event id reused with another payload, an
// invalid envelope); and leaves it for redelivery on any other error.
func Handler(in *idempotent.Inbox, key idempotent.KeyFunc) sqstransport.Handler {
	receive := in.Receiver(key)
	return func(ctx context.Context, d sqstransport.Delivery) error {
		return receive(ctx, d.Envelope)
	}
}

// BatchHandler is Handler for a whole receive (sqstransport.
// NewBatchSubscriber): the receive's envelopes are stored with one INSERT
// (idempotent.Inbox.ReceiveBatch), each acked, parked or left for
// redelivery on its own outcome, as Handler decides it for one.
func BatchHandler(in *idempotent.Inbox, key idempotent.KeyFunc) sqstransport.BatchHandler {
	if key == nil {
		key = idempotent.ByAggregate
	}
	return func(ctx context.Context, ds []sqstransport.Delivery) []error {
		ms := make([]idempotent.Incoming, len(ds))
		for i, d := range ds {
			ms[i] = idempotent.Incoming{Ctx: d.Ctx, Envelope: d.Envelope, OrderingKey: key(d.Envelope)}
		}
		return in.ReceiveBatch(ctx, ms)
	}
}
