package outbox

import (
	"cmp"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/internal/settings"
	"github.com/effectively-once/payments-cashback/pkg/retry"
)

// RelayEnv is the environment tuning of a Relay, read by the service's
// configuration loader (this package reads no environment) and embedded
// with `envPrefix:"RELAY_"`: RELAY_LEASE, RELAY_POLL_INTERVAL,
// RELAY_BATCH_SIZE, RELAY_WORKERS, RELAY_RETRY_BASE, RELAY_RETRY_MAX,
// RELAY_DELETE_ON_PUBLISH. Unset means the library default. (The e2e suite shortens the lease so a relay
// killed between publish and mark is replaced in seconds.)
type RelayEnv struct {
	Lease        time.Duration `env:"LEASE"`
	PollInterval time.Duration `env:"POLL_INTERVAL"`
	BatchSize    int           `env:"BATCH_SIZE"`
	Workers      int           `env:"WORKERS"`
	RetryBase    time.Duration `env:"RETRY_BASE"`
	RetryMax     time.Duration `env:"RETRY_MAX"`
	// DeleteOnPublish: true sets RelayConfig.DeleteOnPublish.
	DeleteOnPublish bool `env:"DELETE_ON_PUBLISH"`
}

// Apply copies the values that are set into the zero fields of c.
func (e RelayEnv) Apply(c *RelayConfig) {
	fill(&c.Lease, e.Lease)
	fill(&c.PollInterval, e.PollInterval)
	fill(&c.BatchSize, e.BatchSize)
	fill(&c.Workers, e.Workers)
	fill(&c.RetryBase, e.RetryBase)
	fill(&c.RetryMax, e.RetryMax)
	c.DeleteOnPublish = c.DeleteOnPublish || e.DeleteOnPublish
}

func fill[T time.Duration | int](dst *T, v T) {
	if *dst == 0 && v > 0 {
		*dst = v
	}
}

// Validate refuses what Apply would silently drop or the relay cannot run
// with: a negative setting (Apply would keep the default instead), a lease
// above MaxLease (NewRelay would clamp it) or under 1s, a batch size above
// MaxBatchSize (NewRelay would refuse it), and a retry base above the
// retry maximum. prefix is the variables' prefix as
// the service embeds RelayEnv ("RELAY_"), for the errors to name them.
func (e RelayEnv) Validate(prefix string) error {
	c := settings.Errors{Prefix: prefix}
	c.Tuning("LEASE", e.Lease, time.Second, MaxLease)
	c.Tuning("POLL_INTERVAL", e.PollInterval, time.Millisecond, 0)
	c.TuningInt("BATCH_SIZE", e.BatchSize, 1, MaxBatchSize)
	c.TuningInt("WORKERS", e.Workers, 1, 0)
	c.Tuning("RETRY_BASE", e.RetryBase, time.Millisecond, 0)
	c.Tuning("RETRY_MAX", e.RetryMax, time.Millisecond, 0)
	c.NotAbove("RETRY_BASE", cmp.Or(e.RetryBase, retry.BaseDefault), "RETRY_MAX", cmp.Or(e.RetryMax, retry.MaxDefault))
	return c.Err()
}
