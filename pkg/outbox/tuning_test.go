package outbox

import (
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
)

// The tuning a service loads fills only the fields code left zero.
func TestRelayEnvFillsOnlyWhatCodeLeftZero(t *testing.T) {
	t.Parallel()
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
