package service

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/cenkalti/backoff/v5"

	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// QueueURL resolves a queue name, retrying for up to wait while the SQS
// server is starting or its queues are still being created.
func QueueURL(ctx context.Context, c *sqs.Client, name string, wait time.Duration, log *slog.Logger) (string, error) {
	url, err := backoff.Retry(ctx, func() (string, error) {
		out, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
		if err != nil {
			log.Info("waiting for queue", "queue", name, "error", err)
			return "", err
		}
		return *out.QueueUrl, nil
	}, backoff.WithMaxElapsedTime(wait))
	if err != nil {
		return "", fmt.Errorf("queue %s not found after %v (create it with `go run ./cmd/queues`): %w", name, wait, err)
	}
	return url, nil
}

// NewSubscriber resolves queue (waiting up to wait, as QueueURL does) and
// builds a Subscriber on it from cfg, whose zero tuning fields are filled
// from env (a value set in code wins) and whose Logger is log.
func NewSubscriber(ctx context.Context, c *sqs.Client, queue string, wait time.Duration,
	cfg sqstransport.SubscriberConfig, env SubscriberEnv, log *slog.Logger, h sqstransport.Handler) (*sqstransport.Subscriber, error) {
	url, err := QueueURL(ctx, c, queue, wait, log)
	if err != nil {
		return nil, err
	}
	env.Apply(&cfg)
	cfg.QueueURL, cfg.Logger = url, log
	return sqstransport.NewSubscriber(c, cfg, h)
}

// NewBatchSubscriber is NewSubscriber for a handler of whole receives
// (sqstransport.NewBatchSubscriber).
func NewBatchSubscriber(ctx context.Context, c *sqs.Client, queue string, wait time.Duration,
	cfg sqstransport.SubscriberConfig, env SubscriberEnv, log *slog.Logger, h sqstransport.BatchHandler) (*sqstransport.Subscriber, error) {
	url, err := QueueURL(ctx, c, queue, wait, log)
	if err != nil {
		return nil, err
	}
	env.Apply(&cfg)
	cfg.QueueURL, cfg.Logger = url, log
	return sqstransport.NewBatchSubscriber(c, cfg, h)
}

// QueueCheck is a readiness check that the SQS server answers and knows the
// queue named name: a consumer or relay that cannot reach its queue is not
// ready, even if its database is.
func QueueCheck(c *sqs.Client, name string) Check {
	return func(ctx context.Context) error {
		_, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
		if err != nil {
			return fmt.Errorf("queue %s: %w", name, err)
		}
		return nil
	}
}
