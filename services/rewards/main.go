// Command rewards credits cashback on payments, exactly once.
//
// It consumes PaymentSucceeded and PaymentRefunded from PAYMENTS_QUEUE,
// keeps cashback_credits and wallets in REWARDS_DATABASE_URL, publishes
// CashbackCredited / CashbackReversed to REWARDS_QUEUE through its outbox,
// and serves GET /v1/wallets/{user_id} on PORT. See README.md.
package main

import (
	"context"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/rewards/app"
)

func main() {
	log := service.NewLogger("rewards")
	cfg, err := service.LoadConfig[app.Config]()
	if err != nil {
		service.Fatal(log, "bad configuration", err)
	}
	metrics, shutdown, err := service.SetupTelemetry("rewards")
	if err != nil {
		service.Fatal(log, "telemetry", err)
	}
	defer shutdown(context.Background())
	ctx := context.Background()
	pool, err := service.OpenPool(ctx, cfg.DatabaseURL, time.Minute, log)
	if err != nil {
		service.Fatal(log, "database", err)
	}
	defer pool.Close()
	client, err := sqstransport.NewClient(ctx)
	if err != nil {
		service.Fatal(log, "sqs", err)
	}
	a, err := app.New(ctx, cfg, pool, client, metrics, log)
	if err != nil {
		service.Fatal(log, "start", err)
	}
	defer a.Close()
	if err := service.Run(ctx, log, a.Tasks()...); err != nil {
		service.Fatal(log, "stopped", err)
	}
}
