package sqstransport

import (
	"strings"
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

// Validate names, with the service's prefix, each setting Apply would drop
// or the subscriber would clamp, and accepts what the e2e suite sets.
func TestSubscriberEnvValidateRefusesWhatWouldBeClamped(t *testing.T) {
	for _, c := range []struct {
		env  SubscriberEnv
		want string // "" = valid
	}{
		{SubscriberEnv{}, ""},
		{SubscriberEnv{WaitTime: time.Second, Visibility: 5 * time.Second, RetryBase: 500 * time.Millisecond, RetryMax: 8 * time.Second}, ""},
		{SubscriberEnv{MaxMessages: 10, WaitTime: 20 * time.Second, Visibility: 12 * time.Hour, HandlerTimeout: time.Hour}, ""},
		{SubscriberEnv{MaxMessages: 11}, "SUBSCRIBER_MAX_MESSAGES=11: want 1..10, or unset for the default"},
		{SubscriberEnv{MaxMessages: -1}, "SUBSCRIBER_MAX_MESSAGES=-1"},
		{SubscriberEnv{WaitTime: 21 * time.Second}, "SUBSCRIBER_WAIT_TIME=21s: want 1s..20s"},
		{SubscriberEnv{WaitTime: 500 * time.Millisecond}, "SUBSCRIBER_WAIT_TIME=500ms"},
		{SubscriberEnv{Visibility: 13 * time.Hour}, "SUBSCRIBER_VISIBILITY=13h0m0s: want 1s..12h0m0s"},
		{SubscriberEnv{Visibility: 2500 * time.Millisecond}, "SUBSCRIBER_VISIBILITY=2.5s: want whole seconds"},
		{SubscriberEnv{MaxExtension: -time.Second}, "SUBSCRIBER_MAX_EXTENSION=-1s"},
		{SubscriberEnv{ShutdownGrace: -time.Second}, "SUBSCRIBER_SHUTDOWN_GRACE=-1s"},
		{SubscriberEnv{HandlerTimeout: 30 * time.Second}, "SUBSCRIBER_HANDLER_TIMEOUT (30s) must be below SUBSCRIBER_VISIBILITY (30s)"},
		{SubscriberEnv{RetryBase: 2 * time.Minute}, "SUBSCRIBER_RETRY_BASE (2m0s) is above SUBSCRIBER_RETRY_MAX (1m0s)"},
		{SubscriberEnv{RetryBase: 5 * time.Second, RetryMax: 2 * time.Second}, "SUBSCRIBER_RETRY_BASE (5s) is above SUBSCRIBER_RETRY_MAX (2s)"},
	} {
		err := c.env.Validate("SUBSCRIBER_")
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v refused: %v", c.env, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: %v, want an error holding %q", c.env, err, c.want)
		}
	}
}
