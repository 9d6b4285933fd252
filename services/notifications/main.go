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
	"time"

	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/notifications/app"
)

func main() {
	log := service.NewLogger("notifications")
	cfg, err := service.LoadConfig[app.Config]()
	if err != nil {
		service.Fatal(log, "bad configuration", err)
	}
	metrics, shutdown, err := service.SetupTelemetry("notifications")
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
