// Package app wires the notifications service: schema, the rewards-events
// subscriber storing into the inbox (acked at once), the inbox processor
// recording SMS intents, the sender driving PENDING → SENDING → SENT, and
// the HTTP API. main.go only loads the configuration and runs the tasks;
// tests build the same App against the test stack.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/inboxsqs"
	"github.com/effectively-once/payments-cashback/pkg/migrate"
	"github.com/effectively-once/payments-cashback/pkg/outage"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/pkg/worker"
	"github.com/effectively-once/payments-cashback/services/notifications/api"
	"github.com/effectively-once/payments-cashback/services/notifications/intent"
	"github.com/effectively-once/payments-cashback/services/notifications/intent/compose"
	"github.com/effectively-once/payments-cashback/services/notifications/migrations"
	"github.com/effectively-once/payments-cashback/services/notifications/sender"
	"github.com/effectively-once/payments-cashback/services/notifications/sms"
)

// ConsumerName scopes this service's inbox keys.
const ConsumerName = "notifications"

// Config is the service's environment.
type Config struct {
	service.Process `envPrefix:""` // DB_MAX_CONNS, SHUTDOWN_TIMEOUT, HTTP_*_TIMEOUT, PPROF_ADDR, LOG_LEVEL

	DatabaseURL string `env:"NOTIFICATIONS_DATABASE_URL,required,notEmpty"`
	Port        string `env:"PORT" envDefault:"8083"`
	// ListenAddr is the host to bind ("" = 127.0.0.1; 0.0.0.0 in a container).
	ListenAddr string `env:"LISTEN_ADDR"`
	// Access: NOTIFICATIONS_API_KEYS ("name[/read]:key,..."; an entry
	// without roles may read; required), NOTIFICATIONS_RATE_LIMIT,
	// NOTIFICATIONS_RATE_LIMIT_PER_ADDRESS, NOTIFICATIONS_RATE_WINDOW.
	Access       service.AccessEnv `envPrefix:"NOTIFICATIONS_"`
	RewardsQueue string            `env:"REWARDS_QUEUE" envDefault:"rewards-events"`
	// CONSUMER_CONCURRENCY, CONSUMER_BATCH_SIZE, QUEUE_WAIT, SUBSCRIBER_*:
	// each receive of up to CONSUMER_BATCH_SIZE messages is stored in the
	// inbox by one INSERT (idempotent.Inbox.ReceiveBatch); with 1, one
	// INSERT per message.
	sqstransport.ConsumerEnv `envPrefix:""`
	// DedupeRetention is the inbox's dedupe window (>= SQS's 14 days + 1).
	DedupeRetention time.Duration `env:"DEDUPE_RETENTION" envDefault:"360h"`

	SMSProviderURL string `env:"SMS_PROVIDER_URL" envDefault:"http://127.0.0.1:8090"`
	// SMSProviderAPIKey is this service's credential at the provider, a
	// key with the role send in the dev provider's SMS_PROVIDER_API_KEYS
	// (required unless Provider is set).
	SMSProviderAPIKey  string        `env:"SMS_PROVIDER_API_KEY" secret:"true"`
	SMSProviderTimeout time.Duration `env:"SMS_PROVIDER_TIMEOUT" envDefault:"10s"`
	// SMSProviderLookup false hides the provider's lookup capability: unknown
	// outcomes are then resolved by the SENDING_POLICY_* of their kind.
	SMSProviderLookup bool `env:"SMS_PROVIDER_LOOKUP" envDefault:"true"`

	// SendingLease: a row SENDING longer than this is reconciled.
	SendingLease    time.Duration `env:"SENDING_LEASE" envDefault:"60s"`
	SendMaxAttempts int           `env:"SEND_MAX_ATTEMPTS" envDefault:"8"`
	SendRetryBase   time.Duration `env:"SEND_RETRY_BASE" envDefault:"1s"`
	SendRetryMax    time.Duration `env:"SEND_RETRY_MAX" envDefault:"5m"`
	SendConcurrency int           `env:"SEND_CONCURRENCY" envDefault:"16"`
	// What to do with a message whose send outcome is unknown when the
	// provider cannot be asked (see package sender): resend | skip.
	PolicyCashback         string `env:"SENDING_POLICY_CASHBACK" envDefault:"resend"`
	PolicyCashbackReversed string `env:"SENDING_POLICY_CASHBACK_REVERSED" envDefault:"resend"`

	// ProcessorWorkers and ProcessorBatchSize tune the inbox processor
	// that turns stored events into PENDING rows (idempotent.ProcessorConfig
	// Workers and BatchSize; a Processor field set by a test wins). Its
	// handler is one INSERT, so a large batch costs its batch-mates little
	// latency and saves a claim and a commit per batch; two workers let one
	// claim while the other commits. [2, 50]
	ProcessorWorkers   int `env:"PROCESSOR_WORKERS" envDefault:"2"`
	ProcessorBatchSize int `env:"PROCESSOR_BATCH_SIZE" envDefault:"50"`

	// Tuning for tests; zero values take the library defaults.
	Subscriber sqstransport.SubscriberConfig `env:"-"`
	Processor  idempotent.ProcessorConfig    `env:"-"`
	SenderPoll time.Duration                 `env:"-"`
	Provider   sms.Provider                  `env:"-"` // nil: the HTTP client of SMS_PROVIDER_URL
}

