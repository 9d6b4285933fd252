// Command notifications sends the SMS for cashback events, once.
//
// It consumes CashbackCredited and CashbackReversed from REWARDS_QUEUE
// through an inbox (stored and acked at once, applied by a processor),
// records one notifications row per event in NOTIFICATIONS_DATABASE_URL and
// sends it through the provider at SMS_PROVIDER_URL with the idempotency
// key sms:<event_id>, via PENDING → SENDING → SENT. It serves
// GET /v1/notifications?event_id= on PORT. See README.md.
package main

import (
	"context"

	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/notifications/app"
)

func main() {
	service.Main("notifications", func(c app.Config) string { return c.DatabaseURL },
		func(ctx context.Context, cfg app.Config, d service.Deps) (service.App, error) {
			client, err := sqstransport.NewClient(ctx)
			if err != nil {
				return nil, err
			}
			return app.New(ctx, cfg, d.Pool, client, d.Metrics, d.Log)
		})
}
