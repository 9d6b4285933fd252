package service

import (
	"time"

	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// SubscriberEnv is the environment tuning of a sqstransport.Subscriber.
// Embed it in a service's config with a prefix,
//
//	Subscriber service.SubscriberEnv `envPrefix:"SUBSCRIBER_"`
//
// to get SUBSCRIBER_WAIT_TIME, SUBSCRIBER_MAX_MESSAGES,
// SUBSCRIBER_VISIBILITY, SUBSCRIBER_MAX_EXTENSION, SUBSCRIBER_RETRY_BASE,
// SUBSCRIBER_RETRY_MAX, SUBSCRIBER_SHUTDOWN_GRACE and SUBSCRIBER_HANDLER_TIMEOUT
// (each handler's deadline, below the visibility timeout). Unset (zero) means the
// library default; the e2e suite shortens them to make redeliveries,
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

// Apply copies the variables that are set into the fields of c that are
// still zero (a value set in code wins).
func (e SubscriberEnv) Apply(c *sqstransport.SubscriberConfig) {
	fill(&c.WaitTime, e.WaitTime)
	fill(&c.MaxMessages, e.MaxMessages)
	fill(&c.Visibility, e.Visibility)
	fill(&c.MaxExtension, e.MaxExtension)
	fill(&c.RetryBase, e.RetryBase)
	fill(&c.RetryMax, e.RetryMax)
	fill(&c.ShutdownGrace, e.ShutdownGrace)
	fill(&c.HandlerTimeout, e.HandlerTimeout)
}

// RelayEnv is the environment tuning of an outbox.Relay, embedded with
// `envPrefix:"RELAY_"`: RELAY_LEASE, RELAY_POLL_INTERVAL, RELAY_BATCH_SIZE,
// RELAY_WORKERS, RELAY_RETRY_BASE, RELAY_RETRY_MAX. Unset means the library
// default. (The e2e suite shortens the lease so a relay killed between
// publish and mark is replaced in seconds.)
type RelayEnv struct {
	Lease        time.Duration `env:"LEASE"`
	PollInterval time.Duration `env:"POLL_INTERVAL"`
	BatchSize    int           `env:"BATCH_SIZE"`
	Workers      int           `env:"WORKERS"`
	RetryBase    time.Duration `env:"RETRY_BASE"`
	RetryMax     time.Duration `env:"RETRY_MAX"`
}

// Apply copies the variables that are set into the zero fields of c.
func (e RelayEnv) Apply(c *outbox.RelayConfig) {
	fill(&c.Lease, e.Lease)
	fill(&c.PollInterval, e.PollInterval)
	fill(&c.BatchSize, e.BatchSize)
	fill(&c.Workers, e.Workers)
	fill(&c.RetryBase, e.RetryBase)
	fill(&c.RetryMax, e.RetryMax)
}

func fill[T time.Duration | int](dst *T, v T) {
	if *dst == 0 && v > 0 {
		*dst = v
	}
}