// Policies turns the SENDING_POLICY_* settings into the sender's map.
func (c Config) Policies() (map[string]sender.Policy, error) {
	out := map[string]sender.Policy{}
	for kind, v := range map[string]string{
		compose.KindCashback:         c.PolicyCashback,
		compose.KindCashbackReversed: c.PolicyCashbackReversed,
	} {
		p, err := sender.ParsePolicy(v)
		if err != nil {
			return nil, fmt.Errorf("SENDING_POLICY for %s: %w", kind, err)
		}
		out[kind] = p
	}
	return out, nil
}

// Complete checks the settings as loaded from the environment
// (service.Completer), every error at once, each naming its variable,
// before the service connects to anything. notifications takes no
// arguments.
func (c *Config) Complete(args []string) error {
	var l service.Limits
	if len(args) > 0 {
		l.Add(fmt.Errorf("usage: notifications (no arguments; the environment configures it), got %q", args))
	}
	_, _, err := c.parse()
	l.Add(err)
	l.Positive("SMS_PROVIDER_TIMEOUT", c.SMSProviderTimeout)
	l.Positive("SENDING_LEASE", c.SendingLease)
	if c.SMSProviderTimeout > 0 && c.SendingLease < 2*c.SMSProviderTimeout {
		l.Add(fmt.Errorf("SENDING_LEASE (%v) must be at least twice SMS_PROVIDER_TIMEOUT (%v): a send still waiting for the provider must not be reconciled as stuck",
			c.SendingLease, c.SMSProviderTimeout))
	}
	l.AtLeast("SEND_MAX_ATTEMPTS", c.SendMaxAttempts, 1)
	l.Positive("SEND_RETRY_BASE", c.SendRetryBase)
	l.Positive("SEND_RETRY_MAX", c.SendRetryMax)
	l.NotAbove("SEND_RETRY_BASE", c.SendRetryBase, "SEND_RETRY_MAX", c.SendRetryMax)
	l.AtLeast("SEND_CONCURRENCY", c.SendConcurrency, 1)
	l.AtLeast("PROCESSOR_WORKERS", c.ProcessorWorkers, 1)
	l.AtLeast("PROCESSOR_BATCH_SIZE", c.ProcessorBatchSize, 1)
	l.Add(c.ConsumerEnv.Validate())
	return l.Err()
}

// parse checks what New needs of c (tests also build it in code), every
// error at once.
func (c Config) parse() (service.Front, map[string]sender.Policy, error) {
	var l service.Limits
	front, err := service.ParseFront(c.ListenAddr, c.Port, c.Access, "NOTIFICATIONS_", api.Needs, service.RoleRead)
	l.Add(err)
	policies, err := c.Policies()
	l.Add(err)
	if c.Provider == nil {
		l.HTTPURL("SMS_PROVIDER_URL", c.SMSProviderURL, "http://127.0.0.1:8090 (the dev provider)")
		if c.SMSProviderAPIKey == "" {
			l.Add(errors.New("SMS_PROVIDER_API_KEY is empty: the SMS provider's /v1/messages needs this service's key, one with the role send " +
				"(for the dev provider, an entry of its SMS_PROVIDER_API_KEYS, e.g. notifications/send:$(openssl rand -hex 24))"))
		}
	}
	if err := idempotent.ValidateRetention(c.DedupeRetention, idempotent.DefaultQueueRetention); err != nil {
		l.Add(fmt.Errorf("DEDUPE_RETENTION: %w", err))
	}
	return front, policies, l.Err()
}

