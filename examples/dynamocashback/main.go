// Command dynamocashback is the rewards consumer on DynamoDB instead of
// PostgreSQL: it reads PaymentSucceeded events from SQS and credits 2%
// cashback exactly once, the dedupe item, the credit and the wallet in one
// TransactWriteItems (pkg/idempotent/idemdynamo), optionally behind the
// Redis pre-filter (pkg/idempotent/prefilter). See README.md.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/caarlos0/env/v11"
	"github.com/redis/go-redis/v9"

	"github.com/effectively-once/payments-cashback/pkg/idempotent/idemdynamo"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

type config struct {
	QueueURL      string `env:"QUEUE_URL,required"`
	DedupeTable   string `env:"DEDUPE_TABLE" envDefault:"processed_messages"`
	WalletsTable  string `env:"WALLETS_TABLE" envDefault:"wallets"`
	CreditsTable  string `env:"CREDITS_TABLE" envDefault:"cashback_credits"`
	CreateTables  bool   `env:"CREATE_TABLES" envDefault:"false"`
	RedisURL      string `env:"REDIS_URL"` // empty: the pre-filter is off
	Concurrency   int    `env:"SUBSCRIBER_CONCURRENCY" envDefault:"8"`
	LogLevelDebug bool   `env:"LOG_DEBUG" envDefault:"false"`
}

// loadConfig reads the environment (opts.Environment, or the process's)
// and refuses a concurrency the subscriber would silently replace.
func loadConfig(opts env.Options) (config, error) {
	cfg, err := env.ParseAsWithOptions[config](opts)
	if err != nil {
		return cfg, err
	}
	if cfg.Concurrency < 1 {
		return cfg, fmt.Errorf("SUBSCRIBER_CONCURRENCY=%d: want at least 1", cfg.Concurrency)
	}
	return cfg, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dynamocashback:", err)
		os.Exit(1)
	}
}

// run consumes, configured by the environment and logging to logs, until
// ctx ends (a signal, in main), and returns nil then: the deliveries in
// flight finish first, within the subscriber's grace.
func run(ctx context.Context, logs io.Writer) error {
	cfg, err := loadConfig(env.Options{})
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if cfg.LogLevelDebug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: level}))

	db, err := idemdynamo.NewClient(ctx)
	if err != nil {
		return err
	}
	tables := Tables{Dedupe: cfg.DedupeTable, Wallets: cfg.WalletsTable, Credits: cfg.CreditsTable}
	if cfg.CreateTables {
		if err := Setup(ctx, db, tables); err != nil {
			return err
		}
	}
	var rdb redis.UniversalClient
	if cfg.RedisURL != "" {
		opt, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			return fmt.Errorf("REDIS_URL: %w", err)
		}
		rdb = redis.NewClient(opt)
		defer rdb.Close()
	}
	app, err := NewApp(db, tables, rdb, log)
	if err != nil {
		return err
	}
	sq, err := sqstransport.NewClient(ctx)
	if err != nil {
		return err
	}
	sub, err := sqstransport.NewSubscriber(sq, sqstransport.SubscriberConfig{
		QueueURL: cfg.QueueURL, Concurrency: cfg.Concurrency, Logger: log,
	}, app.HandleDelivery)
	if err != nil {
		return err
	}
	log.Info("consuming", "queue", cfg.QueueURL, "prefilter", rdb != nil)
	return sub.Run(ctx)
}
