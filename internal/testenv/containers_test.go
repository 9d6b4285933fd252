package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// outboxToQueue is one integration test body, run on containers where
// Docker is and on the local stack everywhere: an event added in a
// committed transaction reaches the queue, with its id as an attribute,
// and its row is marked published.
func outboxToQueue(t *testing.T, pool *pgxpool.Pool, client *sqs.Client, queueURL string) {
	t.Helper()
	ctx := context.Background()
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	e, err := events.New("PaymentSucceeded", "pay_42", 1, map[string]any{"payment_id": "pay_42", "amount_paise": 120000})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Add(ctx, tx, e); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(pool, sqstransport.NewPublisher(client, queueURL, 1), outbox.RelayConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RelayOnce(ctx); n != 1 || err != nil {
		t.Fatalf("RelayOnce = %d, %v; want 1 row", n, err)
	}
	out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &queueURL, WaitTimeSeconds: 5,
		MaxNumberOfMessages: 10, MessageAttributeNames: []string{"All"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Messages) != 1 || aws.ToString(out.Messages[0].MessageAttributes["event_id"].StringValue) != e.EventID.String() {
		t.Fatalf("queue holds %d messages (%+v), want the one of event %s", len(out.Messages), out.Messages, e.EventID)
	}
	var published bool
	if err := pool.QueryRow(ctx, `SELECT published_at IS NOT NULL FROM outbox WHERE id = $1`, e.EventID).Scan(&published); err != nil || !published {
		t.Fatalf("outbox row published = %v, %v", published, err)
	}
}

func TestOutboxToQueueOnContainers(t *testing.T) {
	RequireDocker(t) // skipped, with the reason, where no engine runs: the local-stack twin below covers it
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := StartContainers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Terminate)
	pool, err := pgxpool.New(ctx, c.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	client := sqs.New(sqs.Options{Region: sqstransport.DefaultRegion, BaseEndpoint: aws.String(c.SQSEndpoint),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")})
	q, _ := Queue(t, client, 5, 30*time.Second)
	outboxToQueue(t, pool, client, q)
}

func TestOutboxToQueueOnTheLocalStack(t *testing.T) {
	client := SQS(t)
	q, _ := Queue(t, client, 5, 30*time.Second)
	outboxToQueue(t, DB(t), client, q)
}

func TestContainersAreOnlyUsedWhereDockerIsOrAskedFor(t *testing.T) {
	t.Setenv("TESTENV", "local")
	if use, why := useContainers(); use || why != "TESTENV=local" {
		t.Errorf("TESTENV=local: use = %v (%s)", use, why)
	}
	t.Setenv("TESTENV", "")
	t.Setenv("DATABASE_URL", "postgres://127.0.0.1:1/x")
	if use, why := useContainers(); use || why != "DATABASE_URL is set" {
		t.Errorf("DATABASE_URL set: use = %v (%s)", use, why)
	}
	t.Setenv("TESTENV", "containers")
	use, why := useContainers()
	if use != DockerAvailable() {
		t.Errorf("TESTENV=containers: use = %v, Docker available = %v", use, DockerAvailable())
	}
	if !use && why == "" {
		t.Error("containers refused without a reason")
	}
}
