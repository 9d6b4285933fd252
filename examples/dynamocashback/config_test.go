package main

import (
	"testing"

	"github.com/caarlos0/env/v11"

	"github.com/effectively-once/payments-cashback/internal/testenv"
)

// A concurrency the subscriber would replace by its default stops the
// example at start, named; the defaults are accepted.
func TestConfigRefusesAConcurrencyBelowOne(t *testing.T) {
	for _, c := range []struct {
		concurrency string
		want        []string // none = valid
	}{
		{"", nil},
		{"1", nil},
		{"0", []string{"SUBSCRIBER_CONCURRENCY=0: want at least 1"}},
		{"-3", []string{"SUBSCRIBER_CONCURRENCY=-3: want at least 1"}},
	} {
		environ := map[string]string{"QUEUE_URL": "http://127.0.0.1:1/queue/payments-events"}
		if c.concurrency != "" {
			environ["SUBSCRIBER_CONCURRENCY"] = c.concurrency
		}
		cfg, err := loadConfig(env.Options{Environment: environ})
		testenv.WantError(t, "SUBSCRIBER_CONCURRENCY="+c.concurrency, err, c.want...)
		if err == nil && c.concurrency == "" && cfg.Concurrency != 8 {
			t.Errorf("default concurrency %d, want 8", cfg.Concurrency)
		}
	}
}
