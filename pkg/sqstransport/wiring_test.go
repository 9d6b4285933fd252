package sqstransport

import (
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
)

// The tuning a service loads fills only the fields code left zero.
func TestSubscriberEnvFillsOnlyWhatCodeLeftZero(t *testing.T) {
	var cfg struct {
		Subscriber SubscriberEnv `envPrefix:"SUBSCRIBER_"`
	}
	err := env.ParseWithOptions(&cfg, env.Options{Environment: map[string]string{
		"SUBSCRIBER_VISIBILITY": "2s", "SUBSCRIBER_MAX_EXTENSION": "1s", "SUBSCRIBER_RETRY_BASE": "3s"}})
	if err != nil {
		t.Fatal(err)
	}
	sc := SubscriberConfig{RetryBase: 5 * time.Second} // set in code: kept
	cfg.Subscriber.Apply(&sc)
	if sc.Visibility != 2*time.Second || sc.MaxExtension != time.Second || sc.RetryBase != 5*time.Second || sc.RetryMax != 0 || sc.WaitTime != 0 {
		t.Errorf("subscriber config %+v", sc)
	}
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: map[string]string{"SUBSCRIBER_VISIBILITY": "soon"}}); err == nil {
		t.Error("SUBSCRIBER_VISIBILITY=soon accepted")
	}
}
