// Command payments is the Payments service: the HTTP API that charges and
// refunds through Stripe, and the outbox relay that publishes
// PaymentSucceeded / PaymentRefunded to SQS (wired in package app).
//
//	payments [all|api|relay|migrate]     (default: $ROLE, else all)
//
// Environment: PAYMENTS_DATABASE_URL (required), PORT [8081], LISTEN_ADDR
// [127.0.0.1; 0.0.0.0 in a container], ROLE [all],
// RELAY_ENABLED [true], PAYMENTS_QUEUE [payments-events], STRIPE_URL
// [http://127.0.0.1:12111, stripe-mock; https://api.stripe.com for real],
// STRIPE_API_KEY [sk_test_123], STRIPE_PAYMENT_METHOD [pm_card_visa],
// STRIPE_TIMEOUT [20s], STRIPE_MOCK_FIXTURES [false; true only against
// stripe-mock], IDEMPOTENCY_LOCK_TIMEOUT [1m], IDEMPOTENCY_KEY_TTL
// [24h, at most Stripe's 24h], STARTUP_WAIT [60s], PAYMENTS_API_KEYS (name[/pay]:key,... required
// for the api and all roles; see service.ParseAPIKeys), PAYMENTS_RATE_LIMIT
// [1000] per PAYMENTS_RATE_WINDOW [1s] per client and
// PAYMENTS_RATE_LIMIT_PER_ADDRESS [2000] per remote address, FAILPOINTS
// (read only by -tags e2e builds), the relay's tuning RELAY_LEASE,
// RELAY_POLL_INTERVAL, RELAY_BATCH_SIZE, RELAY_WORKERS, RELAY_RETRY_BASE,
// RELAY_RETRY_MAX, RELAY_DELETE_ON_PUBLISH (outbox.RelayEnv), what every
// service reads (service.Process): LOG_LEVEL [info], DB_MAX_CONNS [10],
// SHUTDOWN_TIMEOUT [30s], HTTP_READ_TIMEOUT [15s], HTTP_WRITE_TIMEOUT
// [60s], PPROF_ADDR [unset], the standard OTEL_* variables, and the
// standard AWS_* variables (AWS_ENDPOINT_URL for a local SQS). A setting
// out of its range stops the process at start, before it connects to
// anything, with every such variable named.
package main

import (
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/payments/app"
)

func main() { service.Main("payments", app.DatabaseURL, app.Build) }
