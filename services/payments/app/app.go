// Package app wires the payments service: the schema, the HTTP API that
// charges and refunds through Stripe (package api), the idempotency-key
// cleanup, and the outbox relay that publishes PaymentSucceeded /
// PaymentRefunded to PAYMENTS_QUEUE. main.go only hands Build to
// service.Main; tests run the same Build through service.Serve.
//
// The role (ROLE, or the command's first argument) chooses what runs: all
// runs the API and, unless RELAY_ENABLED=false, the relay; api runs only
// the API (and the key cleanup); relay runs only the relay (with /healthz,
// /readyz and /metrics on PORT); migrate applies the schema and exits.
// Every role applies the schema at start (safe from many replicas).
package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/httpidem"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/payments/api"
	"github.com/effectively-once/payments-cashback/services/payments/migrations"
	"github.com/effectively-once/payments-cashback/services/payments/provider"
)

// Config is the service's environment (and its role argument).
type Config struct {
	service.Process `envPrefix:""` // DB_MAX_CONNS, SHUTDOWN_TIMEOUT, HTTP_*_TIMEOUT, PPROF_ADDR, LOG_LEVEL

	DatabaseURL string `env:"PAYMENTS_DATABASE_URL,required,notEmpty"`
	Port        string `env:"PORT" envDefault:"8081"`
	// ListenAddr is the host to bind ("" = 127.0.0.1; 0.0.0.0 in a container).
	ListenAddr string `env:"LISTEN_ADDR"`

	// Role is all, api, relay or migrate; the first argument overrides it.
	Role         string `env:"ROLE" envDefault:"all"`
	RelayEnabled bool   `env:"RELAY_ENABLED" envDefault:"true"`
	Queue        string `env:"PAYMENTS_QUEUE" envDefault:"payments-events"`
	// StripeURL is stripe-mock by default; https://api.stripe.com for real.
	StripeURL           string        `env:"STRIPE_URL" envDefault:"http://127.0.0.1:12111"`
	StripeAPIKey        string        `env:"STRIPE_API_KEY" envDefault:"sk_test_123" secret:"true"`
	StripePaymentMethod string        `env:"STRIPE_PAYMENT_METHOD" envDefault:"pm_card_visa"`
	StripeTimeout       time.Duration `env:"STRIPE_TIMEOUT" envDefault:"20s"`
	// StripeMockFixtures: stripe-mock's fixture intents count as charged
	// (local stacks and tests only; refused with a live key).
	StripeMockFixtures bool          `env:"STRIPE_MOCK_FIXTURES"`
	LockTimeout        time.Duration `env:"IDEMPOTENCY_LOCK_TIMEOUT" envDefault:"1m"`
	KeyTTL             time.Duration `env:"IDEMPOTENCY_KEY_TTL" envDefault:"24h"`
	// StartupWait bounds the waits for the database and the queue at start.
	StartupWait time.Duration `env:"STARTUP_WAIT" envDefault:"60s"`
	// API clients and limits: PAYMENTS_API_KEYS ("name[/roles]:key,...",
	// keys >= 32 bytes, an entry without roles has the role pay; required
	// for the api and all roles), PAYMENTS_RATE_LIMIT,
	// PAYMENTS_RATE_LIMIT_PER_ADDRESS, PAYMENTS_RATE_WINDOW.
	Access service.AccessEnv `envPrefix:"PAYMENTS_"`
	// Relay tuning, RELAY_LEASE etc. (see outbox.RelayEnv); unset: defaults.
	Relay outbox.RelayEnv `envPrefix:"RELAY_"`
}

// DatabaseURL is the service's database, for service.Main.
func DatabaseURL(c Config) string { return c.DatabaseURL }

// DatabaseWait is STARTUP_WAIT (service.DatabaseWaiter).
func (c Config) DatabaseWait() time.Duration { return c.StartupWait }

func (c Config) api() bool   { return c.Role == "all" || c.Role == "api" }
func (c Config) relay() bool { return c.Role == "relay" || (c.Role == "all" && c.RelayEnabled) }

