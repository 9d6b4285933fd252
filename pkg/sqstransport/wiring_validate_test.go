package sqstransport_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// Validate names, with the service's prefix, each setting Apply would drop
// or the subscriber would clamp, and accepts what the e2e suite sets.
func TestSubscriberEnvValidateRefusesWhatWouldBeClamped(t *testing.T) {
	for _, c := range []struct {
		env  sqstransport.SubscriberEnv
		want string // "" = valid
	}{
		{sqstransport.SubscriberEnv{}, ""},
		{sqstransport.SubscriberEnv{WaitTime: time.Second, Visibility: 5 * time.Second, RetryBase: 500 * time.Millisecond, RetryMax: 8 * time.Second}, ""},
		{sqstransport.SubscriberEnv{MaxMessages: 10, WaitTime: 20 * time.Second, Visibility: 12 * time.Hour, HandlerTimeout: time.Hour}, ""},
		{sqstransport.SubscriberEnv{MaxMessages: 11}, "SUBSCRIBER_MAX_MESSAGES=11: want 1..10, or unset for the default"},
		{sqstransport.SubscriberEnv{MaxMessages: -1}, "SUBSCRIBER_MAX_MESSAGES=-1"},
		{sqstransport.SubscriberEnv{WaitTime: 21 * time.Second}, "SUBSCRIBER_WAIT_TIME=21s: want 1s..20s"},
		{sqstransport.SubscriberEnv{WaitTime: 500 * time.Millisecond}, "SUBSCRIBER_WAIT_TIME=500ms"},
		{sqstransport.SubscriberEnv{Visibility: 13 * time.Hour}, "SUBSCRIBER_VISIBILITY=13h0m0s: want 1s..12h0m0s"},
		{sqstransport.SubscriberEnv{Visibility: 2500 * time.Millisecond}, "SUBSCRIBER_VISIBILITY=2.5s: want whole seconds"},
		{sqstransport.SubscriberEnv{MaxExtension: -time.Second}, "SUBSCRIBER_MAX_EXTENSION=-1s"},
		{sqstransport.SubscriberEnv{ShutdownGrace: -time.Second}, "SUBSCRIBER_SHUTDOWN_GRACE=-1s"},
		{sqstransport.SubscriberEnv{HandlerTimeout: 30 * time.Second}, "SUBSCRIBER_HANDLER_TIMEOUT (30s) must be below SUBSCRIBER_VISIBILITY (30s)"},
		{sqstransport.SubscriberEnv{RetryBase: 2 * time.Minute}, "SUBSCRIBER_RETRY_BASE (2m0s) is above SUBSCRIBER_RETRY_MAX (1m0s)"},
		{sqstransport.SubscriberEnv{RetryBase: 5 * time.Second, RetryMax: 2 * time.Second}, "SUBSCRIBER_RETRY_BASE (5s) is above SUBSCRIBER_RETRY_MAX (2s)"},
	} {
		testenv.WantError(t, fmt.Sprintf("%+v", c.env), c.env.Validate("SUBSCRIBER_"), c.want)
	}
}