// App is the wired service.
type App struct {
	Sender *sender.Sender
	Inbox  *idempotent.Inbox
	Router http.Handler

	subscriber *sqstransport.Subscriber
	processor  *idempotent.Processor
	procPool   *pgxpool.Pool // the processor's own connections; nil: a test's
	maintainer *idempotent.Maintainer
	addr       string
	http       service.HTTPTimeouts
	log        *slog.Logger
	queue      string // REWARDS_QUEUE: the subscriber's task is named for it
}

// Migrate applies the schema: the inbox (pkg/idempotent) and notifications.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := idempotent.Migrate(ctx, pool); err != nil {
		return err
	}
	return migrate.Up(ctx, pool, migrations.FS, migrations.VersionTable)
}

// New migrates the database and wires everything; nothing runs until the
// tasks do.
func New(ctx context.Context, cfg Config, pool *pgxpool.Pool, client *sqs.Client, metrics http.Handler, log *slog.Logger) (_ *App, err error) {
	front, policies, err := cfg.parse()
	if err != nil {
		return nil, err
	}
	provider := cfg.Provider
	if provider == nil {
		provider = sms.NewHTTPProvider(cfg.SMSProviderURL, cfg.SMSProviderAPIKey, cfg.SMSProviderTimeout)
	}
	if err := Migrate(ctx, pool); err != nil {
		return nil, err
	}
	// A provider that can be pinged gets an outage gate: while it is down,
	// messages wait for it instead of spending their attempts.
	var gate *outage.Gate
	if p, ok := provider.(sms.Pinger); ok {
		if gate, err = outage.NewGate(outage.GateConfig{Name: "sms provider", Probe: p.Ping, Logger: log}); err != nil {
			return nil, err
		}
	}
	if !cfg.SMSProviderLookup {
		provider = sms.WithoutLookup(provider)
	}
	var committed worker.Signal // the processor's commits wake the sender
	snd, err := sender.New(pool, provider, sender.Config{
		Wake: &committed, Concurrency: cfg.SendConcurrency, PollInterval: cfg.SenderPoll, SendTimeout: cfg.SMSProviderTimeout,
		Lease: cfg.SendingLease, MaxAttempts: cfg.SendMaxAttempts, RetryBase: cfg.SendRetryBase, RetryMax: cfg.SendRetryMax,
		Policies: policies, Gate: gate, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	log.Info("sender configured", "provider_lookup", snd.CanLookup(), "outage_gate", gate != nil, "policies", policies, "lease", cfg.SendingLease)

	// Deletes DONE inbox rows once they fall out of the dedupe window.
	maint, err := idempotent.NewMaintainer(pool, idempotent.MaintainerConfig{Retention: cfg.DedupeRetention, Logger: log})
	if err != nil {
		return nil, err
	}
	inbox, err := idempotent.NewInbox(pool, ConsumerName, idempotent.InboxConfig{Retention: cfg.DedupeRetention, Logger: log})
	if err != nil {
		maint.Close()
		return nil, err
	}
	defer func() {
		if err != nil {
			maint.Close()
			_ = inbox.Close()
		}
	}()
	pc := cfg.Processor
	if pc.Workers == 0 {
		pc.Workers = cfg.ProcessorWorkers
	}
	if pc.BatchSize == 0 {
		pc.BatchSize = cfg.ProcessorBatchSize
	}
	pc.Logger = log
	// A batch that applied rows may have recorded SMS intents to send.
	pc.AfterCommit = func([]uuid.UUID) { committed.Notify() }
	var procPool *pgxpool.Pool
	if pc.Pool == nil {
		// The processor's workers each hold a connection for a whole batch;
		// on the service's pool (a handful of connections) they would take
		// the ones the receiver's stores and the sender's claims and marks
		// need. Its own pool, on the same database: a connection per worker
		// and one for the claim.
		pcfg := pool.Config().Copy()
		pcfg.MaxConns, pcfg.MinConns = int32(max(pc.Workers, 1)+1), 0
		if procPool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
			return nil, fmt.Errorf("inbox processor pool: %w", err)
		}
		pc.Pool = procPool
		defer func() {
			if err != nil {
				procPool.Close()
			}
		}()
	}
	proc, err := inbox.NewProcessor(intent.Handler(log), pc)
	if err != nil {
		return nil, err
	}

	sc := cfg.Subscriber
	if sc.Gate == nil {
		if sc.Gate, err = service.DatabaseGate(pool, log); err != nil {
			return nil, err
		}
	}
	sub, err := cfg.Subscribe(ctx, client, cfg.RewardsQueue, sc, log, batchReceiver(inbox), receiver(inbox))
	if err != nil {
		return nil, err
	}

	r := service.NewRouter(log, metrics, map[string]service.Check{"database": pool.Ping, "consumer": sc.Gate.Check,
		"sqs " + cfg.RewardsQueue: sqstransport.QueueCheck(client, cfg.RewardsQueue)})
	if err := api.Routes(r, pool, log, front.Access); err != nil {
		return nil, err
	}
	return &App{Sender: snd, Inbox: inbox, Router: r, subscriber: sub, processor: proc, procPool: procPool, maintainer: maint,
		addr: front.Addr, http: cfg.HTTP(), log: log, queue: cfg.RewardsQueue}, nil
}

// receiver stores each delivery in the inbox and acks it at once. Events
// this service cannot turn into a notification (unknown type, unusable
// payload) are refused before they are stored, so the subscriber parks
// them in the DLQ instead of leaving a FAILED row that blocks its key.
func receiver(inbox *idempotent.Inbox) sqstransport.Handler {
	store := inboxsqs.Handler(inbox, idempotent.ByAggregate)
	return func(ctx context.Context, d sqstransport.Delivery) error {
		if _, err := compose.Build(d.Envelope); err != nil {
			return err // permanent
		}
		return store(ctx, d)
	}
}

// batchReceiver is receiver for a whole receive: the events this service
// can notify about are stored with one INSERT; the others are refused
// (parked), each on its own.
func batchReceiver(inbox *idempotent.Inbox) sqstransport.BatchHandler {
	store := inboxsqs.BatchHandler(inbox, idempotent.ByAggregate)
	return func(ctx context.Context, ds []sqstransport.Delivery) []error {
		errs := make([]error, len(ds))
		ok := make([]sqstransport.Delivery, 0, len(ds))
		var at []int
		for i, d := range ds {
			if _, err := compose.Build(d.Envelope); err != nil {
				errs[i] = err // permanent
				continue
			}
			ok = append(ok, d)
			at = append(at, i)
		}
		if len(ok) > 0 {
			for k, err := range store(ctx, ok) {
				errs[at[k]] = err
			}
		}
		return errs
	}
}

// Tasks are the service's long-running parts, for service.Run.
func (a *App) Tasks() []service.Task {
	return append([]service.Task{service.HTTPTask(a.addr, a.Router, a.log, a.http)}, a.Workers()...)
}

// Workers are Tasks without the HTTP server (tests serve Router themselves).
func (a *App) Workers() []service.Task {
	return []service.Task{
		{Name: "subscriber " + a.queue + " (inbox receiver)", Run: a.subscriber.Run},
		{Name: "inbox processor", Run: a.processor.Run},
		{Name: "sms sender", Run: a.Sender.Run},
		{Name: "inbox retention maintenance", Run: a.maintainer.Run},
	}
}

// Close releases the maintainer's connection, the processor's pool and the
// inbox's gauges (call after the tasks end).
func (a *App) Close() {
	a.maintainer.Close()
	if a.procPool != nil {
		a.procPool.Close()
	}
	_ = a.Inbox.Close()
}
