package sqstransport_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// A subscriber without its client or its handler is refused when it is
// built: before, a nil handler panicked on every message, each panic a
// redelivery, until the queue dead-lettered them all.
func TestNewSubscriberNeedsAClientAndAHandler(t *testing.T) {
	client := sqs.New(sqs.Options{Region: "us-east-1"})
	cfg := sqstransport.SubscriberConfig{QueueURL: "http://127.0.0.1:1/000000000000/q"}
	handle := func(context.Context, sqstransport.Delivery) error { return nil }
	batch := func(context.Context, []sqstransport.Delivery) []error { return nil }
	for name, c := range map[string]struct {
		build func() (*sqstransport.Subscriber, error)
		want  string
	}{
		"no handler":       {func() (*sqstransport.Subscriber, error) { return sqstransport.NewSubscriber(client, cfg, nil) }, "needs a handler"},
		"no batch handler": {func() (*sqstransport.Subscriber, error) { return sqstransport.NewBatchSubscriber(client, cfg, nil) }, "needs a handler"},
		"no client":        {func() (*sqstransport.Subscriber, error) { return sqstransport.NewSubscriber(nil, cfg, handle) }, "needs an SQS client"},
		"no batch client":  {func() (*sqstransport.Subscriber, error) { return sqstransport.NewBatchSubscriber(nil, cfg, batch) }, "needs an SQS client"},
	} {
		if s, err := c.build(); s != nil || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, %v; want no subscriber and an error containing %q", name, s, err, c.want)
		}
	}
	if s, err := sqstransport.NewBatchSubscriber(client, cfg, batch); s == nil || err != nil {
		t.Fatalf("with both: %v, %v; want a subscriber", s, err)
	}
}
