package outbox

import (
	"strings"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
)

// The tuning a service loads fills only the fields code left zero.
func TestRelayEnvFillsOnlyWhatCodeLeftZero(t *testing.T) {
	var cfg struct {
		Relay RelayEnv `envPrefix:"RELAY_"`
	}
	err := env.ParseWithOptions(&cfg, env.Options{Environment: map[string]string{"RELAY_LEASE": "2s", "RELAY_BATCH_SIZE": "7"}})
	if err != nil {
		t.Fatal(err)
	}
	rc := RelayConfig{Workers: 3} // set in code: kept
	cfg.Relay.Apply(&rc)
	if rc.Lease != 2*time.Second || rc.BatchSize != 7 || rc.PollInterval != 0 || rc.Workers != 3 || rc.DeleteOnPublish {
		t.Errorf("relay config %+v", rc)
	}
	err = env.ParseWithOptions(&cfg, env.Options{Environment: map[string]string{"RELAY_DELETE_ON_PUBLISH": "true"}})
	if err != nil {
		t.Fatal(err)
	}
	rc = RelayConfig{}
	if cfg.Relay.Apply(&rc); !rc.DeleteOnPublish {
		t.Errorf("RELAY_DELETE_ON_PUBLISH=true: relay config %+v", rc)
	}
	err = env.ParseWithOptions(&cfg, env.Options{Environment: map[string]string{"RELAY_DELETE_ON_PUBLISH": "maybe"}})
	if err == nil {
		t.Errorf("RELAY_DELETE_ON_PUBLISH=maybe: no error")
	}
}

// Validate names, with the service's prefix, each setting Apply would drop
// or the relay cannot use, and accepts what the e2e suite sets.
func TestRelayEnvValidateRefusesWhatApplyWouldDrop(t *testing.T) {
	for _, c := range []struct {
		env  RelayEnv
		want string // "" = valid
	}{
		{RelayEnv{}, ""},
		{RelayEnv{Lease: 2 * time.Second, PollInterval: 100 * time.Millisecond, DeleteOnPublish: true}, ""},
		{RelayEnv{BatchSize: 500, Workers: 4, RetryBase: time.Second, RetryMax: time.Second}, ""},
		{RelayEnv{BatchSize: -1}, "RELAY_BATCH_SIZE=-1: want at least 1, or unset for the default"},
		{RelayEnv{Workers: -2}, "RELAY_WORKERS=-2"},
		{RelayEnv{Lease: 500 * time.Millisecond}, "RELAY_LEASE=500ms: want at least 1s"},
		{RelayEnv{PollInterval: -time.Second}, "RELAY_POLL_INTERVAL=-1s"},
		{RelayEnv{RetryBase: 10 * time.Minute}, "RELAY_RETRY_BASE (10m0s) is above RELAY_RETRY_MAX (5m0s)"},
		{RelayEnv{RetryMax: -time.Second}, "RELAY_RETRY_MAX=-1s"},
	} {
		err := c.env.Validate("RELAY_")
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v refused: %v", c.env, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: %v, want an error holding %q", c.env, err, c.want)
		}
	}
}