// Complete takes the role from args and checks the settings against each
// other (service.Completer): every error at once, each naming its variable.
func (c *Config) Complete(args []string) error {
	if len(args) > 1 {
		return fmt.Errorf("usage: payments [all|api|relay|migrate], got %q", args)
	}
	if len(args) == 1 {
		c.Role = args[0]
	}
	var l service.Limits
	switch c.Role {
	case "all", "api", "migrate":
	case "relay":
		if !c.RelayEnabled {
			l.Add(errors.New("ROLE=relay with RELAY_ENABLED=false would do nothing"))
		}
	default:
		l.Add(fmt.Errorf("ROLE (or the first argument) %q: want all, api, relay or migrate", c.Role))
	}
	if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
		l.Add(fmt.Errorf("PAYMENTS_DATABASE_URL: %w", err))
	}
	_, err := service.ListenAddr(c.ListenAddr, c.Port)
	l.Add(err)
	l.HTTPURL("STRIPE_URL", c.StripeURL, "http://127.0.0.1:12111 (stripe-mock) or https://api.stripe.com")
	if c.StripeAPIKey == "" {
		l.Add(errors.New("STRIPE_API_KEY is empty"))
	}
	if c.StripeMockFixtures && (strings.HasPrefix(c.StripeAPIKey, "sk_live_") || strings.HasPrefix(c.StripeAPIKey, "rk_live_")) {
		l.Add(errors.New("STRIPE_MOCK_FIXTURES=true with a live Stripe key: the fixtures of stripe-mock are for tests only"))
	}
	if c.Queue == "" {
		l.Add(errors.New("PAYMENTS_QUEUE is empty"))
	}
	if c.StripeTimeout <= 0 || c.LockTimeout <= 0 || c.KeyTTL <= 0 || c.StartupWait <= 0 {
		l.Add(errors.New("STRIPE_TIMEOUT, IDEMPOTENCY_LOCK_TIMEOUT, IDEMPOTENCY_KEY_TTL and STARTUP_WAIT must be positive durations"))
	} else if c.StripeTimeout >= c.LockTimeout*3/4 {
		l.Add(fmt.Errorf("STRIPE_TIMEOUT (%v) must be below 3/4 of IDEMPOTENCY_LOCK_TIMEOUT (%v): a charge must end before its key's lease", c.StripeTimeout, c.LockTimeout))
	}
	if c.KeyTTL > provider.StripeKeyRetention {
		// An unfinished key is taken over by its client's retry at any age;
		// past Stripe's own retention, the repeated charge could be a new one.
		l.Add(fmt.Errorf("IDEMPOTENCY_KEY_TTL (%v) must be at most %v: Stripe keeps its idempotency keys that long, and a retry after it could charge the card twice",
			c.KeyTTL, provider.StripeKeyRetention))
	}
	if c.api() {
		_, err := c.Access.Parse("PAYMENTS_", api.Needs, service.RolePay)
		l.Add(err)
	}
	l.Add(c.Relay.Validate("RELAY_"))
	return l.Err()
}

// App is the wired role: its tasks (none for migrate).
type App struct{ tasks []service.Task }

// Tasks are the role's long-running parts, for service.Run.
func (a *App) Tasks() []service.Task { return a.tasks }

// Close releases nothing: the pool is the caller's.
func (a *App) Close() {}

// Build migrates the database and wires cfg.Role; nothing runs until the
// tasks do. Only a role with the relay opens an SQS client.
func Build(ctx context.Context, cfg Config, d service.Deps) (service.App, error) {
	log := d.Log.With("role", cfg.Role)
	if err := migrations.Up(ctx, d.Pool); err != nil {
		return nil, err
	}
	if cfg.Role == "migrate" {
		log.Info("schema is up to date")
		return &App{}, nil
	}
	checks := map[string]service.Check{"database": d.Pool.Ping}
	var tasks []service.Task
	var srv *api.Server
	if cfg.api() {
		keys, err := httpidem.New(d.Pool, httpidem.Config{LockTimeout: cfg.LockTimeout, Retention: cfg.KeyTTL, Logger: log})
		if err != nil {
			return nil, err
		}
		gw := provider.NewStripe(provider.Config{
			URL: cfg.StripeURL, APIKey: cfg.StripeAPIKey, PaymentMethod: cfg.StripePaymentMethod,
			Timeout: cfg.StripeTimeout, MockFixtures: cfg.StripeMockFixtures, Logger: log,
		})
		access, err := cfg.Access.Parse("PAYMENTS_", api.Needs, service.RolePay)
		if err != nil {
			return nil, err
		}
		if srv, err = api.New(d.Pool, keys, gw, log, access); err != nil {
			return nil, err
		}
		wake := outbox.NewNotifier(d.Pool, outbox.NotifierConfig{Logger: log})
		srv.WakeRelays(wake)
		tasks = append(tasks, service.Task{Name: "idempotency key cleanup", Run: keys.RunCleanup},
			service.Task{Name: "idempotency resume (crashed payments and refunds)", Run: keys.RunResume(provider.KeyWindow, srv.Resume)},
			service.Task{Name: "outbox wake-up (NOTIFY after commit)", Run: wake.Run})
	}
	if cfg.relay() {
		client, err := sqstransport.NewClient(ctx)
		if err != nil {
			return nil, err
		}
		queueURL, err := sqstransport.QueueURL(ctx, client, cfg.Queue, cfg.StartupWait, log)
		if err != nil {
			return nil, err
		}
		rc := outbox.RelayConfig{Logger: log}
		cfg.Relay.Apply(&rc)
		relay, err := outbox.NewRelay(d.Pool, sqstransport.NewPublisher(client, queueURL, 0), rc)
		if err != nil {
			return nil, err
		}
		checks["sqs "+cfg.Queue] = sqstransport.QueueCheck(client, cfg.Queue)
		tasks = append(tasks, service.Task{Name: "outbox relay " + cfg.Queue, Run: relay.Run})
	}
	router := service.NewRouter(log, d.Metrics, checks)
	if srv != nil {
		srv.Routes(router)
	}
	addr, err := service.ListenAddr(cfg.ListenAddr, cfg.Port)
	if err != nil {
		return nil, err
	}
	return &App{tasks: append(tasks, service.HTTPTask(addr, router, log, cfg.HTTP()))}, nil
}
