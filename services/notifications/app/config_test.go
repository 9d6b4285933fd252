package app_test

import (
	"testing"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/notifications/app"
)

// A setting outside its range stops the service at start, before it
// connects to anything, with every bad variable named at once: none is
// clamped or replaced by its default in silence. The values the e2e suite
// and the docs use are accepted.
func TestOutOfRangeSettingsAreRefusedByNameAtStart(t *testing.T) {
	base := map[string]string{"NOTIFICATIONS_DATABASE_URL": "postgres://postgres@127.0.0.1:5432/notifications",
		"NOTIFICATIONS_API_KEYS": testAccess.APIKeys, "SMS_PROVIDER_API_KEY": "0123456789abcdef0123456789abcdef"}
	load := func(args []string) error { _, err := service.Load[app.Config](args); return err }
	testenv.ConfigErrors(t, base, load, []testenv.ConfigCase{
		{Name: "defaults"},
		{Name: "the e2e suite's tuning", Env: map[string]string{"SUBSCRIBER_WAIT_TIME": "1s", "SUBSCRIBER_VISIBILITY": "5s",
			"SMS_PROVIDER_TIMEOUT": "1s", "SENDING_LEASE": "3s", "CONSUMER_BATCH_SIZE": "1"}},
		{Name: "batch above SQS's 10", Env: map[string]string{"CONSUMER_BATCH_SIZE": "11"}, Want: []string{"CONSUMER_BATCH_SIZE=11: want 1..10"}},
		{Name: "every bad one at once", Env: map[string]string{"SEND_CONCURRENCY": "0", "SEND_MAX_ATTEMPTS": "0",
			"SEND_RETRY_BASE": "10m", "PROCESSOR_WORKERS": "-1", "PROCESSOR_BATCH_SIZE": "0", "SUBSCRIBER_MAX_MESSAGES": "-2",
			"SHUTDOWN_TIMEOUT": "-1s", "SMS_PROVIDER_URL": "127.0.0.1:8090", "SENDING_POLICY_CASHBACK": "bogus"},
			Want: []string{"SEND_CONCURRENCY=0", "SEND_MAX_ATTEMPTS=0", "SEND_RETRY_BASE (10m0s) is above SEND_RETRY_MAX (5m0s)",
				"PROCESSOR_WORKERS=-1", "PROCESSOR_BATCH_SIZE=0", "SUBSCRIBER_MAX_MESSAGES=-2", "SHUTDOWN_TIMEOUT=-1s",
				`SMS_PROVIDER_URL="127.0.0.1:8090": want an http(s) URL`, "bogus"}},
		{Name: "a lease shorter than two provider calls", Env: map[string]string{"SMS_PROVIDER_TIMEOUT": "10s", "SENDING_LEASE": "15s"},
			Want: []string{"SENDING_LEASE (15s) must be at least twice SMS_PROVIDER_TIMEOUT (10s)"}},
		{Name: "a window SQS outlasts", Env: map[string]string{"DEDUPE_RETENTION": "72h"}, Want: []string{"DEDUPE_RETENTION"}},
		{Name: "no provider key", Env: map[string]string{"SMS_PROVIDER_API_KEY": ""}, Want: []string{"SMS_PROVIDER_API_KEY is empty"}},
		{Name: "an argument", Args: []string{"serve"}, Want: []string{`usage: notifications`}},
	})
}
