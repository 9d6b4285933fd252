// Command payments is the Payments service: the HTTP API that charges and
// refunds through Stripe (services/payments/api), and the outbox relay that
// publishes PaymentSucceeded / PaymentRefunded to SQS.
//
//	payments [all|api|relay|migrate]     (default: $ROLE, else all)
//
// all runs the API and, unless RELAY_ENABLED=false, the relay; api runs only
// the API (and the idempotency-key cleanup); relay runs only the relay (with
// /healthz, /readyz and /metrics on PORT); migrate applies the schema and
// exits. Every role applies the schema at start (safe from many replicas).
//
// Environment: PAYMENTS_DATABASE_URL (required), PORT [8081], LISTEN_ADDR
// [127.0.0.1; 0.0.0.0 in a container], ROLE [all],
// RELAY_ENABLED [true], PAYMENTS_QUEUE [payments-events], STRIPE_URL
// [http://127.0.0.1:12111, stripe-mock; https://api.stripe.com for real],
// STRIPE_API_KEY [sk_test_123], STRIPE_PAYMENT_METHOD [pm_card_visa],
// STRIPE_TIMEOUT [20s], STRIPE_MOCK_FIXTURES [false; true only against
// stripe-mock], IDEMPOTENCY_LOCK_TIMEOUT [1m], IDEMPOTENCY_KEY_TTL
// [24h], STARTUP_WAIT [60s], PAYMENTS_API_KEYS (name[/pay]:key,... required
// for the api and all roles; see service.ParseAPIKeys), PAYMENTS_RATE_LIMIT
// [1000] per PAYMENTS_RATE_WINDOW [1s] per client and
// PAYMENTS_RATE_LIMIT_PER_ADDRESS [2000] per remote address, LOG_LEVEL
// [info], FAILPOINTS (read only by -tags e2e builds), the relay's
// tuning RELAY_LEASE, RELAY_POLL_INTERVAL, ... (outbox.RelayEnv), and the
// standard AWS_* variables (AWS_ENDPOINT_URL for a local SQS).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/httpidem"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/payments/api"
	"github.com/effectively-once/payments-cashback/services/payments/migrations"
	"github.com/effectively-once/payments-cashback/services/payments/provider"
)

type config struct {
	service.Process `envPrefix:""` // SHUTDOWN_TIMEOUT, HTTP_READ_TIMEOUT, HTTP_WRITE_TIMEOUT

	DatabaseURL string `env:"PAYMENTS_DATABASE_URL,required,notEmpty"`
	Port        string `env:"PORT" envDefault:"8081"`
	ListenAddr  string `env:"LISTEN_ADDR"` // host to bind; "" = 127.0.0.1

	Role                string        `env:"ROLE" envDefault:"all"`
	RelayEnabled        bool          `env:"RELAY_ENABLED" envDefault:"true"`
	Queue               string        `env:"PAYMENTS_QUEUE" envDefault:"payments-events"`
	StripeURL           string        `env:"STRIPE_URL" envDefault:"http://127.0.0.1:12111"`
	StripeAPIKey        string        `env:"STRIPE_API_KEY" envDefault:"sk_test_123" secret:"true"`
	StripePaymentMethod string        `env:"STRIPE_PAYMENT_METHOD" envDefault:"pm_card_visa"`
	StripeTimeout       time.Duration `env:"STRIPE_TIMEOUT" envDefault:"20s"`
	// StripeMockFixtures: stripe-mock's fixture intents count as charged
	// (local stacks and tests only; refused with a live key).
	StripeMockFixtures bool          `env:"STRIPE_MOCK_FIXTURES"`
	LockTimeout        time.Duration `env:"IDEMPOTENCY_LOCK_TIMEOUT" envDefault:"1m"`
	KeyTTL             time.Duration `env:"IDEMPOTENCY_KEY_TTL" envDefault:"24h"`
	StartupWait        time.Duration `env:"STARTUP_WAIT" envDefault:"60s"`
	// API clients and limits: PAYMENTS_API_KEYS ("name[/roles]:key,...",
	// keys >= 32 bytes, an entry without roles has the role pay; required
	// for the api and all roles), PAYMENTS_RATE_LIMIT,
	// PAYMENTS_RATE_LIMIT_PER_ADDRESS, PAYMENTS_RATE_WINDOW.
	Access service.AccessEnv `envPrefix:"PAYMENTS_"`
	// Relay tuning, RELAY_LEASE etc. (see outbox.RelayEnv); unset: defaults.
	Relay outbox.RelayEnv `envPrefix:"RELAY_"`
}

func main() {
	log := service.NewLogger("payments")
	cfg, err := loadConfig(os.Args[1:])
	if err != nil {
		service.Fatal(log, "invalid configuration", err)
	}
	if err := run(context.Background(), cfg, log); err != nil {
		service.Fatal(log, "payments stopped", err)
	}
}

