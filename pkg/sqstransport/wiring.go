package sqstransport

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/cenkalti/backoff/v5"

	"github.com/effectively-once/payments-cashback/pkg/internal/settings"
	"github.com/effectively-once/payments-cashback/pkg/retry"
)

// QueueURL resolves a queue name, retrying for up to wait while the SQS
// server is starting or its queues are still being created.
func QueueURL(ctx context.Context, c *sqs.Client, name string, wait time.Duration, log *slog.Logger) (string, error) {
	url, err := backoff.Retry(ctx, func() (string, error) {
		out, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
		if err != nil {
			log.Info("waiting for queue", "queue", name, "error", err)
			return "", err
		}
		return *out.QueueUrl, nil
	}, backoff.WithMaxElapsedTime(wait))
	if err != nil {
		return "", fmt.Errorf("queue %s not found after %v (create it with `go run ./cmd/queues`): %w", name, wait, err)
	}
	return url, nil
}

// NewQueueSubscriber resolves queue (waiting up to wait, as QueueURL does)
// and builds a Subscriber on it from cfg, whose zero tuning fields are
// filled from tuning (a value set in code wins) and whose Logger is log.
func NewQueueSubscriber(ctx context.Context, c *sqs.Client, queue string, wait time.Duration,
	cfg SubscriberConfig, tuning SubscriberEnv, log *slog.Logger, h Handler) (*Subscriber, error) {
	url, err := QueueURL(ctx, c, queue, wait, log)
	if err != nil {
		return nil, err
	}
	tuning.Apply(&cfg)
	cfg.QueueURL, cfg.Logger = url, log
	return NewSubscriber(c, cfg, h)
}

// NewQueueBatchSubscriber is NewQueueSubscriber for a handler of whole
// receives (NewBatchSubscriber).
func NewQueueBatchSubscriber(ctx context.Context, c *sqs.Client, queue string, wait time.Duration,
	cfg SubscriberConfig, tuning SubscriberEnv, log *slog.Logger, h BatchHandler) (*Subscriber, error) {
	url, err := QueueURL(ctx, c, queue, wait, log)
	if err != nil {
		return nil, err
	}
	tuning.Apply(&cfg)
	cfg.QueueURL, cfg.Logger = url, log
	return NewBatchSubscriber(c, cfg, h)
}

// ConsumerEnv is the environment of a service that consumes one queue,
// read alike by every such service. Embed it with no prefix,
//
//	sqstransport.ConsumerEnv `envPrefix:""`
//
// to get CONSUMER_CONCURRENCY, CONSUMER_BATCH_SIZE, QUEUE_WAIT and the
// SUBSCRIBER_* of SubscriberEnv.
type ConsumerEnv struct {
	// Concurrency is how many receives (of up to BatchSize messages) are
	// handled at once; with BatchSize 1, how many messages.
	Concurrency int `env:"CONSUMER_CONCURRENCY" envDefault:"8"`
	// BatchSize is how many messages one receive asks for and one call of
	// the batch handler gets, 1..10 (10 is SQS's limit) [10; 0 in code
	// means 10]. 1: the handler of one message, one call per message.
	// SUBSCRIBER_MAX_MESSAGES, when set, sizes the receive instead.
	BatchSize int `env:"CONSUMER_BATCH_SIZE" envDefault:"10"`
	// QueueWait is how long the start waits for the service's queues to
	// exist (QueueURL).
	QueueWait time.Duration `env:"QUEUE_WAIT" envDefault:"2m"`
	// SubscriberEnv (SUBSCRIBER_*) fills what the SubscriberConfig passed
	// to Subscribe leaves zero.
	SubscriberEnv SubscriberEnv `envPrefix:"SUBSCRIBER_"`
}

// Validate refuses, every error at once and each naming its variable, a
// concurrency below 1, a batch size outside 1..10, a QUEUE_WAIT that is
// not positive and what SubscriberEnv.Validate refuses.
func (e ConsumerEnv) Validate() error {
	c := settings.Errors{}
	c.AtLeast("CONSUMER_CONCURRENCY", e.Concurrency, 1)
	c.Int("CONSUMER_BATCH_SIZE", e.BatchSize, 1, maxMessages)
	c.Positive("QUEUE_WAIT", e.QueueWait)
	c.Add(e.SubscriberEnv.Validate("SUBSCRIBER_"))
	return c.Err()
}

// Subscribe resolves queue (waiting up to QueueWait) and builds its
// Subscriber from cfg, with e's Concurrency, a receive of BatchSize
// messages unless cfg or SUBSCRIBER_MAX_MESSAGES sets one, and
// SubscriberEnv filling cfg's zero tuning. Each receive goes to batch
// unless BatchSize is 1 (one out of range counts as 10, the subscriber's
// clamp of MaxMessages), then each message to one.
func (e ConsumerEnv) Subscribe(ctx context.Context, c *sqs.Client, queue string, cfg SubscriberConfig,
	log *slog.Logger, batch BatchHandler, one Handler) (*Subscriber, error) {
	cfg.Concurrency = e.Concurrency
	if cfg.MaxMessages == 0 && e.SubscriberEnv.MaxMessages == 0 {
		cfg.MaxMessages = e.BatchSize
	}
	if e.BatchSize != 1 {
		return NewQueueBatchSubscriber(ctx, c, queue, e.QueueWait, cfg, e.SubscriberEnv, log, batch)
	}
	return NewQueueSubscriber(ctx, c, queue, e.QueueWait, cfg, e.SubscriberEnv, log, one)
}

