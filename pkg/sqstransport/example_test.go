package sqstransport_test

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// A consumer: the subscriber long-polls the queue, the idempotent consumer
// commits the effect with its dedupe key, and the message is deleted only
// after that commit. The same event sent twice is applied once.
func ExampleSubscriber_Run() {
	tb, done := testenv.Scratch()
	defer done()
	ctx, pool, client := context.Background(), testenv.DB(tb), testenv.SQS(tb)
	queueURL, _ := testenv.Queue(tb, client, 5, 30*time.Second)
	if err := idempotent.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	consumer, _ := idempotent.NewConsumer(pool, "rewards")

	e, _ := events.New("PaymentSucceeded", "pay_42", 1, map[string]any{"amount_paise": 120000})
	body, _ := e.Marshal()
	pub := sqstransport.NewPublisher(client, queueURL, 1)
	for range 2 { // a relay that resent after a crash
		// A message SQS refused is in failed; err is for a call that
		// could not be made at all. Either way, not sent.
		failed, err := pub.PublishBatch(ctx, []outbox.Message{{EventID: e.EventID, Body: body,
			Attributes: map[string]string{"event_id": e.EventID.String(), "event_type": e.EventType}}})
		if err != nil || len(failed) > 0 {
			panic(fmt.Sprint("not sent: ", err, failed))
		}
	}

	outcomes := make(chan idempotent.Outcome, 2)
	sub, err := sqstransport.NewSubscriber(client, sqstransport.SubscriberConfig{QueueURL: queueURL, WaitTime: time.Second},
		func(ctx context.Context, d sqstransport.Delivery) error {
			out, err := consumer.Handle(ctx, idempotent.MessageOf(d.Envelope), func(ctx context.Context, tx pgx.Tx) error {
				return nil // the effect: writes through tx only
			})
			outcomes <- out
			return err // nil: committed now or before, so the message is deleted
		})
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- sub.Run(ctx) }()
	a, b := <-outcomes, <-outcomes
	fmt.Println("one applied, one duplicate:", a != b && (a == idempotent.Applied || b == idempotent.Applied))
	stop()
	fmt.Println("subscriber stopped:", <-stopped)
	// Output:
	// one applied, one duplicate: true
	// subscriber stopped: <nil>
}

// Redrive moves parked messages back to their queue. Each copy gets a new
// SQS MessageId and keeps its body, so its event_id, the dedupe key, is the
// same as before.
func ExampleRedrive() {
	tb, done := testenv.Scratch()
	defer done()
	ctx, client := context.Background(), testenv.SQS(tb)
	queueURL, dlqURL := testenv.Queue(tb, client, 5, 30*time.Second)
	e, _ := events.New("PaymentSucceeded", "pay_42", 1, map[string]any{})
	body, _ := e.Marshal()
	sent, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(dlqURL), MessageBody: aws.String(string(body))})
	if err != nil {
		panic(err)
	}

	moved, err := sqstransport.Redrive(ctx, client, dlqURL, queueURL, 0)
	fmt.Println("moved:", moved, err)
	out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(queueURL), WaitTimeSeconds: 5})
	if err != nil || len(out.Messages) != 1 {
		panic(fmt.Sprint("receive: ", err))
	}
	back, _ := events.Decode([]byte(*out.Messages[0].Body))
	fmt.Println("same event id:", back.EventID == e.EventID, "new SQS MessageId:", *out.Messages[0].MessageId != *sent.MessageId)
	// Output:
	// moved: 1 <nil>
	// same event id: true new SQS MessageId: true
}
