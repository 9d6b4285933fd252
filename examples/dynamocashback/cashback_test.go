package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/redis/go-redis/v9"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/contract"
	"github.com/effectively-once/payments-cashback/services/rewards/cashback/terms"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var quiet = slog.New(slog.DiscardHandler)

type fixture struct {
	db  *dynamodb.Client
	app *App
	t   Tables
}

// newEnv makes the three tables of one test on moto and an App on them,
// with the Redis pre-filter on rdb (nil: off).
func newEnv(t *testing.T, rdb redis.UniversalClient) fixture {
	t.Helper()
	db := testenv.DynamoDB(t)
	tb := Tables{Dedupe: testenv.UniqueName("dedupe-"), Wallets: testenv.UniqueName("wallets-"), Credits: testenv.UniqueName("credits-")}
	if err := Setup(context.Background(), db, tb); err != nil {
		t.Fatal(err)
	}
	app, err := NewApp(db, tb, rdb, quiet)
	if err != nil {
		t.Fatal(err)
	}
	return fixture{db: db, app: app, t: tb}
}

func payment(t *testing.T, paymentID, user string, amount int64) events.Envelope {
	t.Helper()
	e, err := events.New(contract.PaymentSucceeded, paymentID, 1, terms.PaymentPayload{
		PaymentID: paymentID, UserID: user, AmountPaise: amount, Currency: "INR", Status: "SUCCEEDED",
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// creditsOf counts the credit items of a payment (0 or 1: it is the key)
// and returns the event id that made it.
func (e fixture) creditOf(t *testing.T, paymentID string) (found bool, eventID string) {
	t.Helper()
	out, err := e.db.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(e.t.Credits), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"payment_id": s(paymentID)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if out.Item == nil {
		return false, ""
	}
	return true, out.Item["event_id"].(*types.AttributeValueMemberS).Value
}

func (e fixture) wantWallet(t *testing.T, user string, balance, credits int64) {
	t.Helper()
	b, c, err := e.app.Wallet(context.Background(), user)
	if err != nil {
		t.Fatal(err)
	}
	if b != balance || c != credits {
		t.Fatalf("wallet %s = %d paise in %d credits, want %d in %d", user, b, c, balance, credits)
	}
}

// queue is a queue and its DLQ with the app subscribed, recording
// the SQS MessageId of every delivery it acked.
type queue struct {
	sq        *sqs.Client
	url, dlq  string
	mu        sync.Mutex
	delivered []string
}

func (e fixture) subscribe(t *testing.T) *queue {
	t.Helper()
	ctx := context.Background()
	// The project's SQS test server: moto's SQS has no StartMessageMoveTask
	// (it answers 500), which the redrive scenario needs.
	q := &queue{sq: testenv.SQS(t)}
	var err error
	q.url, q.dlq, err = sqstransport.EnsureQueue(ctx, q.sq, testenv.UniqueName("payments-events-"), 5, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := sqstransport.NewSubscriber(q.sq, sqstransport.SubscriberConfig{
		QueueURL: q.url, DLQURL: q.dlq, WaitTime: time.Second, Visibility: 5 * time.Second, Logger: quiet,
	}, func(ctx context.Context, d sqstransport.Delivery) error {
		err := e.app.HandleDelivery(ctx, d)
		if err == nil {
			q.mu.Lock()
			q.delivered = append(q.delivered, d.SQSMessageID)
			q.mu.Unlock()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = sub.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	return q
}

func (q *queue) send(t *testing.T, url string, e events.Envelope) {
	t.Helper()
	body, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.sq.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(string(body))}); err != nil {
		t.Fatal(err)
	}
}

// waitAcked waits until n deliveries were handled and acked, and returns
// their MessageIds.
func (q *queue) waitAcked(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		q.mu.Lock()
		got := append([]string(nil), q.delivered...)
		q.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d deliveries acked after 30s", len(got), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Duplicate: three copies of one PaymentSucceeded (same body, same event
// id: a relay that resent it) through SQS are all acked, and the payment is
// credited once: one credit item, ₹24 in the wallet.
func TestEveryCopyOfAPaymentThroughSQSIsCreditedOnce(t *testing.T) {
	e := newEnv(t, nil)
	q := e.subscribe(t)
	ev := payment(t, "pay_dup1", "u_17", 120000)
	for range 3 {
		q.send(t, q.url, ev)
	}
	q.waitAcked(t, 3)
	if found, by := e.creditOf(t, "pay_dup1"); !found || by != ev.EventID.String() {
		t.Fatalf("credit of pay_dup1: found %v, by %s; want by %s", found, by, ev.EventID)
	}
	e.wantWallet(t, "u_17", 2400, 1)
}

// Redrive: a copy that went to the DLQ and is moved back arrives with a new
// SQS MessageId and the same event id; it is a duplicate: no second credit.
func TestARedrivenCopyWithANewMessageIDCreditsNothing(t *testing.T) {
	e := newEnv(t, nil)
	q := e.subscribe(t)
	ev := payment(t, "pay_redrive1", "u_18", 120000)
	q.send(t, q.url, ev)
	q.waitAcked(t, 1)
	q.send(t, q.dlq, ev) // the copy a crashed consumer left to be parked
	moved, err := sqstransport.Redrive(context.Background(), q.sq, q.dlq, q.url, 0)
	if err != nil || moved != 1 {
		t.Fatalf("redrive moved %d, %v; want 1", moved, err)
	}
	ids := q.waitAcked(t, 2)
	if ids[0] == ids[1] {
		t.Fatalf("the redriven copy kept MessageId %s; the test needs a new one", ids[0])
	}
	e.wantWallet(t, "u_18", 2400, 1)
}

// Concurrent copies: N goroutines handle the same event at once (replicas
// that received copies together); exactly one credit, the wallet exact.
// Distinct payments of the same user, concurrently, all land (ADD is
// atomic on the wallet item). With the Redis pre-filter on, the same.
func TestConcurrentCopiesCreditExactlyOnce(t *testing.T) {
	for _, withRedis := range []bool{false, true} {
		t.Run(fmt.Sprintf("prefilter=%v", withRedis), func(t *testing.T) {
			var rdb redis.UniversalClient
			if withRedis {
				r := testenv.Redis(t)
				c := redis.NewClient(&redis.Options{Addr: r.Addr})
				t.Cleanup(func() { _ = c.Close() })
				rdb = c
			}
			e := newEnv(t, rdb)
			const copies, payments = 16, 5
			var evs []events.Envelope
			for i := range payments {
				evs = append(evs, payment(t, fmt.Sprintf("pay_conc%d", i), "u_19", 10000*int64(i+1)))
			}
			var wg sync.WaitGroup
			for _, ev := range evs {
				for range copies {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := e.app.Handle(context.Background(), ev); err != nil {
							t.Errorf("copy of %s: %v", ev.AggregateID, err)
						}
					}()
				}
			}
			wg.Wait()
			var want int64
			for i, ev := range evs {
				if found, by := e.creditOf(t, ev.AggregateID); !found || by != ev.EventID.String() {
					t.Fatalf("payment %d: credit found %v by %s", i, found, by)
				}
				want += 10000 * int64(i+1) * RateBP / 10000
			}
			e.wantWallet(t, "u_19", want, payments)
		})
	}
}

// The same payment under a second event id (a buggy upstream) is acked and
// credits nothing: the credit's key is the payment id; the second event's
// own copies are then duplicates.
func TestTheSamePaymentUnderASecondEventIDCreditsNothing(t *testing.T) {
	e := newEnv(t, nil)
	first := payment(t, "pay_twice", "u_20", 120000)
	second := payment(t, "pay_twice", "u_20", 120000)
	for _, ev := range []events.Envelope{first, second, second} {
		if err := e.app.Handle(context.Background(), ev); err != nil {
			t.Fatalf("%s: %v", ev.EventID, err)
		}
	}
	if _, by := e.creditOf(t, "pay_twice"); by != first.EventID.String() {
		t.Fatalf("credited by %s, want the first event %s", by, first.EventID)
	}
	e.wantWallet(t, "u_20", 2400, 1)
}

// A payload no redelivery can fix is refused permanently (parked), with
// nothing written.
func TestAMalformedPaymentIsRefusedPermanently(t *testing.T) {
	e := newEnv(t, nil)
	ev := payment(t, "pay_bad", "u_21", 120000)
	ev.Payload = []byte(`{"payment_id":"pay_bad","user_id":"u_21","amount_paise":-5,"currency":"INR"}`)
	err := e.app.Handle(context.Background(), ev)
	if err == nil || !sqstransport.IsPermanent(err) {
		t.Fatalf("Handle = %v; want a permanent error", err)
	}
	if found, _ := e.creditOf(t, "pay_bad"); found {
		t.Fatal("a refused payment was credited")
	}
	e.wantWallet(t, "u_21", 0, 0)
}
