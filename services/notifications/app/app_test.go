package app_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/contract"
	"github.com/effectively-once/payments-cashback/services/notifications/api"
	"github.com/effectively-once/payments-cashback/services/notifications/app"
	"github.com/effectively-once/payments-cashback/services/notifications/intent"
	"github.com/effectively-once/payments-cashback/services/notifications/intent/compose"
	"github.com/effectively-once/payments-cashback/services/notifications/sender"
	"github.com/effectively-once/payments-cashback/services/notifications/smsprovider"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// stack is one notifications service on a fresh database, a fresh
// rewards-events queue and a dev SMS provider served over HTTP.
type stack struct {
	t          *testing.T
	app        *app.App
	pool       *pgxpool.Pool
	sqs        *sqs.Client
	queue, dlq string
	provider   *smsprovider.Server
	http       *httptest.Server
	logs       *testenv.Buffer
}

// The dev SMS provider's clients in these tests: an operator, and this
// service, which sends.
const (
	providerOpsKey  = "test-provider-ops-key-0123456789abcdef"
	providerSendKey = "test-provider-send-key-0123456789abcdef"
)

func start(t *testing.T, mutate func(*app.Config)) *stack {
	t.Helper()
	s := &stack{t: t, pool: testenv.DB(t), sqs: testenv.SQS(t), provider: smsprovider.New(), logs: &testenv.Buffer{}}
	s.queue, s.dlq = testenv.Queue(t, s.sqs, 5, 30*time.Second)
	// The provider as its command serves it: the sender's API wants this
	// service's key (the role send), so every delivery below also shows
	// that the service sends it.
	provAccess, err := service.AccessEnv{APIKeys: "ops/read+admin:" + providerOpsKey + ",notifications/send:" + providerSendKey,
		RateLimit: 1000, AddressRateLimit: 1000, RateWindow: time.Second}.Parse("SMS_PROVIDER_", smsprovider.Needs)
	if err != nil {
		t.Fatal(err)
	}
	provHandler, err := s.provider.Handler(slog.New(slog.DiscardHandler), nil, provAccess)
	if err != nil {
		t.Fatal(err)
	}
	prov := httptest.NewServer(provHandler)
	t.Cleanup(prov.Close)
	cfg := app.Config{
		Port: "0", RewardsQueue: s.queue[strings.LastIndex(s.queue, "/")+1:],
		ConsumerEnv:     sqstransport.ConsumerEnv{Concurrency: 4, QueueWait: 10 * time.Second},
		DedupeRetention: 360 * time.Hour, SMSProviderURL: prov.URL, SMSProviderAPIKey: providerSendKey, SMSProviderTimeout: time.Second, SMSProviderLookup: true,
		SendingLease: 5 * time.Second, SendMaxAttempts: 5, SendRetryBase: 50 * time.Millisecond, SendRetryMax: time.Second,
		SendConcurrency: 4, PolicyCashback: "resend", PolicyCashbackReversed: "resend",
		Subscriber: sqstransport.SubscriberConfig{WaitTime: time.Second, RetryBase: 100 * time.Millisecond, ShutdownGrace: 5 * time.Second},
		Processor:  idempotent.ProcessorConfig{PollInterval: 50 * time.Millisecond},
		SenderPoll: 50 * time.Millisecond,
		Access:     testAccess,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	log := slog.New(slog.NewJSONHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.New(ctx, cfg, s.pool, s.sqs, nil, log)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s.app = a
	s.http = httptest.NewServer(a.Router)
	t.Cleanup(s.http.Close)
	done := make(chan error, 1)
	go func() { done <- service.Run(ctx, log, 0, a.Workers()...) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("workers: %v", err)
		}
		a.Close()
		if t.Failed() {
			t.Logf("service logs:\n%s", s.logs.String())
		}
	})
	return s
}

func (s *stack) send(e events.Envelope) {
	s.t.Helper()
	body, err := e.Marshal()
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := s.sqs.SendMessage(context.Background(), &sqs.SendMessageInput{
		QueueUrl: aws.String(s.queue), MessageBody: aws.String(string(body))}); err != nil {
		s.t.Fatal(err)
	}
}

