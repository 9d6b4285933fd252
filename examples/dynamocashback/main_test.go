package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// The command as a user runs it: configured by the environment, it makes
// its tables, consumes two copies of a payment (one credit, ₹24 in the
// wallet) and, when its context ends (a signal, in main), stops and
// returns nil.
func TestTheCommandCreditsACopiedPaymentOnceAndStopsCleanly(t *testing.T) {
	ctx := context.Background()
	db, sq := testenv.DynamoDB(t), testenv.SQS(t)
	url, _, err := sqstransport.EnsureQueue(ctx, sq, testenv.UniqueName("payments-events-"), 5, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tb := Tables{Dedupe: testenv.UniqueName("dedupe-"), Wallets: testenv.UniqueName("wallets-"), Credits: testenv.UniqueName("credits-")}
	for k, v := range map[string]string{
		"QUEUE_URL": url, "DEDUPE_TABLE": tb.Dedupe, "WALLETS_TABLE": tb.Wallets, "CREDITS_TABLE": tb.Credits,
		"CREATE_TABLES": "true", "SUBSCRIBER_CONCURRENCY": "1",
		"AWS_ENDPOINT_URL_DYNAMODB": aws.ToString(db.Options().BaseEndpoint),
		"AWS_ENDPOINT_URL_SQS":      aws.ToString(sq.Options().BaseEndpoint),
	} {
		t.Setenv(k, v)
	}
	logs := &testenv.Buffer{}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(rctx, logs) }()
	for start := time.Now(); !strings.Contains(logs.String(), `"msg":"consuming"`); time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("run returned %v before consuming; logs:\n%s", err, logs.String())
		default:
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("not consuming after 30 s (its tables made first); logs:\n%s", logs.String())
		}
	}

	e := payment(t, "pay_cmd_1", "u_cmd_1", 120000)
	body, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := sq.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(string(body))}); err != nil {
			t.Fatal(err)
		}
	}
	app, err := NewApp(db, tb, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{db: db, app: app, t: tb}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if found, _ := f.creditOf(t, "pay_cmd_1"); found && testenv.QueueEmpty(t, sq, url) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no credit, or copies left on the queue, after 30 s; logs:\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	f.wantWallet(t, "u_cmd_1", 2400, 1)

	// The subscriber lets its long poll in flight (up to 20 s) end rather
	// than abandon what it would hand out: shutdown takes that long.
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v after its context ended, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return within 30 s of its context's end")
	}
}
