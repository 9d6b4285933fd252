package sqstransport_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"

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
		{sqstransport.SubscriberEnv{WaitTime: time.Second, Visibility: 5 * time.Second, RetryBase: time.Second, RetryMax: 4 * time.Second}, ""},
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
		{sqstransport.SubscriberEnv{RetryBase: 500 * time.Millisecond}, "SUBSCRIBER_RETRY_BASE=500ms: want whole seconds"},
		{sqstransport.SubscriberEnv{RetryMax: 1500 * time.Millisecond}, "SUBSCRIBER_RETRY_MAX=1.5s: want whole seconds"},
		{sqstransport.SubscriberEnv{RetryMax: 13 * time.Hour}, "SUBSCRIBER_RETRY_MAX=13h0m0s: want 1s..12h0m0s"},
		{sqstransport.SubscriberEnv{RetryBase: 5 * time.Second, RetryMax: 2 * time.Second}, "SUBSCRIBER_RETRY_BASE (5s) is above SUBSCRIBER_RETRY_MAX (2s)"},
	} {
		testenv.WantError(t, fmt.Sprintf("%+v", c.env), c.env.Validate("SUBSCRIBER_"), c.want)
	}
}

// The consumer settings every consuming service shares: their defaults are
// valid, and each bad one is named, all at once.
func TestConsumerEnvValidate(t *testing.T) {
	defaults, err := env.ParseAsWithOptions[sqstransport.ConsumerEnv](env.Options{Environment: map[string]string{}})
	if err != nil {
		t.Fatal(err)
	}
	if defaults.Concurrency != 8 || defaults.BatchSize != 10 || defaults.QueueWait != 2*time.Minute {
		t.Errorf("defaults %+v, want concurrency 8, batch 10, queue wait 2m", defaults)
	}
	bad := defaults
	bad.Concurrency, bad.BatchSize, bad.QueueWait, bad.SubscriberEnv.MaxMessages = 0, 11, 0, 12
	for _, c := range []struct {
		env  sqstransport.ConsumerEnv
		want []string // none = valid
	}{
		{defaults, nil},
		{sqstransport.ConsumerEnv{Concurrency: 1, BatchSize: 1, QueueWait: time.Second}, nil},
		{bad, []string{"CONSUMER_CONCURRENCY=0: want at least 1", "CONSUMER_BATCH_SIZE=11: want 1..10", "QUEUE_WAIT=0s",
			"SUBSCRIBER_MAX_MESSAGES=12"}},
	} {
		testenv.WantError(t, fmt.Sprintf("%+v", c.env), c.env.Validate(), c.want...)
	}
}

// Subscribe hands whole receives of up to BatchSize messages to the batch
// handler, and with BatchSize 1 each message to the other handler alone,
// CONSUMER_CONCURRENCY receives at a time.
func TestConsumerEnvSubscribeRoutesByBatchSize(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	for _, batchSize := range []int{1, 3} {
		q, _ := testenv.Queue(t, c, 5, 30*time.Second)
		for i := range 7 {
			send(t, c, q, newEvent(t, i))
		}
		var mu sync.Mutex
		var batches []int
		ones, got := 0, map[string]bool{}
		batch := func(_ context.Context, ds []sqstransport.Delivery) []error {
			mu.Lock()
			defer mu.Unlock()
			batches = append(batches, len(ds))
			for _, d := range ds {
				got[d.Envelope.EventID.String()] = true
			}
			return make([]error, len(ds))
		}
		one := func(_ context.Context, d sqstransport.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			ones++
			got[d.Envelope.EventID.String()] = true
			return nil
		}
		ce := sqstransport.ConsumerEnv{Concurrency: 2, BatchSize: batchSize, QueueWait: 5 * time.Second}
		sub, err := ce.Subscribe(context.Background(), c, q[strings.LastIndex(q, "/")+1:],
			sqstransport.SubscriberConfig{WaitTime: time.Second}, slog.New(slog.DiscardHandler), batch, one)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- sub.Run(ctx) }()
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			n := len(got)
			mu.Unlock()
			if v, inflight := depth(t, c, q); n == 7 && v == 0 && inflight == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("batch size %d: Run: %v", batchSize, err)
		}
		mu.Lock()
		if len(got) != 7 {
			t.Errorf("batch size %d: %d of 7 messages handled", batchSize, len(got))
		}
		if v, inflight := depth(t, c, q); v+inflight != 0 {
			t.Errorf("batch size %d: %d visible, %d in flight left on the queue, want all deleted", batchSize, v, inflight)
		}
		switch batchSize {
		case 1:
			if len(batches) != 0 || ones != 7 {
				t.Errorf("batch size 1: %d batch calls, %d single calls; want 0 and 7", len(batches), ones)
			}
		default:
			if ones != 0 || len(batches) == 0 {
				t.Errorf("batch size %d: %d single calls, %d batch calls; want only batches", batchSize, ones, len(batches))
			}
			for _, n := range batches {
				if n > batchSize {
					t.Errorf("batch size %d: a receive of %d (%v)", batchSize, n, batches)
				}
			}
		}
		mu.Unlock()
	}
}
