package app_test

import (
	"testing"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/rewards/app"
)

// A setting outside its range stops the service at start, before it
// connects to anything, with every bad variable named at once: none is
// clamped or replaced by its default in silence. The values the e2e suite
// and the docs use are accepted.
func TestOutOfRangeSettingsAreRefusedByNameAtStart(t *testing.T) {
	base := map[string]string{"REWARDS_DATABASE_URL": "postgres://postgres@127.0.0.1:5432/rewards", "REWARDS_API_KEYS": testAccess.APIKeys}
	load := func(args []string) error { _, err := service.Load[app.Config](args); return err }
	testenv.ConfigErrors(t, base, load, []testenv.ConfigCase{
		{Name: "defaults"},
		{Name: "the e2e suite's tuning", Env: map[string]string{"SUBSCRIBER_WAIT_TIME": "1s", "SUBSCRIBER_VISIBILITY": "5s",
			"SUBSCRIBER_RETRY_BASE": "1s", "SUBSCRIBER_RETRY_MAX": "4s", "CONSUMER_CONCURRENCY": "1", "CONSUMER_BATCH_SIZE": "1",
			"RELAY_LEASE": "2s", "RELAY_POLL_INTERVAL": "100ms", "RELAY_DELETE_ON_PUBLISH": "true"}},
		{Name: "batch above SQS's 10", Env: map[string]string{"CONSUMER_BATCH_SIZE": "50"}, Want: []string{"CONSUMER_BATCH_SIZE=50: want 1..10"}},
		{Name: "batch of none", Env: map[string]string{"CONSUMER_BATCH_SIZE": "0"}, Want: []string{"CONSUMER_BATCH_SIZE=0"}},
		{Name: "no concurrency", Env: map[string]string{"CONSUMER_CONCURRENCY": "0"}, Want: []string{"CONSUMER_CONCURRENCY=0: want at least 1"}},
		{Name: "every bad one at once", Env: map[string]string{"CONSUMER_CONCURRENCY": "-1", "SUBSCRIBER_MAX_MESSAGES": "20",
			"SUBSCRIBER_WAIT_TIME": "30s", "SUBSCRIBER_VISIBILITY": "1500ms", "RELAY_BATCH_SIZE": "-5", "RELAY_RETRY_BASE": "10m",
			"DB_MAX_CONNS": "0", "HTTP_READ_TIMEOUT": "0s", "REWARDS_MAX_RATE_BP": "20000", "DEDUPE_RETENTION": "24h"},
			Want: []string{"CONSUMER_CONCURRENCY=-1", "SUBSCRIBER_MAX_MESSAGES=20: want 1..10", "SUBSCRIBER_WAIT_TIME=30s: want 1s..20s",
				"SUBSCRIBER_VISIBILITY=1.5s: want whole seconds", "RELAY_BATCH_SIZE=-5", "RELAY_RETRY_BASE (10m0s) is above RELAY_RETRY_MAX (5m0s)",
				"DB_MAX_CONNS=0", "HTTP_READ_TIMEOUT=0s", "REWARDS_MAX_RATE_BP=20000", "DEDUPE_RETENTION"}},
		{Name: "a redelivery delay SQS would truncate", Env: map[string]string{"SUBSCRIBER_RETRY_BASE": "500ms"},
			Want: []string{"SUBSCRIBER_RETRY_BASE=500ms: want whole seconds"}},
		{Name: "a handler deadline past the visibility", Env: map[string]string{"SUBSCRIBER_VISIBILITY": "10s", "SUBSCRIBER_HANDLER_TIMEOUT": "10s"},
			Want: []string{"SUBSCRIBER_HANDLER_TIMEOUT (10s) must be below SUBSCRIBER_VISIBILITY (10s)"}},
		{Name: "no API keys", Env: map[string]string{"REWARDS_API_KEYS": ""}, Want: []string{"REWARDS_API_KEYS"}},
		{Name: "an argument", Args: []string{"serve"}, Want: []string{`usage: rewards`, `"serve"`}},
	})
}
