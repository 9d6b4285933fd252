package sqstransport_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func uniqueName(t *testing.T) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "t-ensure-" + hex.EncodeToString(b)
}

func deleteQueues(t *testing.T, c *sqs.Client, urls ...string) {
	t.Cleanup(func() {
		for _, u := range urls {
			_, _ = c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(u)})
		}
	})
}

func attrs(t *testing.T, c *sqs.Client, url string) map[string]string {
	t.Helper()
	out, err := c.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Attributes
}

func redrive(t *testing.T, a map[string]string) sqstransport.RedrivePolicy {
	t.Helper()
	var p sqstransport.RedrivePolicy
	if err := json.Unmarshal([]byte(a["RedrivePolicy"]), &p); err != nil {
		t.Fatalf("RedrivePolicy %q: %v", a["RedrivePolicy"], err)
	}
	return p
}

func TestEnsureQueue(t *testing.T) {
	ctx := context.Background()
	c := testenv.SQS(t)
	name := uniqueName(t)

	q, dlq, err := sqstransport.EnsureQueue(ctx, c, name, 5, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	deleteQueues(t, c, q, dlq)

	dlqARN := attrs(t, c, dlq)["QueueArn"]
	a := attrs(t, c, q)
	if got := redrive(t, a); got.DeadLetterTargetArn != dlqARN || got.MaxReceiveCount != "5" {
		t.Errorf("RedrivePolicy = %+v, want target %s and maxReceiveCount \"5\"", got, dlqARN)
	}
	if a["VisibilityTimeout"] != "30" {
		t.Errorf("VisibilityTimeout = %q, want 30", a["VisibilityTimeout"])
	}

	// Idempotent: the same call again finds the same queues.
	q2, dlq2, err := sqstransport.EnsureQueue(ctx, c, name, 5, 30*time.Second)
	if err != nil {
		t.Fatalf("second EnsureQueue: %v", err)
	}
	if q2 != q || dlq2 != dlq {
		t.Errorf("second call returned %s, %s; want %s, %s", q2, dlq2, q, dlq)
	}

	// Converges: other settings update the existing queue.
	if _, _, err := sqstransport.EnsureQueue(ctx, c, name, 3, 10*time.Second); err != nil {
		t.Fatalf("EnsureQueue with new settings: %v", err)
	}
	a = attrs(t, c, q)
	if got := redrive(t, a); got.MaxReceiveCount != "3" || a["VisibilityTimeout"] != "10" {
		t.Errorf("after update: RedrivePolicy %+v, VisibilityTimeout %q; want 3 and 10", got, a["VisibilityTimeout"])
	}
}

func TestEnsureQueueRejectsBadSettings(t *testing.T) {
	c := testenv.SQS(t)
	for _, tc := range []struct {
		maxReceive int
		vis        time.Duration
	}{{0, time.Second}, {1001, time.Second}, {5, -time.Second}, {5, 13 * time.Hour}, {5, 1500 * time.Millisecond}, {5, 500 * time.Millisecond}} {
		if _, _, err := sqstransport.EnsureQueue(context.Background(), c, uniqueName(t), tc.maxReceive, tc.vis); err == nil {
			t.Errorf("EnsureQueue(maxReceive %d, visibility %v) succeeded, want an error", tc.maxReceive, tc.vis)
		}
	}
}

// The SQS operations the transport relies on, as the Go SDK (JSON protocol)
// sends them, against the test server: batches, message attributes,
// visibility changes, and the redrive to the DLQ after maxReceiveCount.
func TestSQSOperations(t *testing.T) {
	ctx := context.Background()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 2, 30*time.Second)

	var entries []types.SendMessageBatchRequestEntry
	for i := range 3 {
		entries = append(entries, types.SendMessageBatchRequestEntry{
			Id:          aws.String(strconv.Itoa(i)),
			MessageBody: aws.String(fmt.Sprintf(`{"event_id":"e-%d"}`, i)),
			MessageAttributes: map[string]types.MessageAttributeValue{
				"event_id":    {DataType: aws.String("String"), StringValue: aws.String(fmt.Sprintf("e-%d", i))},
				"event_type":  {DataType: aws.String("String"), StringValue: aws.String("PaymentSucceeded")},
				"traceparent": {DataType: aws.String("String"), StringValue: aws.String("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
			},
		})
	}
	sent, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(q), Entries: entries})
	if err != nil {
		t.Fatalf("SendMessageBatch: %v", err)
	}
	if len(sent.Successful) != 3 || len(sent.Failed) != 0 {
		t.Fatalf("SendMessageBatch: %d ok, %d failed", len(sent.Successful), len(sent.Failed))
	}

	receive := func(max int32) []types.Message {
		t.Helper()
		var got []types.Message
		for deadline := time.Now().Add(5 * time.Second); len(got) < int(max) && time.Now().Before(deadline); {
			out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
				QueueUrl:                    aws.String(q),
				MaxNumberOfMessages:         max - int32(len(got)),
				WaitTimeSeconds:             1,
				MessageAttributeNames:       []string{"All"},
				MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount},
			})
			if err != nil {
				t.Fatalf("ReceiveMessage: %v", err)
			}
			got = append(got, out.Messages...)
		}
		return got
	}

	msgs := receive(3)
	if len(msgs) != 3 {
		t.Fatalf("received %d messages, want 3", len(msgs))
	}
	for _, m := range msgs {
		var body struct {
			EventID string `json:"event_id"`
		}
		if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &body); err != nil {
			t.Fatal(err)
		}
		if got := aws.ToString(m.MessageAttributes["event_id"].StringValue); got != body.EventID {
			t.Errorf("attribute event_id = %q, body says %q", got, body.EventID)
		}
		if got := aws.ToString(m.MessageAttributes["traceparent"].StringValue); got == "" {
			t.Error("attribute traceparent missing")
		}
		if got := m.Attributes["ApproximateReceiveCount"]; got != "1" {
			t.Errorf("ApproximateReceiveCount = %q, want 1", got)
		}
	}

	// Visibility 0 puts a message straight back: this is a redelivery.
	if _, err := c.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(q), ReceiptHandle: msgs[0].ReceiptHandle, VisibilityTimeout: 0,
	}); err != nil {
		t.Fatalf("ChangeMessageVisibility: %v", err)
	}
	again := receive(1)
	if len(again) != 1 || aws.ToString(again[0].Body) != aws.ToString(msgs[0].Body) {
		t.Fatalf("after ChangeMessageVisibility(0): received %d messages, want the same one again", len(again))
	}
	if got := again[0].Attributes["ApproximateReceiveCount"]; got != "2" {
		t.Errorf("redelivered ApproximateReceiveCount = %q, want 2", got)
	}

	// Delete the other two in one batch.
	del, err := c.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(q), Entries: []types.DeleteMessageBatchRequestEntry{
		{Id: aws.String("a"), ReceiptHandle: msgs[1].ReceiptHandle},
		{Id: aws.String("b"), ReceiptHandle: msgs[2].ReceiptHandle},
	}})
	if err != nil {
		t.Fatalf("DeleteMessageBatch: %v", err)
	}
	if len(del.Successful) != 2 || len(del.Failed) != 0 {
		t.Fatalf("DeleteMessageBatch: %d ok, %d failed", len(del.Successful), len(del.Failed))
	}

	// Received twice with maxReceiveCount 2: the next receive moves it to the DLQ.
	if _, err := c.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(q), ReceiptHandle: again[0].ReceiptHandle, VisibilityTimeout: 0,
	}); err != nil {
		t.Fatalf("ChangeMessageVisibility: %v", err)
	}
	extra, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q), WaitTimeSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(extra.Messages) != 0 {
		t.Fatalf("third receive got %d messages; want none, the message belongs in the DLQ", len(extra.Messages))
	}
	out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl: aws.String(dlq), WaitTimeSeconds: 2, MessageAttributeNames: []string{"All"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Messages) != 1 || aws.ToString(out.Messages[0].Body) != aws.ToString(msgs[0].Body) {
		t.Fatalf("DLQ holds %d messages, want the redriven one", len(out.Messages))
	}
	if got := aws.ToString(out.Messages[0].MessageAttributes["event_id"].StringValue); got == "" {
		t.Error("message attributes lost on the way to the DLQ")
	}

	a := attrs(t, c, q)
	if a["ApproximateNumberOfMessages"] != "0" || a["ApproximateNumberOfMessagesNotVisible"] != "0" {
		t.Errorf("source queue not empty: %v visible, %v in flight", a["ApproximateNumberOfMessages"], a["ApproximateNumberOfMessagesNotVisible"])
	}
}

