package sqstransport_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

func strAttr(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

// drain receives everything from url (deleting it) until a receive comes
// back empty.
func drain(t *testing.T, c *sqs.Client, url string) []types.Message {
	t.Helper()
	var all []types.Message
	for {
		out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(url),
			MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) == 0 {
			return all
		}
		for _, m := range out.Messages {
			if _, err := c.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
		all = append(all, out.Messages...)
	}
}

// Redrive moves every message of the DLQ back to its source queue: same
// body, same event_id attribute, a new MessageId, the park_* attributes
// gone, the DLQ empty. (fauxqs has no StartMessageMoveTask, so this is the
// receive → send → delete path.)
func TestRedriveMovesEveryMessageBackWithANewMessageID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)

	const n = 23                   // three batches of 10, the last one short
	sentIDs := map[string]string{} // body → MessageId in the DLQ
	for i := range n {
		body := fmt.Sprintf(`{"n":%d}`, i)
		out, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(dlq), MessageBody: aws.String(body),
			MessageAttributes: map[string]types.MessageAttributeValue{
				"event_id":    strAttr(fmt.Sprintf("e-%d", i)),
				"park_reason": strAttr("refused: test"),
			}})
		if err != nil {
			t.Fatal(err)
		}
		sentIDs[body] = aws.ToString(out.MessageId)
	}

	moved, err := sqstransport.Redrive(ctx, c, dlq, q, 0)
	if err != nil {
		t.Fatal(err)
	}
	if moved != n {
		t.Errorf("moved %d, want %d", moved, n)
	}
	got := drain(t, c, q)
	if len(got) != n {
		t.Fatalf("source queue holds %d messages after the redrive, want %d", len(got), n)
	}
	for _, m := range got {
		body := aws.ToString(m.Body)
		old, ok := sentIDs[body]
		if !ok {
			t.Errorf("unexpected body %q", body)
			continue
		}
		delete(sentIDs, body)
		if aws.ToString(m.MessageId) == old {
			t.Errorf("body %s kept its MessageId %s; a redriven copy is a new message", body, old)
		}
		var i int
		fmt.Sscanf(body, `{"n":%d}`, &i)
		if v := m.MessageAttributes["event_id"]; aws.ToString(v.StringValue) != fmt.Sprintf("e-%d", i) {
			t.Errorf("body %s: event_id attribute %q, want e-%d", body, aws.ToString(v.StringValue), i)
		}
		if _, ok := m.MessageAttributes["park_reason"]; ok {
			t.Errorf("body %s: park_reason survived the redrive", body)
		}
	}
	if left := drain(t, c, dlq); len(left) != 0 {
		t.Errorf("DLQ still holds %d messages", len(left))
	}

	// Nothing left: nothing moved, no error.
	if moved, err := sqstransport.Redrive(ctx, c, dlq, q, 0); err != nil || moved != 0 {
		t.Errorf("redrive of an empty DLQ: moved %d, err %v; want 0, nil", moved, err)
	}
}

// max bounds how many messages one redrive moves.
func TestRedriveMaxMovesAtMostMax(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
	for i := range 7 {
		if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(dlq), MessageBody: aws.String(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	moved, err := sqstransport.Redrive(ctx, c, dlq, q, 3)
	if err != nil || moved != 3 {
		t.Fatalf("Redrive(max 3) = %d, %v; want 3, nil", moved, err)
	}
	if got := len(drain(t, c, q)); got != 3 {
		t.Errorf("source holds %d, want 3", got)
	}
	if got := len(drain(t, c, dlq)); got != 4 {
		t.Errorf("DLQ holds %d, want 4", got)
	}
	if _, err := sqstransport.Redrive(ctx, c, dlq, dlq, 0); err == nil {
		t.Error("redrive of a queue into itself accepted")
	}
}

// Large parked messages are sent back in batches that fit SQS's limit on
// a SendMessageBatch request, not one batch per receive: ten messages of
// 200 KB (2 MB in one receive) all reach the source queue, whole.
func TestRedriveMovesLargeMessagesInBatchesThatFit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
	const n, size = 10, 200_000
	for i := range n {
		body := fmt.Sprintf(`{"n":%d,"pad":"%s"}`, i, strings.Repeat("x", size))
		if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(dlq), MessageBody: aws.String(body)}); err != nil {
			t.Fatal(err)
		}
	}
	moved, err := sqstransport.Redrive(ctx, c, dlq, q, 0)
	if err != nil || moved != n {
		t.Fatalf("Redrive = %d, %v; want %d, nil", moved, err, n)
	}
	got := drain(t, c, q)
	if len(got) != n {
		t.Fatalf("source queue holds %d messages, want %d", len(got), n)
	}
	for _, m := range got {
		if len(aws.ToString(m.Body)) < size {
			t.Errorf("a redriven body of %d bytes, want the whole message", len(aws.ToString(m.Body)))
		}
	}
	if left := drain(t, c, dlq); len(left) != 0 {
		t.Errorf("DLQ still holds %d messages", len(left))
	}
}
