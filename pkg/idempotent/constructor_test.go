package idempotent_test

import (
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

// Each constructor refuses a nil pool when it is called, instead of leaving
// a nil-pointer panic for the first message (or, for the Maintainer, at
// once, with no error).
func TestConstructorsRefuseANilPool(t *testing.T) {
	t.Parallel()
	for name, build := range map[string]func() (any, error){
		"NewConsumer":   func() (any, error) { return idempotent.NewConsumer(nil, "rewards") },
		"NewInbox":      func() (any, error) { return idempotent.NewInbox(nil, "notifications", idempotent.InboxConfig{}) },
		"NewMaintainer": func() (any, error) { return idempotent.NewMaintainer(nil, idempotent.MaintainerConfig{}) },
	} {
		if _, err := build(); err == nil || !strings.Contains(err.Error(), name+" needs a pool") {
			t.Errorf("%s(nil): %v; want an error saying it needs a pool", name, err)
		}
	}
}

// NewConsumer refuses a dedupe window that a queue can outlast, as NewInbox
// and NewMaintainer do: with WithRetention(time.Hour), a copy SQS hands
// back after two hours (a redrive from the DLQ, say) was refused as
// Expired and its effect never applied. WithQueueRetention names a queue
// that keeps messages for less than SQS's 14 days.
func TestNewConsumerRefusesAWindowTheQueueOutlasts(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	const day = 24 * time.Hour
	for _, tc := range []struct {
		name string
		opts []idempotent.Option
		ok   bool
	}{
		{"default", nil, true},
		{"an hour", []idempotent.Option{idempotent.WithRetention(time.Hour)}, false},
		{"the queue's 14 days", []idempotent.Option{idempotent.WithRetention(14 * day)}, false},
		{"zero", []idempotent.Option{idempotent.WithRetention(0)}, false},
		{"a day over a 4-day queue", []idempotent.Option{idempotent.WithRetention(5 * day), idempotent.WithQueueRetention(4 * day)}, true},
		{"a 4-day queue outlasting 4 days", []idempotent.Option{idempotent.WithRetention(4 * day), idempotent.WithQueueRetention(4 * day)}, false},
	} {
		_, err := idempotent.NewConsumer(pool, "rewards", tc.opts...)
		if tc.ok && err != nil {
			t.Errorf("%s: %v, want a consumer", tc.name, err)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), "must exceed the queue retention")) {
			t.Errorf("%s: %v, want the window refused against the queue retention", tc.name, err)
		}
	}
}