// A RedrivePolicy reads maxReceiveCount in both forms servers hand back:
// the number AWS's documentation shows and moto returns, and the string
// SQS takes on the way in and fauxqs echoes; and it writes the string.
func TestRedrivePolicyReadsMaxReceiveCountAsNumberOrString(t *testing.T) {
	const arn = "arn:aws:sqs:us-east-1:000000000000:q-dlq"
	for _, raw := range []string{
		`{"deadLetterTargetArn":"` + arn + `","maxReceiveCount":5}`,
		`{"deadLetterTargetArn":"` + arn + `","maxReceiveCount":"5"}`,
		`{"maxReceiveCount": 5 , "deadLetterTargetArn":"` + arn + `"}`,
	} {
		var p sqstransport.RedrivePolicy
		if err := json.Unmarshal([]byte(raw), &p); err != nil {
			t.Errorf("%s: %v", raw, err)
			continue
		}
		if p.DeadLetterTargetArn != arn || p.MaxReceiveCount != "5" {
			t.Errorf("%s read as %+v, want target %s and maxReceiveCount \"5\"", raw, p, arn)
		}
	}
	for _, raw := range []string{
		`{"deadLetterTargetArn":"` + arn + `","maxReceiveCount":5.5}`,
		`{"deadLetterTargetArn":"` + arn + `","maxReceiveCount":true}`,
		`{"deadLetterTargetArn":"` + arn + `","maxReceiveCount":"five"}`,
	} {
		var p sqstransport.RedrivePolicy
		if err := json.Unmarshal([]byte(raw), &p); err == nil {
			t.Errorf("%s accepted as %+v, want an error", raw, p)
		}
	}
	b, err := json.Marshal(sqstransport.RedrivePolicy{DeadLetterTargetArn: arn, MaxReceiveCount: "5"})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"deadLetterTargetArn":"` + arn + `","maxReceiveCount":"5"}`; string(b) != want {
		t.Errorf("written as %s, want %s", b, want)
	}
}

// Two more things the transport relies on, probed on the test server: a
// long poll waits for a message that arrives while it waits (and an empty
// one waits its whole WaitTimeSeconds instead of returning at once), and
// ApproximateNumberOfMessages / ...NotVisible count a backlog and what is in
// flight, which Redrive and the operators' backlog checks read.
func TestLongPollWaitsForAMessageAndTheApproximateCountsSeeTheBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)

	t0 := time.Now()
	out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q), WaitTimeSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Messages) != 0 || time.Since(t0) < 900*time.Millisecond {
		t.Errorf("empty long poll of 1s: %d messages after %v; want none after about 1s", len(out.Messages), time.Since(t0))
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		_, _ = c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(q), MessageBody: aws.String("late")})
	}()
	t0 = time.Now()
	out, err = c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q), WaitTimeSeconds: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Messages) != 1 || aws.ToString(out.Messages[0].Body) != "late" || time.Since(t0) > 8*time.Second {
		t.Fatalf("long poll of 10s with a message sent after 0.3s: %d messages after %v; want it, well before 10s", len(out.Messages), time.Since(t0))
	}
	_, _ = c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(q), ReceiptHandle: out.Messages[0].ReceiptHandle})

	for i := range 3 {
		if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(q), MessageBody: aws.String(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	counts := func() (visible, inFlight string) {
		a := attrs(t, c, q)
		return a["ApproximateNumberOfMessages"], a["ApproximateNumberOfMessagesNotVisible"]
	}
	if v, f := counts(); v != "3" || f != "0" {
		t.Errorf("3 sent: ApproximateNumberOfMessages %s, ...NotVisible %s; want 3 and 0", v, f)
	}
	got, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q), MaxNumberOfMessages: 2, VisibilityTimeout: 30})
	if err != nil || len(got.Messages) != 2 {
		t.Fatalf("receive 2: %d messages, %v", len(got.Messages), err)
	}
	if v, f := counts(); v != "1" || f != "2" {
		t.Errorf("2 of 3 in flight: ApproximateNumberOfMessages %s, ...NotVisible %s; want 1 and 2", v, f)
	}
}
