package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/contract"
	"github.com/effectively-once/payments-cashback/services/rewards/app"
	"github.com/effectively-once/payments-cashback/services/rewards/cashback"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// stack is one rewards service on a fresh database and fresh queues.
type stack struct {
	t                  *testing.T
	app                *app.App
	pool               *pgxpool.Pool
	sqs                *sqs.Client
	payments, paysDLQ  string // queue URLs
	rewards, rewardDLQ string
	logs               *testenv.Buffer
	log                *slog.Logger
	http               *httptest.Server
}

type options struct {
	maxReceive int
	retryBase  time.Duration
	cfg        func(*app.Config)
	noWorkers  bool
}

func start(t *testing.T, o options) *stack {
	t.Helper()
	if o.maxReceive == 0 {
		o.maxReceive = 5
	}
	if o.retryBase == 0 {
		o.retryBase = 100 * time.Millisecond // rounds to a 0 s visibility: immediate redelivery
	}
	s := &stack{t: t, pool: testenv.DB(t), sqs: testenv.SQS(t), logs: &testenv.Buffer{}}
	s.payments, s.paysDLQ = testenv.Queue(t, s.sqs, o.maxReceive, 30*time.Second)
	s.rewards, s.rewardDLQ = testenv.Queue(t, s.sqs, 5, 30*time.Second)
	cfg := app.Config{
		Port:            "0",
		PaymentsQueue:   name(s.payments),
		RewardsQueue:    name(s.rewards),
		ConsumerEnv:     sqstransport.ConsumerEnv{Concurrency: 4, QueueWait: 10 * time.Second},
		DedupeRetention: 360 * time.Hour,
		Subscriber: sqstransport.SubscriberConfig{
			WaitTime: time.Second, RetryBase: o.retryBase, RetryMax: 4 * o.retryBase, ShutdownGrace: 5 * time.Second,
		},
		Relay:       outbox.RelayConfig{PollInterval: 50 * time.Millisecond},
		Access:      testAccess,
		MaxRateBP:   cashback.DefaultMaxRateBP,
		RateMinLead: time.Second, // short, so a test sees a new rate take effect
	}
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	log := slog.New(slog.NewJSONHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx := context.Background()
	a, err := app.New(ctx, cfg, s.pool, s.sqs, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	s.app = a
	t.Cleanup(a.Close)
	s.http = httptest.NewServer(a.Router)
	t.Cleanup(s.http.Close)
	s.log = log
	if !o.noWorkers {
		s.runWorkers()
	} else {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("service logs:\n%s", s.logs.String())
			}
		})
	}
	return s
}

// runWorkers starts the service's workers (subscriber, relay, ...) until
// the test ends.
func (s *stack) runWorkers() {
	t := s.t
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.Run(ctx, s.log, 0, s.app.Workers()...) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("workers: %v", err)
		}
		if t.Failed() {
			t.Logf("service logs:\n%s", s.logs.String())
		}
	})
}

func name(url string) string { return url[strings.LastIndex(url, "/")+1:] }

