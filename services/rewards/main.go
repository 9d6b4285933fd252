// Command rewards credits cashback on payments, exactly once.
//
// It consumes PaymentSucceeded and PaymentRefunded from PAYMENTS_QUEUE,
// keeps cashback_credits and wallets in REWARDS_DATABASE_URL, publishes
// CashbackCredited / CashbackReversed to REWARDS_QUEUE through its outbox,
// and serves GET /v1/wallets/{user_id} on PORT. See README.md.
package main

import (
	"context"

	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/rewards/app"
)

func main() {
	service.Main("rewards", func(c app.Config) string { return c.DatabaseURL },
		func(ctx context.Context, cfg app.Config, d service.Deps) (service.App, error) {
			if err := testHooks(&cfg, d.Log); err != nil {
				return nil, err
			}
			client, err := sqstransport.NewClient(ctx)
			if err != nil {
				return nil, err
			}
			return app.New(ctx, cfg, d.Pool, client, d.Metrics, d.Log)
		})
}
