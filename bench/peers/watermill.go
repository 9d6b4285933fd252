package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// The module proxy here serves neither watermill-aws nor
// watermill-amazonsqs, so the Forwarder publishes through sqsPublisher: a
// watermill message.Publisher doing one SendMessage per message, which is
// how the Forwarder hands messages to any publisher (one Publish call per
// message it forwards).
type sqsPublisher struct {
	client *sqs.Client
	sent   atomic.Int64
}

func (p *sqsPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		attrs := map[string]types.MessageAttributeValue{}
		for k, v := range m.Metadata {
			if k == "_watermill_message_uuid" || v == "" {
				continue
			}
			attrs[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
		}
		if _, err := p.client.SendMessage(m.Context(), &sqs.SendMessageInput{QueueUrl: aws.String(topic),
			MessageBody: aws.String(string(m.Payload)), MessageAttributes: attrs}); err != nil {
			return err
		}
		p.sent.Add(1)
	}
	return nil
}

func (p *sqsPublisher) Close() error { return nil }

// Tuning, as watermill-sql documents it for throughput: the subscriber
// reads SubscribeBatchSize rows per query (default 100; more rows per
// query, fewer round trips) and polls every PollInterval when idle
// (default 1 s; short here, the table is full when the round starts).
const (
	wmBatch = 500
	wmPoll  = 10 * time.Millisecond
)

func watermillRound(ctx context.Context, run string, n int) (result, error) {
	pool, drop, err := freshDB(ctx, run, "wm", 8)
	if err != nil {
		return result{}, err
	}
	defer drop()
	client, err := sqstransport.NewClient(ctx)
	if err != nil {
		return result{}, err
	}
	name := "bench-" + run + "-peer-wm-" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	q, dlq, err := sqstransport.EnsureQueue(ctx, client, name, 5, 30*time.Second)
	if err != nil {
		return result{}, err
	}
	defer func() {
		for _, u := range []string{q, dlq} {
			_, _ = client.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(u)})
		}
	}()
	logger := watermill.NopLogger{}
	const topic = "outbox"
	schema := wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: wmBatch}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		SchemaAdapter: schema, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true, PollInterval: wmPoll}, logger)
	if err != nil {
		return result{}, err
	}
	if err := sub.SubscribeInitialize(topic); err != nil {
		return result{}, err
	}
	// The producer side, as watermill's outbox docs show it: a SQL
	// publisher on the business transaction, wrapped by the forwarder's
	// publisher that envelopes each message with its destination (here the
	// queue URL). Filled before the round; not timed.
	for i := 0; i < n; i += 100 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			sp, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: schema}, logger)
			if err != nil {
				return err
			}
			fp := forwarder.NewPublisher(sp, forwarder.PublisherConfig{ForwarderTopic: topic})
			for j := i; j < min(i+100, n); j++ {
				m, err := relayMessage()
				if err != nil {
					return err
				}
				if err := fp.Publish(q, m); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return result{}, fmt.Errorf("fill watermill's outbox: %w", err)
		}
	}
	pub := &sqsPublisher{client: client}
	fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: topic, CloseTimeout: 5 * time.Second})
	if err != nil {
		return result{}, err
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- fwd.Run(rctx) }()
	for pub.sent.Load() < int64(n) {
		select {
		case err := <-done:
			return result{}, fmt.Errorf("forwarder stopped after %d of %d: %v", pub.sent.Load(), n, err)
		case <-ctx.Done():
			return result{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	el := time.Since(start)
	_ = fwd.Close()
	return result{Case: "watermill", Count: n, Seconds: el.Seconds(), Rate: float64(n) / el.Seconds(), Config: map[string]any{
		"watermill": "v1.5.1", "watermill-sql": "v4.1.2", "subscribe_batch_size": wmBatch, "poll_interval": wmPoll.String(),
		"publisher": "SendMessage per message (watermill-aws not served by the module proxy)"}}, nil
}

// relayMessage is one event shaped as the library's relay sends it: the
// envelope as body, event_id, event_type and traceparent as attributes.
func relayMessage() (*message.Message, error) {
	pay := "pay_" + strings.ReplaceAll(uuid.Must(uuid.NewV7()).String(), "-", "")
	e, err := events.New(contract.PaymentSucceeded, pay, 1, map[string]any{"payment_id": pay, "user_id": "u_17",
		"amount_paise": 120000, "currency": "INR", "status": "SUCCEEDED"})
	if err != nil {
		return nil, err
	}
	body, err := e.Marshal()
	if err != nil {
		return nil, err
	}
	m := message.NewMessage(e.EventID.String(), body)
	m.Metadata.Set("event_id", e.EventID.String())
	m.Metadata.Set("event_type", e.EventType)
	m.Metadata.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	return m, nil
}