func paid(t *testing.T, paymentID, user string, amount int64, version int64) events.Envelope {
	t.Helper()
	e, err := events.New(contract.PaymentSucceeded, paymentID, version, map[string]any{
		"payment_id": paymentID, "user_id": user, "amount_paise": amount, "currency": "INR", "status": "SUCCEEDED"})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func refunded(t *testing.T, paymentID, user string, amount int64, version int64) events.Envelope {
	t.Helper()
	e, err := events.New(contract.PaymentRefunded, paymentID, version, map[string]any{
		"payment_id": paymentID, "user_id": user, "amount_paise": amount, "currency": "INR", "status": "REFUNDED"})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// send puts e on the payments queue as a new SQS message (a fresh
// MessageId each time, as a relay resend or a DLQ redrive would).
func (s *stack) send(e events.Envelope) {
	s.t.Helper()
	body, err := e.Marshal()
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := s.sqs.SendMessage(context.Background(), &sqs.SendMessageInput{
		QueueUrl: aws.String(s.payments), MessageBody: aws.String(string(body)),
		MessageAttributes: map[string]types.MessageAttributeValue{
			"event_id":   {DataType: aws.String("String"), StringValue: aws.String(e.EventID.String())},
			"event_type": {DataType: aws.String("String"), StringValue: aws.String(e.EventType)},
		},
	}); err != nil {
		s.t.Fatal(err)
	}
}

func (s *stack) count(sql string, args ...any) int64 {
	s.t.Helper()
	var n int64
	if err := s.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		s.t.Fatal(err)
	}
	return n
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// queueEmpty: no message visible or in flight on url.
func (s *stack) queueEmpty(url string) bool { return testenv.QueueEmpty(s.t, s.sqs, url) }

// wallet reads GET /v1/wallets/{user} through the HTTP API.
func (s *stack) wallet(user string) cashback.Wallet {
	s.t.Helper()
	code, body := s.do(http.MethodGet, "/v1/wallets/"+user, readKey, "")
	if code != http.StatusOK {
		s.t.Fatalf("GET wallet: %d %s", code, body)
	}
	var w cashback.Wallet
	if err := json.Unmarshal([]byte(body), &w); err != nil {
		s.t.Fatal(err)
	}
	return w
}

// outboxEvents lists the payloads of the outbox rows of a type, oldest first.
func (s *stack) outboxEvents(eventType string) []map[string]any {
	s.t.Helper()
	rows, err := s.pool.Query(context.Background(), `SELECT payload FROM outbox WHERE event_type = $1 ORDER BY id`, eventType)
	if err != nil {
		s.t.Fatal(err)
	}
	defer rows.Close()
	var out []map[string]any
	for rows.Next() {
		var p map[string]any
		if err := rows.Scan(&p); err != nil {
			s.t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// receiveAll drains up to n messages from url within the deadline.
func (s *stack) receiveAll(url string, n int, within time.Duration) []types.Message {
	s.t.Helper()
	var got []types.Message
	deadline := time.Now().Add(within)
	for len(got) < n && time.Now().Before(deadline) {
		out, err := s.sqs.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames: []string{"All"}})
		if err != nil {
			s.t.Fatal(err)
		}
		got = append(got, out.Messages...)
	}
	return got
}

const user = "u_17"

// Rule 1: one credit for duplicate deliveries. The same envelope arrives as
// three SQS messages; the relay also publishes one CashbackCredited, which
// reaches rewards-events.
func TestDuplicateDeliveriesCreditOnce(t *testing.T) {
	t.Parallel()
	s := start(t, options{})
	e := paid(t, "pay_42", user, 120000, 1)
	for range 3 {
		s.send(e)
	}
	eventually(t, 20*time.Second, "all three copies acked", func() bool {
		return s.count(`SELECT count(*) FROM cashback_credits`) == 1 && s.queueEmpty(s.payments)
	})
	w := s.wallet(user)
	if w.BalancePaise != 2400 || len(w.Credits) != 1 || w.Credits[0].AmountPaise != 2400 || w.Credits[0].RateBP != 200 ||
		w.Credits[0].EventID != e.EventID || w.Credits[0].Status != "CREDITED" {
		t.Errorf("wallet = %+v; want 2400 paise from one CREDITED credit at 200 bp by %s", w, e.EventID)
	}
	if n := s.count(`SELECT count(*) FROM processed_messages WHERE consumer = 'rewards' AND message_id = $1`, e.EventID); n != 1 {
		t.Errorf("dedupe rows = %d, want 1", n)
	}
	credited := s.outboxEvents(contract.CashbackCredited)
	if len(credited) != 1 || credited[0]["amount_paise"] != float64(2400) || credited[0]["rate_bp"] != float64(200) ||
		credited[0]["payment_id"] != "pay_42" || credited[0]["user_id"] != user || credited[0]["recipient"] != user {
		t.Errorf("CashbackCredited outbox rows = %v; want one for 2400 paise", credited)
	}
	// The relay publishes it to rewards-events with the envelope intact.
	msgs := s.receiveAll(s.rewards, 1, 15*time.Second)
	if len(msgs) != 1 {
		t.Fatalf("rewards-events received %d messages, want 1", len(msgs))
	}
	out, err := events.Decode([]byte(aws.ToString(msgs[0].Body)))
	if err != nil || out.EventType != contract.CashbackCredited || out.AggregateID != "pay_42" {
		t.Errorf("published %+v (%v); want CashbackCredited for pay_42", out, err)
	}
	if got := aws.ToString(msgs[0].MessageAttributes["event_id"].StringValue); got != out.EventID.String() {
		t.Errorf("event_id attribute %q, want %s", got, out.EventID)
	}
}

// Rules 1 and 3 under concurrency: copies of one event, and the same
// payment under other event ids, all at once, credit exactly once.
func TestConcurrentCopiesAndEventIDsCreditOnce(t *testing.T) {
	t.Parallel()
	s := start(t, options{noWorkers: true})
	first := paid(t, "pay_7", user, 120000, 1)
	envs := []events.Envelope{first, first, first, paid(t, "pay_7", user, 120000, 1), paid(t, "pay_7", user, 120000, 1)}
	var wg sync.WaitGroup
	errs := make([]error, len(envs)*2)
	for i := range errs {
		wg.Go(func() { errs[i] = s.app.Processor.Handle(context.Background(), envs[i%len(envs)]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("delivery %d: %v (every copy must be acked)", i, err)
		}
	}
	if n := s.count(`SELECT count(*) FROM cashback_credits`); n != 1 {
		t.Errorf("credits = %d, want 1", n)
	}
	if w := s.wallet(user); w.BalancePaise != 2400 {
		t.Errorf("balance = %d, want 2400", w.BalancePaise)
	}
	if n := len(s.outboxEvents(contract.CashbackCredited)); n != 1 {
		t.Errorf("CashbackCredited rows = %d, want 1", n)
	}
	if n := s.count(`SELECT count(*) FROM processed_messages`); n != 3 {
		t.Errorf("dedupe rows = %d, want 3 (one per distinct event id)", n)
	}
}

// Rule 3: the same payment under a second event id: both messages acked,
// one credit, a warning.
func TestSamePaymentUnderTwoEventIDs(t *testing.T) {
	t.Parallel()
	s := start(t, options{})
	a, b := paid(t, "pay_42", user, 120000, 1), paid(t, "pay_42", user, 120000, 1)
	s.send(a)
	s.send(b)
	eventually(t, 20*time.Second, "both event ids committed and acked", func() bool {
		return s.count(`SELECT count(*) FROM processed_messages`) == 2 && s.queueEmpty(s.payments)
	})
	if w := s.wallet(user); w.BalancePaise != 2400 || len(w.Credits) != 1 {
		t.Errorf("wallet = %+v; want one credit of 2400", w)
	}
	if n := len(s.outboxEvents(contract.CashbackCredited)); n != 1 {
		t.Errorf("CashbackCredited rows = %d, want 1", n)
	}
	if !s.queueEmpty(s.paysDLQ) {
		t.Error("a copy was parked in the DLQ; both must be acked")
	}
	logs := s.logs.String()
	if !strings.Contains(logs, `"level":"WARN","msg":"payment already credited under another event id`) {
		t.Errorf("no warning about the second event id in the logs:\n%s", logs)
	}
}

// Rule 4: the handler fails on the first attempt (test hook), the rate
// changes from 2% to 3% before the retry, and the retry still credits 2400
// for 120000: the rate in force at occurred_at. The failed attempt
// committed nothing.
func TestRateChangeBetweenFailedAttemptAndRetry(t *testing.T) {
	t.Parallel()
	e := paid(t, "pay_42", user, 120000, 1)
	s := start(t, options{retryBase: 2 * time.Second, cfg: func(c *app.Config) { c.Fail = failHook(t, e.EventID.String()+"@1") }})
	s.send(e)
	eventually(t, 20*time.Second, "the injected failure", func() bool { return s.app.Fail.Injected() == 1 })
	if n := s.count(`SELECT count(*) FROM processed_messages`) + s.count(`SELECT count(*) FROM cashback_credits`) +
		s.count(`SELECT count(*) FROM wallets`) + s.count(`SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("the failed attempt left %d rows; a handler error must commit nothing", n)
	}
	// Operators raise the rate to 3%, effective a second from now (the
	// test's minimum lead): after the payment happened.
	code, body := s.do(http.MethodPost, "/v1/cashback-rates", adminKey, `{"rate_bp":300}`)
	if code != http.StatusCreated {
		t.Fatalf("POST /v1/cashback-rates: %d %s", code, body)
	}
	var three cashback.Rate
	if err := json.Unmarshal([]byte(body), &three); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the retry's credit", func() bool { return s.count(`SELECT count(*) FROM cashback_credits`) == 1 })
	w := s.wallet(user)
	if w.BalancePaise != 2400 || w.Credits[0].RateBP != 200 {
		t.Errorf("wallet = %+v; want 2400 at 200 bp (the rate at occurred_at), never 3600", w)
	}
	// A payment made after the change does get 3%.
	time.Sleep(time.Until(three.EffectiveFrom))
	later := paid(t, "pay_43", user, 120000, 1)
	s.send(later)
	eventually(t, 20*time.Second, "the second credit", func() bool { return s.count(`SELECT count(*) FROM cashback_credits`) == 2 })
	if w := s.wallet(user); w.BalancePaise != 2400+3600 {
		t.Errorf("balance = %d, want 6000 (2400 at 2%% + 3600 at 3%%)", w.BalancePaise)
	}
}

// A rate cannot be scheduled in the past: that would change what a retry
// credits for a payment that already happened.
func TestRetroactiveRateRefused(t *testing.T) {
	t.Parallel()
	s := start(t, options{noWorkers: true})
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	if code, body := s.do(http.MethodPost, "/v1/cashback-rates", adminKey, fmt.Sprintf(`{"rate_bp":300,"effective_from":%q}`, past)); code != http.StatusUnprocessableEntity {
		t.Errorf("retroactive rate: %d %s, want 422", code, body)
	}
	if n := s.count(`SELECT count(*) FROM cashback_rates`); n != 1 {
		t.Errorf("rates = %d, want only the seeded one", n)
	}
}

// A handler that keeps failing: the message is redelivered until
// maxReceiveCount and then SQS moves it to the DLQ. Nothing is committed.
func TestHandlerFailingPastMaxReceiveCountGoesToDLQ(t *testing.T) {
	t.Parallel()
	e := paid(t, "pay_42", user, 120000, 1)
	s := start(t, options{maxReceive: 2, cfg: func(c *app.Config) { c.Fail = failHook(t, e.EventID.String()) }})
	s.send(e)
	msgs := s.receiveAll(s.paysDLQ, 1, 30*time.Second)
	if len(msgs) != 1 {
		t.Fatalf("DLQ holds %d messages, want the failing one", len(msgs))
	}
	if got, err := events.Decode([]byte(aws.ToString(msgs[0].Body))); err != nil || got.EventID != e.EventID {
		t.Errorf("DLQ message is %v (%v), want event %s", got.EventID, err, e.EventID)
	}
	if n := s.app.Fail.Injected(); n < 2 {
		t.Errorf("injected failures = %d, want at least maxReceiveCount (2)", n)
	}
	if n := s.count(`SELECT count(*) FROM processed_messages`) + s.count(`SELECT count(*) FROM cashback_credits`); n != 0 {
		t.Errorf("%d rows committed for a message that never succeeded", n)
	}
}

// Rule 5: a refund reverses the credit once, however many copies and
// event ids it comes under.
func TestRefundReversesOnce(t *testing.T) {
	t.Parallel()
	s := start(t, options{noWorkers: true})
	ctx := context.Background()
	p := s.app.Processor
	if err := p.Handle(ctx, paid(t, "pay_42", user, 120000, 1)); err != nil {
		t.Fatal(err)
	}
	r := refunded(t, "pay_42", user, 120000, 2)
	for _, e := range []events.Envelope{r, r, refunded(t, "pay_42", user, 120000, 2)} {
		if err := p.Handle(ctx, e); err != nil {
			t.Fatalf("refund %s: %v", e.EventID, err)
		}
	}
	w := s.wallet(user)
	if w.BalancePaise != 0 || len(w.Credits) != 1 || w.Credits[0].Status != "REVERSED" || w.Credits[0].ReversedAt == nil ||
		w.Credits[0].ReversalEventID == nil || *w.Credits[0].ReversalEventID != r.EventID {
		t.Errorf("wallet = %+v; want balance 0 and the credit REVERSED by %s", w, r.EventID)
	}
	reversed := s.outboxEvents(contract.CashbackReversed)
	if len(reversed) != 1 || reversed[0]["amount_paise"] != float64(2400) {
		t.Errorf("CashbackReversed rows = %v, want one for 2400", reversed)
	}
}

// Rule 5: after the refund, a stale PaymentSucceeded changes nothing, be it
// a redelivered copy (same event id) or the same version under another id.
func TestStalePaidCopyAfterRefundChangesNothing(t *testing.T) {
	t.Parallel()
	s := start(t, options{})
	p1 := paid(t, "pay_42", user, 120000, 1)
	s.send(p1)
	eventually(t, 20*time.Second, "the credit", func() bool { return s.count(`SELECT count(*) FROM cashback_credits`) == 1 })
	s.send(refunded(t, "pay_42", user, 120000, 2))
	eventually(t, 20*time.Second, "the reversal", func() bool {
		return s.count(`SELECT count(*) FROM cashback_credits WHERE status = 'REVERSED'`) == 1
	})
	s.send(p1)                                 // redelivered copy: a Duplicate
	s.send(paid(t, "pay_42", user, 120000, 1)) // stale version under a new event id
	eventually(t, 20*time.Second, "the stale copies acked", func() bool {
		return s.count(`SELECT count(*) FROM processed_messages`) == 3 && s.queueEmpty(s.payments)
	})
	w := s.wallet(user)
	if w.BalancePaise != 0 || len(w.Credits) != 1 || w.Credits[0].Status != "REVERSED" {
		t.Errorf("wallet = %+v; want balance 0, the one credit still REVERSED", w)
	}
	if c, r := len(s.outboxEvents(contract.CashbackCredited)), len(s.outboxEvents(contract.CashbackReversed)); c != 1 || r != 1 {
		t.Errorf("outbox: %d CashbackCredited, %d CashbackReversed; want 1 and 1", c, r)
	}
	if !strings.Contains(s.logs.String(), "stale copy ignored") {
		t.Error("no warning about the stale PaymentSucceeded")
	}
	if !s.queueEmpty(s.paysDLQ) {
		t.Error("a stale copy was parked; it must be acked")
	}
}

// Rule 5: the refund overtakes its PaymentSucceeded. The late
// PaymentSucceeded credits nothing; the wallet stays at 0.
func TestRefundBeforePaid(t *testing.T) {
	t.Parallel()
	s := start(t, options{noWorkers: true})
	ctx := context.Background()
	p := s.app.Processor
	if err := p.Handle(ctx, refunded(t, "pay_42", user, 120000, 2)); err != nil {
		t.Fatal(err)
	}
	if err := p.Handle(ctx, paid(t, "pay_42", user, 120000, 1)); err != nil {
		t.Fatal(err)
	}
	if n := s.count(`SELECT count(*) FROM cashback_credits`); n != 0 {
		t.Errorf("credits = %d, want 0", n)
	}
	if w := s.wallet(user); w.BalancePaise != 0 || len(w.Credits) != 0 {
		t.Errorf("wallet = %+v; want 0 and no credits", w)
	}
	if n := s.count(`SELECT count(*) FROM outbox`); n != 0 {
		t.Errorf("outbox rows = %d, want none", n)
	}
	if n := s.count(`SELECT count(*) FROM payment_versions WHERE payment_id = 'pay_42' AND status = 'REFUNDED' AND version = 2`); n != 1 {
		t.Error("the refund is not recorded as the payment's state")
	}
	// A PaymentSucceeded claiming a version after the refund contradicts
	// the history (a refund is terminal): refused permanently, not applied.
	err := p.Handle(ctx, paid(t, "pay_42", user, 120000, 3))
	if !sqstransport.IsPermanent(err) {
		t.Errorf("PaymentSucceeded v3 after refund v2: %v, want a permanent error", err)
	}
	if n := s.count(`SELECT count(*) FROM cashback_credits`); n != 0 {
		t.Errorf("credits = %d after the contradictory event, want 0", n)
	}
}

// Unknown event types and malformed payloads are parked in the DLQ with a
// reason, at once, and commit nothing.
func TestUnknownTypeParkedInDLQ(t *testing.T) {
	t.Parallel()
	s := start(t, options{})
	unknown, err := events.New("PaymentDisputed", "pay_42", 3, map[string]any{"payment_id": "pay_42"})
	if err != nil {
		t.Fatal(err)
	}
	bad := paid(t, "pay_43", user, 120000, 1)
	bad.Payload = json.RawMessage(`{"payment_id":"pay_43","user_id":"u_17","amount_paise":-5,"currency":"INR"}`)
	s.send(unknown)
	s.send(bad)
	msgs := s.receiveAll(s.paysDLQ, 2, 20*time.Second)
	if len(msgs) != 2 {
		t.Fatalf("DLQ holds %d messages, want 2", len(msgs))
	}
	reasons := map[string]string{}
	for _, m := range msgs {
		e, err := events.Decode([]byte(aws.ToString(m.Body)))
		if err != nil {
			t.Fatal(err)
		}
		reasons[e.EventType+" "+e.AggregateID] = aws.ToString(m.MessageAttributes["park_reason"].StringValue)
	}
	if r := reasons["PaymentDisputed pay_42"]; !strings.Contains(r, `event type "PaymentDisputed"`) {
		t.Errorf("park reason for the unknown type = %q", r)
	}
	if r := reasons["PaymentSucceeded pay_43"]; !strings.Contains(r, "amount_paise must be positive") {
		t.Errorf("park reason for the bad payload = %q", r)
	}
	if n := s.count(`SELECT count(*) FROM processed_messages`) + s.count(`SELECT count(*) FROM cashback_credits`); n != 0 {
		t.Errorf("%d rows committed for refused messages", n)
	}
	eventually(t, 10*time.Second, "the source queue empty", func() bool { return s.queueEmpty(s.payments) })
}

// failHook is the test hook failing the events of spec (REWARDS_FAIL_EVENT_IDS syntax).
func failHook(t *testing.T, spec string) *cashback.FailHook {
	t.Helper()
	h, err := cashback.ParseFailHook(spec, "")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestRetentionShorterThanSQSRefused(t *testing.T) {
	t.Parallel()
	_, err := app.New(context.Background(), app.Config{DedupeRetention: 24 * time.Hour, Port: "0", Access: testAccess}, nil, nil, nil, slog.Default())
	if err == nil || !strings.Contains(err.Error(), "DEDUPE_RETENTION") {
		t.Errorf("New with a 24h window: %v, want a DEDUPE_RETENTION error", err)
	}
}

func TestConfigFromEnvironment(t *testing.T) {
	testenv.Unsetenv(t, "LISTEN_ADDR", "REWARDS_API_KEYS", "REWARDS_MAX_RATE_BP", "REWARDS_RATE_MIN_LEAD")
	t.Setenv("REWARDS_DATABASE_URL", "postgres://x/rewards")
	cfg, err := service.LoadConfig[app.Config]()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Port != "8082" || cfg.PaymentsQueue != "payments-events" || cfg.RewardsQueue != "rewards-events" ||
		cfg.DedupeRetention != 360*time.Hour || cfg.Fail != nil || cfg.Concurrency != 8 ||
		cfg.MaxRateBP != 1000 || cfg.RateMinLead != time.Minute || cfg.ListenAddr != "" || cfg.Access.RateLimit != 1000 {
		t.Errorf("defaults: %+v", cfg)
	}
	t.Setenv("REWARDS_DATABASE_URL", "")
	if _, err := service.LoadConfig[app.Config](); err == nil || !strings.Contains(err.Error(), "REWARDS_DATABASE_URL") {
		t.Errorf("missing REWARDS_DATABASE_URL: %v", err)
	}
}

// sendBatch puts es on the payments queue in one SendMessageBatch, so that
// one receive brings them all.
func (s *stack) sendBatch(es []events.Envelope) {
	s.t.Helper()
	entries := make([]types.SendMessageBatchRequestEntry, len(es))
	for i, e := range es {
		body, err := e.Marshal()
		if err != nil {
			s.t.Fatal(err)
		}
		entries[i] = types.SendMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), MessageBody: aws.String(string(body))}
	}
	out, err := s.sqs.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(s.payments), Entries: entries})
	if err != nil || len(out.Failed) > 0 {
		s.t.Fatalf("SendMessageBatch: %v, %d failed", err, len(out.Failed))
	}
}

// Batch consumption keeps the per-message guarantee: in one receive of 10,
// a poison message (a PaymentSucceeded contradicting the payment's refund,
// refused permanently by its effect, after the others' effects ran in the
// same transaction) does not take its neighbours down: the other 9 are
// credited exactly once, the poison is parked in the DLQ with its reason,
// and nothing of it is committed.
func TestBatchWithOnePoisonCreditsTheOtherNineOnceAndParksThePoison(t *testing.T) {
	t.Parallel()
	s := start(t, options{noWorkers: true})
	ctx := context.Background()
	if err := s.app.Processor.Handle(ctx, refunded(t, "pay_poison", user, 120000, 2)); err != nil {
		t.Fatal(err)
	}
	var es []events.Envelope
	for i := range 9 {
		es = append(es, paid(t, fmt.Sprintf("pay_b%d", i), fmt.Sprintf("u_b%d", i), 120000, 1))
	}
	poison := paid(t, "pay_poison", user, 120000, 3)
	es = append(es[:4], append([]events.Envelope{poison}, es[4:]...)...)
	s.sendBatch(es)
	s.runWorkers()
	msgs := s.receiveAll(s.paysDLQ, 1, 20*time.Second)
	if len(msgs) != 1 {
		t.Fatalf("DLQ holds %d messages, want the poison one", len(msgs))
	}
	if got, _ := events.Decode([]byte(aws.ToString(msgs[0].Body))); got.EventID != poison.EventID {
		t.Errorf("DLQ holds event %s, want the poison %s", got.EventID, poison.EventID)
	}
	if r := aws.ToString(msgs[0].MessageAttributes["park_reason"].StringValue); !strings.Contains(r, "contradictory history") {
		t.Errorf("park reason = %q", r)
	}
	eventually(t, 20*time.Second, "the other nine credited and acked", func() bool {
		return s.count(`SELECT count(*) FROM cashback_credits`) == 9 && s.queueEmpty(s.payments)
	})
	if n := s.count(`SELECT count(*) FROM cashback_credits WHERE payment_id = 'pay_poison'`); n != 0 {
		t.Errorf("the poison payment has %d credits", n)
	}
	if n := s.count(`SELECT count(*) FROM processed_messages WHERE message_id = $1`, poison.EventID); n != 0 {
		t.Errorf("the poison's dedupe key was committed")
	}
	if n := s.count(`SELECT count(*) FROM outbox WHERE event_type = 'CashbackCredited'`); n != 9 {
		t.Errorf("CashbackCredited rows = %d, want 9", n)
	}
	if n := s.count(`SELECT count(DISTINCT payment_id) FROM cashback_credits`); n != 9 {
		t.Errorf("distinct credited payments = %d, want 9 (each once)", n)
	}
}

// A crash in the middle of a batch leaves nothing half-applied: the
// batch's transaction holds the first effects' writes when the work is cut
// (its context cancelled while the 6th event's effect runs, as a process
// dying would cut its connection); then no credit, dedupe key, wallet move
// or outbox row of any of the 10 is committed, every message is left for
// redelivery (a transient error), and the redelivered batch credits each
// exactly once.
func TestCrashMidBatchLeavesNothingHalfApplied(t *testing.T) {
	t.Parallel()
	s := start(t, options{noWorkers: true, cfg: func(c *app.Config) { c.Fail = failHook(t, "") }})
	var ds []sqstransport.Delivery
	for i := range 10 {
		ds = append(ds, sqstransport.Delivery{Envelope: paid(t, fmt.Sprintf("pay_c%d", i), user, 120000, 1)})
	}
	if err := s.app.Fail.SetSlow(ds[5].Envelope.EventID.String() + "@1500ms"); err != nil {
		t.Fatal(err)
	}
	ctx, crash := context.WithCancel(context.Background())
	go func() {
		// Crash once the batch is inside the 6th effect: 5 credits written, none committed.
		eventually(t, 10*time.Second, "the batch holding 5 credits", func() bool {
			return s.count(`SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
				WHERE c.relname = 'cashback_credits' AND l.mode = 'RowExclusiveLock'`) > 0
		})
		time.Sleep(300 * time.Millisecond)
		crash()
	}()
	errs := s.app.Processor.HandleBatchDeliveries(ctx, ds)
	for i, err := range errs {
		if err == nil || sqstransport.IsPermanent(err) {
			t.Errorf("message %d: %v, want a transient error (left for redelivery)", i, err)
		}
	}
	for _, table := range []string{"cashback_credits", "processed_messages", "wallets", "outbox", "payment_versions"} {
		if n := s.count(`SELECT count(*) FROM ` + table); n != 0 {
			t.Errorf("%s: %d rows committed by a batch that crashed", table, n)
		}
	}
	_ = s.app.Fail.SetSlow("")
	for i, err := range s.app.Processor.HandleBatchDeliveries(context.Background(), ds) {
		if err != nil {
			t.Errorf("redelivered message %d: %v", i, err)
		}
	}
	if n := s.count(`SELECT count(DISTINCT payment_id) FROM cashback_credits`); n != 10 {
		t.Errorf("credited payments = %d, want 10", n)
	}
	if w := s.wallet(user); w.BalancePaise != 10*2400 {
		t.Errorf("balance = %d, want %d (each credit once)", w.BalancePaise, 10*2400)
	}
}
