package sqstransport_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/sqscount"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// inFlight is the Publisher's default number of SendMessageBatch calls in
// flight, which the relay uses; the bare benchmark uses the same.
const inFlight = 4

// relayMessages builds n messages shaped like the relay's: the envelope as
// body and the event_id, event_type and traceparent attributes.
func relayMessages(b testing.TB, n int) []outbox.Message {
	b.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		e := newEvent(b, i)
		body, err := e.Marshal()
		if err != nil {
			b.Fatal(err)
		}
		msgs[i] = outbox.Message{EventID: e.EventID, Body: body, Attributes: map[string]string{
			"event_id": e.EventID.String(), "event_type": "PaymentSucceeded",
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	}
	return msgs
}

func entries(msgs []outbox.Message) []types.SendMessageBatchRequestEntry {
	out := make([]types.SendMessageBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		attrs := map[string]types.MessageAttributeValue{}
		for k, v := range m.Attributes {
			attrs[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
		}
		out[i] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(m.Body)), MessageAttributes: attrs}
	}
	return out
}

// sendAll puts msgs on q with SendMessageBatch, 10 per call, inFlight calls
// at once.
func sendAll(b testing.TB, c *sqs.Client, q string, msgs []outbox.Message) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range inFlight {
		wg.Go(func() {
			for {
				i := int(next.Add(10)) - 10
				if i >= len(msgs) {
					return
				}
				out, err := c.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{
					QueueUrl: aws.String(q), Entries: entries(msgs[i:min(i+10, len(msgs))])})
				if err != nil || len(out.Failed) > 0 {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d SendMessageBatch calls failed", n)
	}
}

// BenchmarkBareSendMessageBatch is the ceiling for the relay: SDK
// SendMessageBatch calls of 10 relay-shaped messages, 4 in flight, nothing
// else. One op = one message.
func BenchmarkBareSendMessageBatch(b *testing.B) {
	c := testenv.SQS(b)
	q, _ := testenv.Queue(b, c, 5, 30*time.Second)
	msgs := relayMessages(b, b.N)
	b.ResetTimer()
	start := time.Now()
	sendAll(b, c, q, msgs)
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}

// BenchmarkPublisher is Publisher.PublishBatch with relay-sized batches of
// 100 (split into 10 SendMessageBatch calls, 4 in flight), one batch at a
// time as one relay worker sends them. One op = one message.
func BenchmarkPublisher(b *testing.B) {
	c := testenv.SQS(b)
	q, _ := testenv.Queue(b, c, 5, 30*time.Second)
	pub := sqstransport.NewPublisher(c, q, inFlight)
	msgs := relayMessages(b, b.N)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < len(msgs); i += 100 {
		failed, err := pub.PublishBatch(context.Background(), msgs[i:min(i+100, len(msgs))])
		if err != nil || len(failed) > 0 {
			b.Fatalf("PublishBatch: %v, %d failed", err, len(failed))
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}

// eagerClient returns a copy of c with the library's eager-body transport
// (see NewClient), for clients built from raw options in benchmarks.
func eagerClient(c *sqs.Client) *sqs.Client {
	return sqs.New(c.Options(), func(o *sqs.Options) { o.HTTPClient = sqstransport.NewHTTPClient() })
}

// BenchmarkSubscriber measures receive+handle+delete throughput of a
// Subscriber with a no-op handler over a pre-filled queue, against bare
// ReceiveMessage (10) + DeleteMessageBatch loops: one loop (the
// Subscriber's receive concurrency: one receive in flight) and four. One op
// = one message, received and deleted.
//
// Both use eagerClient (see there): with the SDK's default transport, a
// ReceiveMessage response is now and then lost after status 200 and its
// messages stay invisible for the visibility timeout, which turns a 1 s
// run into a 30 s one.
func BenchmarkSubscriber(b *testing.B) {
	c := eagerClient(testenv.SQS(b))
	quiet := slog.New(slog.DiscardHandler)

	b.Run("subscriber", func(b *testing.B) {
		q, _ := testenv.Queue(b, c, 5, 30*time.Second)
		sendAll(b, c, q, relayMessages(b, b.N))
		var handled atomic.Int64
		cc, calls := sqscount.Client(c)
		s, err := sqstransport.NewSubscriber(cc, sqstransport.SubscriberConfig{QueueURL: q, Concurrency: 10, WaitTime: time.Second, Logger: quiet},
			func(context.Context, sqstransport.Delivery) error { handled.Add(1); return nil })
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		b.ResetTimer()
		start := time.Now()
		go func() { done <- s.Run(ctx) }()
		for handled.Load() < int64(b.N) {
			time.Sleep(2 * time.Millisecond)
		}
		for {
			v, i := depth(b, c, q)
			if v+i == 0 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		b.ReportMetric(float64(b.N)/float64(calls("ReceiveMessage")), "msgs/receive")
		b.ReportMetric(float64(b.N)/float64(calls("DeleteMessageBatch")), "msgs/delete")
	})

	for _, loops := range []int{1, 4} {
		b.Run(fmt.Sprintf("bare-receive-delete/loops=%d", loops), func(b *testing.B) {
			q, _ := testenv.Queue(b, c, 5, 30*time.Second)
			sendAll(b, c, q, relayMessages(b, b.N))
			var got atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for range loops {
				wg.Go(func() {
					for got.Load() < int64(b.N) {
						out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(q),
							MaxNumberOfMessages: 10, WaitTimeSeconds: 0, MessageAttributeNames: []string{"All"},
							MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount}})
						if err != nil {
							b.Error(err)
							return
						}
						if len(out.Messages) == 0 {
							continue
						}
						del := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
						for i, m := range out.Messages {
							del[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
						}
						if _, err := c.DeleteMessageBatch(context.Background(), &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(q), Entries: del}); err != nil {
							b.Error(err)
							return
						}
						got.Add(int64(len(out.Messages)))
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}