// QueueCheck is a readiness check (a service.Check) that the SQS server
// answers and knows the queue named name: a consumer or relay that cannot
// reach its queue is not ready, even if its database is.
func QueueCheck(c *sqs.Client, name string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
		if err != nil {
			return fmt.Errorf("queue %s: %w", name, err)
		}
		return nil
	}
}

// SubscriberEnv is the environment tuning of a Subscriber, read by the
// service's configuration loader (this package reads no environment).
// Embed it in a service's config with a prefix,
//
//	Subscriber sqstransport.SubscriberEnv `envPrefix:"SUBSCRIBER_"`
//
// to get SUBSCRIBER_WAIT_TIME, SUBSCRIBER_MAX_MESSAGES,
// SUBSCRIBER_VISIBILITY, SUBSCRIBER_MAX_EXTENSION, SUBSCRIBER_RETRY_BASE,
// SUBSCRIBER_RETRY_MAX, SUBSCRIBER_SHUTDOWN_GRACE and
// SUBSCRIBER_HANDLER_TIMEOUT (each handler's deadline, below the visibility
// timeout). Unset (zero) means the library default; the e2e suite shortens them to make redeliveries,
// visibility expiry and dead-lettering happen in seconds.
type SubscriberEnv struct {
	WaitTime      time.Duration `env:"WAIT_TIME"`
	MaxMessages   int           `env:"MAX_MESSAGES"`
	Visibility    time.Duration `env:"VISIBILITY"`
	MaxExtension  time.Duration `env:"MAX_EXTENSION"`
	RetryBase     time.Duration `env:"RETRY_BASE"`
	RetryMax      time.Duration `env:"RETRY_MAX"`
	ShutdownGrace time.Duration `env:"SHUTDOWN_GRACE"`
	// HandlerTimeout: SUBSCRIBER_HANDLER_TIMEOUT, below SUBSCRIBER_VISIBILITY.
	HandlerTimeout time.Duration `env:"HANDLER_TIMEOUT"`
}

// Apply copies the values that are set into the fields of c that are still
// zero (a value set in code wins).
func (e SubscriberEnv) Apply(c *SubscriberConfig) {
	fill(&c.WaitTime, e.WaitTime)
	fill(&c.MaxMessages, e.MaxMessages)
	fill(&c.Visibility, e.Visibility)
	fill(&c.MaxExtension, e.MaxExtension)
	fill(&c.RetryBase, e.RetryBase)
	fill(&c.RetryMax, e.RetryMax)
	fill(&c.ShutdownGrace, e.ShutdownGrace)
	fill(&c.HandlerTimeout, e.HandlerTimeout)
}

func fill[T time.Duration | int](dst *T, v T) {
	if *dst == 0 && v > 0 {
		*dst = v
	}
}

// Validate refuses what Apply would silently drop or the subscriber would
// clamp: a negative setting, a long-poll wait, visibility or retry delay
// outside SQS's range or not in whole seconds (SQS counts them in
// seconds), more than 10
// messages a receive, a handler deadline not below the visibility timeout,
// a retry base above the retry maximum. prefix is the variables' prefix as
// the service embeds SubscriberEnv ("SUBSCRIBER_"), for the errors to name
// them. Unset (zero) settings are the library's defaults and valid.
func (e SubscriberEnv) Validate(prefix string) error {
	c := settings.Errors{Prefix: prefix}
	c.Tuning("WAIT_TIME", e.WaitTime, time.Second, maxWaitTime)
	c.TuningInt("MAX_MESSAGES", e.MaxMessages, 1, maxMessages)
	c.Tuning("VISIBILITY", e.Visibility, time.Second, maxVisibility)
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"WAIT_TIME", e.WaitTime}, {"VISIBILITY", e.Visibility}, {"RETRY_BASE", e.RetryBase}, {"RETRY_MAX", e.RetryMax}} {
		if d.v > 0 && d.v%time.Second != 0 {
			c.Add(fmt.Errorf("%s%s=%v: want whole seconds (SQS counts it in seconds)", prefix, d.name, d.v))
		}
	}
	c.Tuning("MAX_EXTENSION", e.MaxExtension, time.Second, maxVisibility)
	// The retry delays are visibility timeouts too.
	c.Tuning("RETRY_BASE", e.RetryBase, time.Second, maxVisibility)
	c.Tuning("RETRY_MAX", e.RetryMax, time.Second, maxVisibility)
	c.Tuning("SHUTDOWN_GRACE", e.ShutdownGrace, time.Millisecond, 0)
	c.Tuning("HANDLER_TIMEOUT", e.HandlerTimeout, time.Millisecond, 0)
	if vis := cmp.Or(e.Visibility, visibilityDefault); e.HandlerTimeout >= vis {
		c.Add(fmt.Errorf("%sHANDLER_TIMEOUT (%v) must be below %sVISIBILITY (%v): the message must not be redelivered while its handler still runs",
			prefix, e.HandlerTimeout, prefix, vis))
	}
	c.NotAbove("RETRY_BASE", cmp.Or(e.RetryBase, retry.BaseDefault), "RETRY_MAX", cmp.Or(e.RetryMax, retryMaxDefault))
	return c.Err()
}
