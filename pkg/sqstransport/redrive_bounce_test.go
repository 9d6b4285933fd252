package sqstransport_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// A message Redrive sent back and its consumer parked again at once (it is
// still poison) is not sent back a second time by the same Redrive: it
// stays in the DLQ, uncounted. The bound is what the DLQ held at the start
// (12, two of them in flight, read by an operator's peek), and the copies
// parked again used to fill it: two poison messages went round twice, and
// the count said 12.
func TestRedriveDoesNotSendBackACopyParkedAgainWhileItRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
	send := func(body string) {
		if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &dlq, MessageBody: aws.String(body)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		send(fmt.Sprintf("good-%d", i))
	}
	if peek, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &dlq, MaxNumberOfMessages: 2, VisibilityTimeout: 20}); err != nil || len(peek.Messages) != 2 {
		t.Fatalf("peek: %v, %d messages", err, len(peek.Messages))
	}
	for i := range 10 {
		send(fmt.Sprintf("poison-%d", i))
	}

	// The consumer of q parks poison again at once, as a Subscriber does.
	cctx, stop := context.WithCancel(ctx)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	wg.Go(func() {
		for cctx.Err() == nil {
			out, err := c.ReceiveMessage(cctx, &sqs.ReceiveMessageInput{QueueUrl: &q, MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
			if err != nil {
				continue
			}
			for _, m := range out.Messages {
				mu.Lock()
				seen[aws.ToString(m.Body)]++
				mu.Unlock()
				if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &dlq, MessageBody: m.Body,
					MessageAttributes: map[string]types.MessageAttributeValue{
						"park_reason": strAttr("refused: still poison"), "park_source_message_id": strAttr(aws.ToString(m.MessageId))}}); err != nil {
					t.Error(err)
				}
				if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: &q, ReceiptHandle: m.ReceiptHandle}); err != nil {
					t.Error(err)
				}
			}
		}
	})
	moved, err := sqstransport.Redrive(ctx, c, dlq, q, 0)
	time.Sleep(1500 * time.Millisecond) // the consumer takes what was sent last
	stop()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	for b, n := range seen {
		if n > 1 {
			t.Errorf("%s sent back %d times by one Redrive", b, n)
		}
	}
	if moved != 10 || len(seen) != 10 || seen["good-0"]+seen["good-1"] != 0 {
		t.Errorf("moved %d, consumer saw %v; want the 10 poison messages the DLQ held visible at the start, once each", moved, seen)
	}
}
