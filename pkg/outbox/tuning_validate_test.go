package outbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
)

// Validate names, with the service's prefix, each setting Apply would drop
// or the relay cannot use, and accepts what the e2e suite sets.
func TestRelayEnvValidateRefusesWhatApplyWouldDrop(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  outbox.RelayEnv
		want string // "" = valid
	}{
		{outbox.RelayEnv{}, ""},
		{outbox.RelayEnv{Lease: 2 * time.Second, PollInterval: 100 * time.Millisecond, DeleteOnPublish: true}, ""},
		{outbox.RelayEnv{BatchSize: 500, Workers: 4, RetryBase: time.Second, RetryMax: time.Second}, ""},
		{outbox.RelayEnv{BatchSize: -1}, "RELAY_BATCH_SIZE=-1: want 1..10000, or unset for the default"},
		{outbox.RelayEnv{Workers: -2}, "RELAY_WORKERS=-2"},
		{outbox.RelayEnv{Lease: 500 * time.Millisecond}, "RELAY_LEASE=500ms: want 1s..24h0m0s"},
		{outbox.RelayEnv{PollInterval: -time.Second}, "RELAY_POLL_INTERVAL=-1s"},
		{outbox.RelayEnv{RetryBase: 10 * time.Minute}, "RELAY_RETRY_BASE (10m0s) is above RELAY_RETRY_MAX (5m0s)"},
		{outbox.RelayEnv{RetryMax: -time.Second}, "RELAY_RETRY_MAX=-1s"},
	} {
		testenv.WantError(t, fmt.Sprintf("%+v", c.env), c.env.Validate("RELAY_"), c.want)
	}
}
