// Package app wires the rewards service: schema, the payments-events
// subscriber feeding the idempotent consumer "rewards", the outbox relay to
// rewards-events, dedupe-partition maintenance and the HTTP API. main.go
// only loads the configuration and runs the tasks; tests build the same
// App against the test stack.
package app

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/migrate"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/rewards/api"
	"github.com/effectively-once/payments-cashback/services/rewards/cashback"
	"github.com/effectively-once/payments-cashback/services/rewards/cashback/terms"
	"github.com/effectively-once/payments-cashback/services/rewards/migrations"
)

// Config is the service's environment.
type Config struct {
	service.Process `envPrefix:""` // DB_MAX_CONNS, SHUTDOWN_TIMEOUT, HTTP_*_TIMEOUT, PPROF_ADDR, LOG_LEVEL

	DatabaseURL string `env:"REWARDS_DATABASE_URL,required,notEmpty"`
	Port        string `env:"PORT" envDefault:"8082"`
	// ListenAddr is the host to bind ("" = 127.0.0.1; 0.0.0.0 in a container).
	ListenAddr string `env:"LISTEN_ADDR"`
	// Access: REWARDS_API_KEYS ("name[/read+admin]:key,..."; an entry
	// without roles may only read; some client must hold read and some
	// admin), REWARDS_RATE_LIMIT, REWARDS_RATE_LIMIT_PER_ADDRESS,
	// REWARDS_RATE_WINDOW.
	Access service.AccessEnv `envPrefix:"REWARDS_"`
	// MaxRateBP is the highest cashback rate an admin may schedule.
	MaxRateBP int `env:"REWARDS_MAX_RATE_BP" envDefault:"1000"`
	// RateMinLead: a new rate starts at least this long from now.
	RateMinLead   time.Duration `env:"REWARDS_RATE_MIN_LEAD" envDefault:"1m"`
	PaymentsQueue string        `env:"PAYMENTS_QUEUE" envDefault:"payments-events"`
	RewardsQueue  string        `env:"REWARDS_QUEUE" envDefault:"rewards-events"`
	// CONSUMER_CONCURRENCY, CONSUMER_BATCH_SIZE, QUEUE_WAIT, SUBSCRIBER_*:
	// each receive of up to CONSUMER_BATCH_SIZE events is applied in one
	// transaction (idempotent.Consumer.HandleBatch, falling back to one
	// transaction per event when anything in the batch fails); with 1, one
	// transaction per event.
	sqstransport.ConsumerEnv `envPrefix:""`
	// DedupeRetention is the dedupe window: it must outlast SQS's 14-day
	// maximum retention by a day, so the service refuses to start below 360h.
	DedupeRetention time.Duration `env:"DEDUPE_RETENTION" envDefault:"360h"`
	// Fail is the failure-injecting test hook: nil in production. Tests set
	// it; so does main in builds tagged e2e, from REWARDS_FAIL_EVENT_IDS,
	// REWARDS_FAIL_FIRST_N and REWARDS_SLOW_EVENT_IDS (see package cashback).
	Fail *cashback.FailHook `env:"-"`

	// Tuning for tests; zero takes the library defaults.
	Subscriber sqstransport.SubscriberConfig `env:"-"`
	Relay      outbox.RelayConfig            `env:"-"`
	// RELAY_* (see outbox.RelayEnv) fill what Relay leaves zero.
	RelayEnv outbox.RelayEnv `envPrefix:"RELAY_"`
}

// Complete checks the settings as loaded from the environment
// (service.Completer), every error at once, each naming its variable,
// before the service connects to anything. rewards takes no arguments.
func (c *Config) Complete(args []string) error {
	var l service.Limits
	if len(args) > 0 {
		l.Add(fmt.Errorf("usage: rewards (no arguments; the environment configures it), got %q", args))
	}
	_, err := c.parse()
	l.Add(err)
	l.Add(c.ConsumerEnv.Validate())
	l.Add(c.RelayEnv.Validate("RELAY_"))
	return l.Err()
}

// parse checks what New needs of c (tests also build it in code), every
// error at once.
func (c Config) parse() (service.Front, error) {
	var l service.Limits
	front, err := service.ParseFront(c.ListenAddr, c.Port, c.Access, "REWARDS_", api.Needs, service.RoleRead)
	l.Add(err)
	if err := idempotent.ValidateRetention(c.DedupeRetention, sqsMaxRetention); err != nil {
		l.Add(fmt.Errorf("DEDUPE_RETENTION: %w", err))
	}
	l.Int("REWARDS_MAX_RATE_BP", c.MaxRateBP, 0, terms.MaxRateBP)
	l.Positive("REWARDS_RATE_MIN_LEAD", c.RateMinLead)
	return front, l.Err()
}

// sqsMaxRetention is the longest SQS keeps a message (source queue or DLQ).
const sqsMaxRetention = 14 * 24 * time.Hour

