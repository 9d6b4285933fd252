package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/effectively-once/payments-cashback/internal/faults"
	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// A relay whose SQS is unreachable backs off instead of flooding it: with
// a backlog of 100 batches it makes a handful of SendMessageBatch attempts
// while the queue is away, not one per batch, and once the queue is back
// every row is published.
func TestARelayWhoseQueueIsUnreachableBacksOffAndCatchesUpAfter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	fx := faults.New()
	t.Cleanup(fx.Close)
	host, err := faults.HostPort(aws.ToString(c.Options().BaseEndpoint))
	if err != nil {
		t.Fatal(err)
	}
	px, err := fx.Proxy("sqs", host)
	if err != nil {
		t.Fatal(err)
	}
	opts := c.Options()
	opts.BaseEndpoint, opts.RetryMaxAttempts = aws.String("http://"+px.Addr()), 1
	pub := &countingPublisher{next: sqstransport.NewPublisher(sqs.New(opts), q, 4)}

	const rows = 1000
	evs := make([]events.Envelope, rows)
	for i := range evs {
		evs[i] = newEvent(t, i)
	}
	addCommitted(t, ctx, pool, evs...)
	px.Cut()
	runRelay(t, newRelay(t, pool, pub, outbox.RelayConfig{BatchSize: 10, Workers: 2, PollInterval: 50 * time.Millisecond, RetryMax: 2 * time.Second}))
	time.Sleep(2 * time.Second)
	pub.mu.Lock()
	attempts := pub.calls
	pub.mu.Unlock()
	t.Logf("%d publish attempts in 2 s with the queue unreachable and %d batches waiting", attempts, rows/10)
	if attempts == 0 || attempts > 20 {
		t.Fatalf("%d publish attempts in 2 s of outage; want a few (backoff), not one per batch", attempts)
	}
	if err := px.Restore(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "every row published", func() bool {
		return count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL`) == rows
	})
	out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &q,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages}})
	if err != nil {
		t.Fatal(err)
	}
	if got := out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)]; got != "1000" {
		t.Fatalf("queue holds %s messages, want 1000", got)
	}
}
