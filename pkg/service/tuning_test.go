package service_test

import (
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

func TestSubscriberAndRelayEnvFillOnlyWhatCodeLeftZero(t *testing.T) {
	t.Setenv("SUBSCRIBER_VISIBILITY", "2s")
	t.Setenv("SUBSCRIBER_MAX_EXTENSION", "1s")
	t.Setenv("SUBSCRIBER_RETRY_BASE", "3s")
	t.Setenv("RELAY_LEASE", "2s")
	t.Setenv("RELAY_BATCH_SIZE", "7")
	type config struct {
		Subscriber service.SubscriberEnv `envPrefix:"SUBSCRIBER_"`
		Relay      service.RelayEnv      `envPrefix:"RELAY_"`
	}
	cfg, err := service.LoadConfig[config]()
	if err != nil {
		t.Fatal(err)
	}
	sc := sqstransport.SubscriberConfig{RetryBase: 5 * time.Second} // set in code: kept
	cfg.Subscriber.Apply(&sc)
	if sc.Visibility != 2*time.Second || sc.MaxExtension != time.Second || sc.RetryBase != 5*time.Second || sc.RetryMax != 0 || sc.WaitTime != 0 {
		t.Errorf("subscriber config %+v", sc)
	}
	var rc outbox.RelayConfig
	cfg.Relay.Apply(&rc)
	if rc.Lease != 2*time.Second || rc.BatchSize != 7 || rc.PollInterval != 0 {
		t.Errorf("relay config %+v", rc)
	}

	t.Setenv("SUBSCRIBER_VISIBILITY", "soon")
	if _, err := service.LoadConfig[config](); err == nil {
		t.Error("SUBSCRIBER_VISIBILITY=soon accepted")
	}
}