// loadConfig reads the environment; args may name the role.
func loadConfig(args []string) (config, error) {
	cfg, err := service.LoadConfig[config]()
	if err != nil {
		return cfg, err
	}
	if len(args) > 1 {
		return cfg, fmt.Errorf("configuration: usage: payments [all|api|relay|migrate], got %q", args)
	}
	if len(args) == 1 {
		cfg.Role = args[0]
	}
	var errs []error
	switch cfg.Role {
	case "all", "api", "migrate":
	case "relay":
		if !cfg.RelayEnabled {
			errs = append(errs, errors.New("ROLE=relay with RELAY_ENABLED=false would do nothing"))
		}
	default:
		errs = append(errs, fmt.Errorf("ROLE (or the first argument) %q: want all, api, relay or migrate", cfg.Role))
	}
	if _, err := pgxpool.ParseConfig(cfg.DatabaseURL); err != nil {
		errs = append(errs, fmt.Errorf("PAYMENTS_DATABASE_URL: %w", err))
	}
	if _, err := service.ListenAddr(cfg.ListenAddr, cfg.Port); err != nil {
		errs = append(errs, err)
	}
	if u, err := url.Parse(cfg.StripeURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("STRIPE_URL %q: want an http(s) URL such as http://127.0.0.1:12111 (stripe-mock) or https://api.stripe.com", cfg.StripeURL))
	}
	if cfg.StripeAPIKey == "" {
		errs = append(errs, errors.New("STRIPE_API_KEY is empty"))
	}
	if cfg.StripeMockFixtures && (strings.HasPrefix(cfg.StripeAPIKey, "sk_live_") || strings.HasPrefix(cfg.StripeAPIKey, "rk_live_")) {
		errs = append(errs, errors.New("STRIPE_MOCK_FIXTURES=true with a live Stripe key: the fixtures of stripe-mock are for tests only"))
	}
	if cfg.Queue == "" {
		errs = append(errs, errors.New("PAYMENTS_QUEUE is empty"))
	}
	if cfg.StripeTimeout <= 0 || cfg.LockTimeout <= 0 || cfg.KeyTTL <= 0 || cfg.StartupWait <= 0 {
		errs = append(errs, errors.New("STRIPE_TIMEOUT, IDEMPOTENCY_LOCK_TIMEOUT, IDEMPOTENCY_KEY_TTL and STARTUP_WAIT must be positive durations"))
	} else if cfg.StripeTimeout >= cfg.LockTimeout*3/4 {
		errs = append(errs, fmt.Errorf("STRIPE_TIMEOUT (%v) must be below 3/4 of IDEMPOTENCY_LOCK_TIMEOUT (%v): a charge must end before its key's lease", cfg.StripeTimeout, cfg.LockTimeout))
	}
	if cfg.Role == "all" || cfg.Role == "api" {
		if _, err := cfg.Access.Parse("PAYMENTS_", api.Needs, service.RolePay); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, fmt.Errorf("configuration: %w", err)
	}
	return cfg, nil
}

// run starts the service's role and blocks until SIGTERM/SIGINT, ctx's end,
// or a task's failure.
func run(ctx context.Context, cfg config, log *slog.Logger) error {
	log = log.With("role", cfg.Role)
	service.LogConfig(log, cfg)
	tel, err := service.SetupTelemetry("payments")
	if err != nil {
		return err
	}
	defer func() { _ = tel.Shutdown(context.WithoutCancel(ctx)) }()
	log.Info("telemetry", "trace_exporter", tel.Exporter)

	pool, err := service.OpenPool(ctx, cfg.DatabaseURL, cfg.StartupWait, log)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.Up(ctx, pool); err != nil {
		return err
	}
	if cfg.Role == "migrate" {
		log.Info("schema is up to date")
		return nil
	}

	checks := map[string]service.Check{"database": pool.Ping}
	router := service.NewRouter(log, tel.Metrics, checks)
	var tasks []service.Task
	if cfg.Role == "all" || cfg.Role == "api" {
		keys, err := httpidem.New(pool, httpidem.Config{LockTimeout: cfg.LockTimeout, Retention: cfg.KeyTTL, Logger: log})
		if err != nil {
			return err
		}
		gw := provider.NewStripe(provider.Config{
			URL: cfg.StripeURL, APIKey: cfg.StripeAPIKey, PaymentMethod: cfg.StripePaymentMethod,
			Timeout: cfg.StripeTimeout, MockFixtures: cfg.StripeMockFixtures, Logger: log,
		})
		access, err := cfg.Access.Parse("PAYMENTS_", api.Needs, service.RolePay)
		if err != nil {
			return err
		}
		srv, err := api.New(pool, keys, gw, log, access)
		if err != nil {
			return err
		}
		wake := outbox.NewNotifier(pool, outbox.NotifierConfig{Logger: log})
		srv.WakeRelays(wake)
		srv.Routes(router)
		tasks = append(tasks, service.Task{Name: "idempotency key cleanup", Run: keys.RunCleanup},
			service.Task{Name: "outbox wake-up (NOTIFY after commit)", Run: wake.Run})
	}
	if cfg.Role == "relay" || (cfg.Role == "all" && cfg.RelayEnabled) {
		client, err := sqstransport.NewClient(ctx)
		if err != nil {
			return err
		}
		relay, err := newRelay(ctx, cfg, pool, client, log)
		if err != nil {
			return err
		}
		checks["sqs "+cfg.Queue] = sqstransport.QueueCheck(client, cfg.Queue) // before the server starts: no race
		tasks = append(tasks, service.Task{Name: "outbox relay " + cfg.Queue, Run: relay.Run})
	}
	addr, err := service.ListenAddr(cfg.ListenAddr, cfg.Port)
	if err != nil {
		return err
	}
	tasks = append(tasks, service.HTTPTask(addr, router, log, cfg.HTTP()))
	return service.Run(ctx, log, cfg.ShutdownTimeout, tasks...)
}

// newRelay builds the outbox relay to the PAYMENTS_QUEUE queue, waiting for
// the queue to exist.
func newRelay(ctx context.Context, cfg config, pool *pgxpool.Pool, client *sqs.Client, log *slog.Logger) (*outbox.Relay, error) {
	queueURL, err := sqstransport.QueueURL(ctx, client, cfg.Queue, cfg.StartupWait, log)
	if err != nil {
		return nil, err
	}
	rc := outbox.RelayConfig{Logger: log}
	cfg.Relay.Apply(&rc)
	return outbox.NewRelay(pool, sqstransport.NewPublisher(client, queueURL, 0), rc)
}
