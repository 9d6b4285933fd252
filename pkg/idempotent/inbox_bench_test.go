package idempotent_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/inboxsqs"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkInboxAckLatency: b.N messages through SQS into the inbox while
// the processor's handler sleeps 1 s per message. ack-p50/p99-ms is how long
// the subscriber's handler (the inbox INSERT) takes per message, after which
// the subscriber deletes the message (batched, within 5 ms); it does not
// grow with the handler's sleep. recv-msgs/s is the receive throughput.
func BenchmarkInboxAckLatency(b *testing.B) {
	ctx := context.Background()
	pool := inboxSetup(b)
	client := testenv.SQS(b)
	queue, dlq := testenv.Queue(b, client, 5, 30*time.Second)
	in := newInbox(b, pool, "bench", idempotent.InboxConfig{})

	slow, err := in.NewProcessor(func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		time.Sleep(time.Second)
		return record(ctx, tx, e)
	}, idempotent.ProcessorConfig{Workers: 4, BatchSize: 1, PollInterval: 10 * time.Millisecond, Pool: otherPool(b, pool, 5)})
	if err != nil {
		b.Fatal(err)
	}
	procCtx, stopProc := context.WithCancel(ctx)
	procDone := make(chan struct{})
	go func() { _ = slow.Run(procCtx); close(procDone) }()
	defer func() { stopProc(); <-procDone }()

	var mu sync.Mutex
	var lat []time.Duration
	h := inboxsqs.Handler(in, idempotent.ByAggregate)
	sub, err := sqstransport.NewSubscriber(client, sqstransport.SubscriberConfig{QueueURL: queue, DLQURL: dlq, WaitTime: time.Second},
		func(ctx context.Context, d sqstransport.Delivery) error {
			start := time.Now()
			err := h(ctx, d)
			mu.Lock()
			lat = append(lat, time.Since(start))
			mu.Unlock()
			return err
		})
	if err != nil {
		b.Fatal(err)
	}
	subCtx, stopSub := context.WithCancel(ctx)
	subDone := make(chan struct{})
	go func() { _ = sub.Run(subCtx); close(subDone) }()
	defer func() { stopSub(); <-subDone }()

	bodies := make([]string, b.N)
	for i := range bodies {
		body, err := keyedEvent(b, "cb_"+strconv.Itoa(i%50), int64(i)).Marshal()
		if err != nil {
			b.Fatal(err)
		}
		bodies[i] = string(body)
	}
	b.ResetTimer()
	start := time.Now()
	sendBodies(b, client, queue, bodies)
	waitFor(b, 5*time.Minute, "all messages stored", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(lat) >= b.N
	})
	elapsed := time.Since(start)
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	b.ReportMetric(ms(percentile(lat, 0.50)), "ack-p50-ms")
	b.ReportMetric(ms(percentile(lat, 0.99)), "ack-p99-ms")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "recv-msgs/s")
}

func sendBodies(b testing.TB, c *sqs.Client, queue string, bodies []string) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := 0; i < len(bodies); i += 10 {
		chunk := bodies[i:min(i+10, len(bodies))]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			entries := make([]types.SendMessageBatchRequestEntry, len(chunk))
			for j, body := range chunk {
				entries[j] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(j)), MessageBody: aws.String(body)}
			}
			if _, err := c.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(queue), Entries: entries}); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
}

// benchEffect is the work both consumers do per message: a credit row and
// an update of the key's running balance.
func benchEffect(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
	if _, err := tx.Exec(ctx, `INSERT INTO credits VALUES ($1, 24)`, e.EventID); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO balances VALUES ($1, 24)
		ON CONFLICT (key) DO UPDATE SET total = balances.total + 24`, e.AggregateID)
	return err
}

// BenchmarkInboxProcessorVsConsumer applies the same b.N events (same
// effect, 4 workers each) twice: through the inbox processor (rows already
// received; per-key order over the given number of keys) and through
// Consumer.Handle (no order, one transaction per message). It reports both
// rates and proc/consumer, their ratio; recv-msgs/s is the inbox's Receive
// rate with 4 concurrent receivers, the other half of the inbox's cost.
func BenchmarkInboxProcessorVsConsumer(b *testing.B) {
	for _, keys := range []int{10, 1000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			ctx := context.Background()
			pool := inboxSetup(b)
			evs := make([]events.Envelope, b.N)
			for i := range evs {
				evs[i] = keyedEvent(b, "cb_"+strconv.Itoa(i%keys), int64(i/keys))
			}
			in := newInbox(b, pool, "bench", idempotent.InboxConfig{})
			b.ResetTimer()

			recv := timeConcurrently(b, 4, evs, func(e events.Envelope) error {
				_, err := in.Receive(ctx, e, e.AggregateID)
				return err
			})

			procPool := otherPool(b, pool, 6)
			proc, err := in.NewProcessor(benchEffect, idempotent.ProcessorConfig{Workers: 4, Pool: procPool})
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { _ = proc.Run(runCtx); close(done) }()
			waitFor(b, 5*time.Minute, "all rows DONE", func() bool {
				return countRows(b, pool, `SELECT count(*) FROM inbox WHERE status = 'DONE'`) == int64(b.N)
			})
			procTime := time.Since(start)
			stop()
			<-done

			c, err := idempotent.NewConsumer(procPool, "bench-consumer")
			if err != nil {
				b.Fatal(err)
			}
			cons := timeConcurrently(b, 4, evs, func(e events.Envelope) error {
				_, err := c.Handle(ctx, idempotent.MessageOf(e), func(ctx context.Context, tx pgx.Tx) error {
					return benchEffect(ctx, tx, e)
				})
				return err
			})
			b.StopTimer()

			procRate := float64(b.N) / procTime.Seconds()
			consRate := float64(b.N) / cons.Seconds()
			b.ReportMetric(float64(b.N)/recv.Seconds(), "recv-msgs/s")
			b.ReportMetric(procRate, "proc-msgs/s")
			b.ReportMetric(consRate, "consumer-msgs/s")
			b.ReportMetric(procRate/consRate, "proc/consumer")
		})
	}
}

// timeConcurrently runs f over evs with n goroutines and returns the time taken.
func timeConcurrently(b *testing.B, n int, evs []events.Envelope, f func(events.Envelope) error) time.Duration {
	work := make(chan events.Envelope, len(evs))
	for _, e := range evs {
		work <- e
	}
	close(work)
	start := time.Now()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for e := range work {
				if err := f(e); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}