func (s *stack) notifications(e events.Envelope) []api.Notification {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.http.URL+"/v1/notifications?event_id="+e.EventID.String(), nil)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+readKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("GET /v1/notifications: %s", resp.Status)
	}
	var body struct {
		Notifications []api.Notification `json:"notifications"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		s.t.Fatal(err)
	}
	return body.Notifications
}

func (s *stack) count(sql string, args ...any) int {
	s.t.Helper()
	var n int
	if err := s.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		s.t.Fatal(err)
	}
	return n
}

func (s *stack) queueEmpty(url string) bool { return testenv.QueueEmpty(s.t, s.sqs, url) }

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

func credited(t *testing.T) events.Envelope {
	t.Helper()
	e, err := events.New(contract.CashbackCredited, "pay_42", 1, map[string]any{
		"payment_id": "pay_42", "user_id": "u_17", "amount_paise": 2400, "rate_bp": 200, "recipient": "u_17"})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// Duplicates (three SQS copies of one event) record the intent once, and
// the SMS goes out once: PENDING → SENDING → SENT with key sms:<event_id>.
func TestIntentRecordedOnceAndSentOnce(t *testing.T) {
	t.Parallel()
	s := start(t, nil)
	e := credited(t)
	for range 3 {
		s.send(e)
	}
	eventually(t, 20*time.Second, "the notification SENT", func() bool {
		ns := s.notifications(e)
		return len(ns) == 1 && ns[0].Status == "SENT"
	})
	eventually(t, 10*time.Second, "every copy acked", func() bool { return s.queueEmpty(s.queue) })
	n := s.notifications(e)[0]
	key := "sms:" + e.EventID.String()
	ds := s.provider.Deliveries()
	if len(ds) != 1 || ds[0].IdempotencyKey != key || ds[0].Requests != 1 {
		t.Fatalf("provider deliveries = %+v; want one, under %s, one request", ds, key)
	}
	if n.IdempotencyKey != key || n.Channel != "sms" || n.Kind != compose.KindCashback || n.Attempts != 1 ||
		n.ProviderMessageID == nil || *n.ProviderMessageID != ds[0].MessageID || n.SentAt == nil ||
		!strings.Contains(n.Body, "₹24.00") || !strings.Contains(n.Body, "pay_42") {
		t.Errorf("notification = %+v; want SENT once with key %s and message id %s", n, key, ds[0].MessageID)
	}
	if got := s.count(`SELECT count(*) FROM notifications`); got != 1 {
		t.Errorf("notifications rows = %d, want 1", got)
	}
	if got := s.count(`SELECT count(*) FROM inbox WHERE consumer = 'notifications' AND status = 'DONE'`); got != 1 {
		t.Errorf("inbox DONE rows = %d, want 1", got)
	}
	// Applying the same event again in a transaction records nothing new.
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if recorded, err := intent.Record(ctx, slog.New(slog.DiscardHandler), tx, e); err != nil || recorded {
		t.Errorf("recording the intent again: recorded=%v err=%v; want a no-op", recorded, err)
	}
}

// The inbox processor's commit wakes the sender: with the sender's polling
// interval an hour long, a CashbackCredited that arrives after the sender
// went to sleep still ends SENT within seconds.
func TestProcessorCommitWakesTheSender(t *testing.T) {
	t.Parallel()
	s := start(t, func(c *app.Config) { c.SenderPoll = time.Hour })
	// Let the sender's first pass find nothing and go to sleep.
	time.Sleep(300 * time.Millisecond)
	e := credited(t)
	s.send(e)
	eventually(t, 5*time.Second, "the notification SENT although the sender polls hourly", func() bool {
		ns := s.notifications(e)
		return len(ns) == 1 && ns[0].Status == "SENT"
	})
	if ds := s.provider.Deliveries(); len(ds) != 1 || ds[0].Requests != 1 {
		t.Errorf("provider deliveries = %+v; want one, sent once", ds)
	}
}

// A reversal gets its own SMS, of its own kind.
func TestReversalNotified(t *testing.T) {
	t.Parallel()
	s := start(t, nil)
	c := credited(t)
	r, err := events.New(contract.CashbackReversed, "pay_42", 2, map[string]any{
		"payment_id": "pay_42", "user_id": "u_17", "amount_paise": 2400, "reason": "payment refunded"})
	if err != nil {
		t.Fatal(err)
	}
	// The reversal goes out only after the credit is recorded: SQS does
	// not keep order, and a credit that arrives after its reversal is
	// rightly not notified (intent.Record), which is another test's case.
	s.send(c)
	eventually(t, 20*time.Second, "the credit SENT", func() bool {
		return s.count(`SELECT count(*) FROM notifications WHERE status = 'SENT'`) == 1
	})
	s.send(r)
	eventually(t, 20*time.Second, "both SENT", func() bool {
		return s.count(`SELECT count(*) FROM notifications WHERE status = 'SENT'`) == 2
	})
	n := s.notifications(r)
	if len(n) != 1 || n[0].Kind != compose.KindCashbackReversed || !strings.Contains(n[0].Body, "reversed") {
		t.Errorf("reversal notification = %+v", n)
	}
	if len(s.provider.Deliveries()) != 2 {
		t.Errorf("deliveries = %d, want 2", len(s.provider.Deliveries()))
	}
}

// Provider failures: the inbox has acked the message long ago; the sender
// backs off in the row and gets it SENT.
func TestProviderFailuresThenSent(t *testing.T) {
	t.Parallel()
	s := start(t, nil)
	fails := 2
	s.provider.SetControl(smsprovider.Control{FailNext: &fails})
	e := credited(t)
	s.send(e)
	eventually(t, 20*time.Second, "SENT after the failures", func() bool {
		ns := s.notifications(e)
		return len(ns) == 1 && ns[0].Status == "SENT"
	})
	n := s.notifications(e)[0]
	if n.Attempts != 3 || n.LastError != nil {
		t.Errorf("notification = %+v; want 3 attempts, last_error cleared on success", n)
	}
	if d := s.provider.Deliveries(); len(d) != 1 || d[0].Requests != 3 {
		t.Errorf("deliveries = %+v; want one after 3 requests", d)
	}
}

// Events notifications cannot handle are parked in the DLQ at receive
// time; nothing enters the inbox.
func TestUnknownTypeParkedInDLQ(t *testing.T) {
	t.Parallel()
	s := start(t, nil)
	e, err := events.New(contract.PaymentSucceeded, "pay_42", 1, map[string]any{"payment_id": "pay_42", "user_id": "u_17"})
	if err != nil {
		t.Fatal(err)
	}
	s.send(e)
	var msgs []types.Message
	eventually(t, 20*time.Second, "the message in the DLQ", func() bool {
		out, err := s.sqs.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(s.dlq), WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, out.Messages...)
		return len(msgs) > 0
	})
	if r := aws.ToString(msgs[0].MessageAttributes["park_reason"].StringValue); !strings.Contains(r, `event type "PaymentSucceeded"`) {
		t.Errorf("park reason = %q", r)
	}
	if n := s.count(`SELECT count(*) FROM inbox`) + s.count(`SELECT count(*) FROM notifications`); n != 0 {
		t.Errorf("%d rows stored for a refused message", n)
	}
}

// SMS_PROVIDER_LOOKUP=false and SENDING_POLICY_CASHBACK=skip reach the sender.
func TestPolicyConfiguration(t *testing.T) {
	t.Parallel()
	s := start(t, func(c *app.Config) { c.SMSProviderLookup = false; c.PolicyCashback = "skip" })
	if s.app.Sender.CanLookup() {
		t.Error("SMS_PROVIDER_LOOKUP=false left lookup on")
	}
	if p := s.app.Sender.PolicyFor(compose.KindCashback); p != sender.PolicySkip {
		t.Errorf("policy for cashback = %s, want skip", p)
	}
	if p := s.app.Sender.PolicyFor(compose.KindCashbackReversed); p != sender.PolicyResend {
		t.Errorf("policy for cashback_reversed = %s, want resend", p)
	}
	if _, err := app.New(context.Background(), app.Config{PolicyCashback: "maybe", PolicyCashbackReversed: "resend", Port: "0", Access: testAccess}, nil, nil, nil, slog.Default()); err == nil {
		t.Error("an invalid SENDING_POLICY_CASHBACK was accepted")
	}
}

func TestConfigFromEnvironment(t *testing.T) {
	t.Setenv("NOTIFICATIONS_DATABASE_URL", "postgres://x/notifications")
	// The defaults, whatever the shell has (scripts/stack.sh with exports
	// SMS_PROVIDER_URL of the stack's own port, LISTEN_ADDR, dev keys).
	testenv.Unsetenv(t, "SMS_PROVIDER_URL", "LISTEN_ADDR")
	cfg, err := service.LoadConfig[app.Config]()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Port != "8083" || cfg.RewardsQueue != "rewards-events" || cfg.SMSProviderURL != "http://127.0.0.1:8090" ||
		!cfg.SMSProviderLookup || cfg.PolicyCashback != "resend" || cfg.SendingLease != time.Minute || cfg.DedupeRetention != 360*time.Hour {
		t.Errorf("defaults: %+v", cfg)
	}
	t.Setenv("NOTIFICATIONS_DATABASE_URL", "")
	if _, err := service.LoadConfig[app.Config](); err == nil || !strings.Contains(err.Error(), "NOTIFICATIONS_DATABASE_URL") {
		t.Errorf("missing NOTIFICATIONS_DATABASE_URL: %v", err)
	}
}