// App is the wired service.
type App struct {
	Processor *cashback.Processor
	Fail      *cashback.FailHook // the test hook: nil unless Config.Fail was set
	Router    http.Handler

	pool       *pgxpool.Pool
	subscriber *sqstransport.Subscriber
	relay      *outbox.Relay
	wake       *outbox.Notifier
	maintainer *idempotent.Maintainer
	addr       string
	http       service.HTTPTimeouts
	log        *slog.Logger
	// the queues, as configured: the tasks are named for them
	paymentsQueue, rewardsQueue string
}

// Migrate applies the schema this service needs: the outbox, the dedupe
// table (processed_messages) and its own tables.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := outbox.Migrate(ctx, pool); err != nil {
		return err
	}
	if err := idempotent.Migrate(ctx, pool); err != nil {
		return err
	}
	return migrate.Up(ctx, pool, migrations.FS, migrations.VersionTable)
}

// New migrates the database and wires everything; nothing runs until the
// tasks do.
func New(ctx context.Context, cfg Config, pool *pgxpool.Pool, client *sqs.Client, metrics http.Handler, log *slog.Logger) (_ *App, err error) {
	front, err := cfg.parse()
	if err != nil {
		return nil, err
	}
	srv, err := api.New(pool, log, front.Access, cashback.RateRules{MaxBP: cfg.MaxRateBP, MinLead: cfg.RateMinLead})
	if err != nil {
		return nil, err
	}
	if err := Migrate(ctx, pool); err != nil {
		return nil, err
	}
	// Creates processed_messages' partitions for this window now, drops
	// expired ones, and keeps doing so hourly while the service runs.
	maint, err := idempotent.NewMaintainer(pool, idempotent.MaintainerConfig{
		Retention: cfg.DedupeRetention, QueueRetention: sqsMaxRetention, Logger: log})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			maint.Close()
		}
	}()
	if _, err := maint.RunOnce(ctx); err != nil {
		// Migrate made the partitions of the default window; the hourly
		// round retries whatever failed here (typically a lock timeout).
		log.Warn("dedupe maintenance at start failed; retried hourly", "error", err)
	}
	var inject cashback.Injector
	if cfg.Fail != nil {
		inject = cfg.Fail
	}
	consumer, err := idempotent.NewConsumer(pool, cashback.ConsumerName,
		idempotent.WithRetention(cfg.DedupeRetention), idempotent.WithLogger(log))
	if err != nil {
		return nil, err
	}
	proc, err := cashback.NewProcessor(consumer, inject, log)
	if err != nil {
		return nil, err
	}
	wake := outbox.NewNotifier(pool, outbox.NotifierConfig{Logger: log})
	proc.WakeRelays(wake)

	rewardsURL, err := sqstransport.QueueURL(ctx, client, cfg.RewardsQueue, cfg.QueueWait, log)
	if err != nil {
		return nil, err
	}
	sc := cfg.Subscriber
	if sc.Gate == nil {
		if sc.Gate, err = service.DatabaseGate(pool, log); err != nil {
			return nil, err
		}
	}
	sub, err := cfg.Subscribe(ctx, client, cfg.PaymentsQueue, sc, log, proc.HandleBatchDeliveries, proc.HandleDelivery)
	if err != nil {
		return nil, err
	}
	rc := cfg.Relay
	cfg.RelayEnv.Apply(&rc)
	rc.Logger = log
	relay, err := outbox.NewRelay(pool, sqstransport.NewPublisher(client, rewardsURL, 0), rc)
	if err != nil {
		return nil, err
	}

	r := service.NewRouter(log, metrics, map[string]service.Check{"database": pool.Ping, "consumer": sc.Gate.Check,
		"sqs " + cfg.PaymentsQueue: sqstransport.QueueCheck(client, cfg.PaymentsQueue),
		"sqs " + cfg.RewardsQueue:  sqstransport.QueueCheck(client, cfg.RewardsQueue)})
	srv.Routes(r)
	return &App{Processor: proc, Fail: cfg.Fail, Router: r, pool: pool, subscriber: sub, relay: relay, wake: wake,
		maintainer: maint, addr: front.Addr, http: cfg.HTTP(), log: log, paymentsQueue: cfg.PaymentsQueue, rewardsQueue: cfg.RewardsQueue}, nil
}

// Tasks are the service's long-running parts, for service.Run.
func (a *App) Tasks() []service.Task {
	return []service.Task{
		service.HTTPTask(a.addr, a.Router, a.log, a.http),
		{Name: "subscriber " + a.paymentsQueue, Run: a.subscriber.Run},
		{Name: "outbox relay " + a.rewardsQueue, Run: a.relay.Run},
		{Name: "outbox wake-up (NOTIFY after commit)", Run: a.wake.Run},
		{Name: "dedupe retention maintenance", Run: a.maintainer.Run},
	}
}

// Close releases the maintainer's own connection (call after the tasks end).
func (a *App) Close() { a.maintainer.Close() }

// Workers are Tasks without the HTTP server (tests serve Router themselves).
func (a *App) Workers() []service.Task { return a.Tasks()[1:] }
