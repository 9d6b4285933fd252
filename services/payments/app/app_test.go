package app

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/ports"
	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/contract"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// loadConfig is what service.Main does before it serves.
func loadConfig(args []string) (Config, error) { return service.Load[Config](args) }

// run is service.Main without the exit: the whole service in this process.
func run(ctx context.Context, cfg Config, log *slog.Logger) error {
	return service.Serve(ctx, "payments", cfg, log, DatabaseURL, Build)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const testAPIKey = "0123456789abcdef0123456789abcdef01"

func TestConfigErrorsAreClear(t *testing.T) {
	base := map[string]string{"PAYMENTS_DATABASE_URL": "postgres://postgres@127.0.0.1:5432/payments",
		"PAYMENTS_API_KEYS": "web:" + testAPIKey}
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string // substring of the error; "" = valid
	}{
		{"defaults", nil, nil, ""},
		{"role argument", nil, []string{"relay"}, ""},
		{"missing database url", map[string]string{"PAYMENTS_DATABASE_URL": ""}, nil, "PAYMENTS_DATABASE_URL"},
		{"bad role", map[string]string{"ROLE": "worker"}, nil, `ROLE (or the first argument) "worker"`},
		{"bad role argument", nil, []string{"serve"}, `"serve"`},
		{"relay disabled in relay role", map[string]string{"RELAY_ENABLED": "false"}, []string{"relay"}, "RELAY_ENABLED=false"},
		{"bad bool", map[string]string{"RELAY_ENABLED": "perhaps"}, nil, "RELAY_ENABLED"},
		{"bad port", map[string]string{"PORT": "http"}, nil, `PORT "http"`},
		{"bad stripe url", map[string]string{"STRIPE_URL": "127.0.0.1:12111"}, nil, "STRIPE_URL"},
		{"bad duration", map[string]string{"IDEMPOTENCY_LOCK_TIMEOUT": "soon"}, nil, "IDEMPOTENCY_LOCK_TIMEOUT"},
		{"stripe timeout over the lease", map[string]string{"STRIPE_TIMEOUT": "1m"}, nil, "STRIPE_TIMEOUT (1m0s) must be below"},
		{"keys kept past Stripe's", map[string]string{"IDEMPOTENCY_KEY_TTL": "48h"}, nil, "IDEMPOTENCY_KEY_TTL (48h0m0s) must be at most 24h"},
		{"keys kept as long as Stripe's", map[string]string{"IDEMPOTENCY_KEY_TTL": "24h"}, nil, ""},
		{"no API keys for the API", map[string]string{"PAYMENTS_API_KEYS": ""}, nil, "PAYMENTS_API_KEYS is empty"},
		{"no API keys needed by the relay", map[string]string{"PAYMENTS_API_KEYS": ""}, []string{"relay"}, ""},
		{"short API key", map[string]string{"PAYMENTS_API_KEYS": "web:short"}, nil, "key shorter than 32 bytes"},
		{"API key without a client name", map[string]string{"PAYMENTS_API_KEYS": testAPIKey}, nil, "want name[/role+role]:key"},
		{"a client twice", map[string]string{"PAYMENTS_API_KEYS": "web:" + testAPIKey + ",web:" + testAPIKey + "2"}, nil, `client "web" listed twice`},
		{"mock fixtures with a live key", map[string]string{"STRIPE_MOCK_FIXTURES": "true", "STRIPE_API_KEY": "sk_live_abc"}, nil, "STRIPE_MOCK_FIXTURES=true with a live Stripe key"},
		{"zero rate limit", map[string]string{"PAYMENTS_RATE_LIMIT": "0"}, nil, "PAYMENTS_RATE_LIMIT"},
		{"two clients with one key", map[string]string{"PAYMENTS_API_KEYS": "web:" + testAPIKey + ",ops:" + testAPIKey}, nil, "clients web and ops have the same key"},
		{"a client without the role pay", map[string]string{"PAYMENTS_API_KEYS": "web/read:" + testAPIKey}, nil, "no client has the role pay"},
		{"an unknown role", map[string]string{"PAYMENTS_API_KEYS": "web/root:" + testAPIKey}, nil, `role "root"`},
		{"a host in PORT and in LISTEN_ADDR", map[string]string{"PORT": "0.0.0.0:8081", "LISTEN_ADDR": "127.0.0.1"}, nil, "LISTEN_ADDR"},
		{"a negative relay batch", map[string]string{"RELAY_BATCH_SIZE": "-1"}, nil, "RELAY_BATCH_SIZE=-1: want 1..10000, or unset for the default"},
		{"a relay lease under a second", map[string]string{"RELAY_LEASE": "200ms"}, []string{"relay"}, "RELAY_LEASE=200ms"},
		{"a pool of no connections", map[string]string{"DB_MAX_CONNS": "0"}, nil, "DB_MAX_CONNS=0: want at least 1"},
		{"no write deadline", map[string]string{"HTTP_WRITE_TIMEOUT": "0s"}, nil, "HTTP_WRITE_TIMEOUT=0s"},
		{"the e2e relay's tuning", map[string]string{"RELAY_LEASE": "2s", "RELAY_POLL_INTERVAL": "100ms"}, []string{"relay"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range base {
				t.Setenv(k, v)
			}
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			cfg, err := loadConfig(c.args)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case c.want != "" && err == nil:
				t.Fatalf("no error, want one mentioning %q", c.want)
			case c.want != "" && !strings.Contains(err.Error(), c.want):
				t.Fatalf("error %q does not mention %q", err, c.want)
			}
			if c.name == "defaults" && (cfg.Port != "8081" || cfg.Role != "all" || !cfg.RelayEnabled ||
				cfg.Queue != "payments-events" || cfg.StripeAPIKey != "sk_test_123" || cfg.LockTimeout != time.Minute) {
				t.Errorf("defaults %+v", cfg)
			}
		})
	}
}

// stack is what the service needs: a database, stripe-mock and a queue.
type stack struct {
	dbURL    string
	pool     *pgxpool.Pool
	sqs      *sqs.Client
	queueURL string
	stripe   string
}

func newStack(t *testing.T) *stack {
	t.Helper()
	dbURL := testenv.DatabaseURL(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	client := testenv.SQS(t) // also points AWS_ENDPOINT_URL at the test server
	q, _ := testenv.Queue(t, client, 5, 30*time.Second)
	return &stack{dbURL: dbURL, pool: pool, sqs: client, queueURL: q, stripe: testenv.StripeMock(t)}
}

func (s *stack) config(t *testing.T, role string) Config {
	t.Helper()
	return Config{
		DatabaseURL: s.dbURL, Port: strconv.Itoa(freePort(t)), Role: role, RelayEnabled: true,
		Queue: path.Base(s.queueURL), StripeURL: s.stripe, StripeAPIKey: "sk_test_123",
		StripePaymentMethod: "pm_card_visa", StripeTimeout: 5 * time.Second, StripeMockFixtures: true, LockTimeout: time.Minute,
		KeyTTL: 24 * time.Hour, StartupWait: 20 * time.Second,
		Access: service.AccessEnv{APIKeys: "web:" + testAPIKey, RateLimit: 1000, AddressRateLimit: 1000, RateWindow: time.Second},
	}
}

// start runs the service in this process until the test ends (or stop is
// called), and waits until it is ready.
func start(t *testing.T, cfg Config) (base string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, quiet) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s role stopped with %v", cfg.Role, err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s role did not stop within 20s", cfg.Role)
		}
	}
	t.Cleanup(stop)
	base = "http://127.0.0.1:" + cfg.Port
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base, stop
			}
		}
		select {
		case err := <-done:
			t.Fatalf("%s role exited on start: %v", cfg.Role, err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s role not ready after 30s: %v", cfg.Role, err)
		}
	}
}

func createPayment(t *testing.T, base, key string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/payments",
		strings.NewReader(`{"user_id":"u_17","amount_paise":120000,"currency":"INR","method":"upi"}`))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", "Bearer "+testAPIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p struct {
		ID string `json:"id"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &p) != nil || p.ID == "" {
		t.Fatalf("create payment: status %d, body %s", resp.StatusCode, b)
	}
	return p.ID
}

// receive long-polls the queue until a message arrives or wait passes.
func (s *stack) receive(t *testing.T, wait time.Duration) []types.Message {
	t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		secs := int32(min(2, max(1, time.Until(deadline)/time.Second)))
		out, err := s.sqs.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(s.queueURL), MaxNumberOfMessages: 10, WaitTimeSeconds: secs,
			MessageAttributeNames: []string{"All"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) > 0 {
			return out.Messages
		}
	}
	return nil
}

func (s *stack) assertPublished(t *testing.T, m types.Message, paymentID string) {
	t.Helper()
	e, err := events.Decode([]byte(aws.ToString(m.Body)))
	if err != nil {
		t.Fatalf("body does not decode: %v\n%s", err, aws.ToString(m.Body))
	}
	if e.EventType != contract.PaymentSucceeded || e.AggregateID != paymentID || e.AggregateVersion != 1 {
		t.Errorf("envelope %+v", e)
	}
	var payload map[string]any
	if err := json.Unmarshal(e.Payload, &payload); err != nil {
		t.Fatal(err)
	}
	if payload["payment_id"] != paymentID || payload["user_id"] != "u_17" || payload["amount_paise"] != float64(120000) ||
		payload["currency"] != "INR" || payload["status"] != "SUCCEEDED" {
		t.Errorf("payload %v", payload)
	}
	attr := func(name string) string { return aws.ToString(m.MessageAttributes[name].StringValue) }
	if attr("event_id") != e.EventID.String() || attr("event_type") != contract.PaymentSucceeded {
		t.Errorf("attributes event_id=%q event_type=%q, want %s %s", attr("event_id"), attr("event_type"), e.EventID, contract.PaymentSucceeded)
	}
	// The event id is the outbox row's, and the row is marked published.
	var published bool
	if err := s.pool.QueryRow(context.Background(), `SELECT published_at IS NOT NULL FROM outbox WHERE id = $1`, e.EventID).Scan(&published); err != nil {
		t.Fatalf("outbox row %s: %v", e.EventID, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !published && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		_ = s.pool.QueryRow(context.Background(), `SELECT published_at IS NOT NULL FROM outbox WHERE id = $1`, e.EventID).Scan(&published)
	}
	if !published {
		t.Errorf("outbox row %s not marked published", e.EventID)
	}
}

// The whole service (ROLE=all): a payment made over HTTP is published to
// the queue by the relay, as an envelope events.Decode accepts.
func TestServicePublishesPaymentSucceeded(t *testing.T) {
	s := newStack(t)
	base, _ := start(t, s.config(t, "all"))
	for _, ep := range []string{"/healthz", "/metrics"} {
		resp, err := http.Get(base + ep)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %v %v", ep, err, resp)
		}
		if resp != nil {
			resp.Body.Close()
		}
	}
	id := createPayment(t, base, "k-1")
	msgs := s.receive(t, 20*time.Second)
	if len(msgs) != 1 {
		t.Fatalf("%d messages on the queue, want 1", len(msgs))
	}
	s.assertPublished(t, msgs[0], id)
}

// ROLE=api alone publishes nothing (the event waits in the outbox); a
// separate ROLE=relay process then publishes it, and can be stopped and
// restarted on its own.
func TestRelayRunsAsItsOwnRole(t *testing.T) {
	s := newStack(t)
	base, _ := start(t, s.config(t, "api"))
	id := createPayment(t, base, "k-1")
	if msgs := s.receive(t, 2*time.Second); len(msgs) != 0 {
		t.Fatalf("the api role published %d messages", len(msgs))
	}
	var waiting int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&waiting); err != nil || waiting != 1 {
		t.Fatalf("%d unpublished outbox rows (%v), want 1", waiting, err)
	}

	_, stopRelay := start(t, s.config(t, "relay"))
	msgs := s.receive(t, 20*time.Second)
	if len(msgs) != 1 {
		t.Fatalf("%d messages on the queue, want 1", len(msgs))
	}
	s.assertPublished(t, msgs[0], id)
	stopRelay()

	// With the relay gone, a new payment waits; a new relay publishes it.
	id2 := createPayment(t, base, "k-2")
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE published_at IS NULL AND aggregate_id = $1`, id2).Scan(&waiting); err != nil || waiting != 1 {
		t.Fatalf("payment %s: %d unpublished rows (%v), want 1", id2, waiting, err)
	}
	start(t, s.config(t, "relay"))
	var got []types.Message
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range s.receive(t, 2*time.Second) {
			if strings.Contains(aws.ToString(m.Body), id2) {
				got = append(got, m)
			}
		}
		if len(got) > 0 {
			break
		}
	}
	if len(got) != 1 {
		t.Fatalf("%d messages for %s, want 1", len(got), id2)
	}
	s.assertPublished(t, got[0], id2)
}

func TestMigrateRoleAppliesTheSchemaAndExits(t *testing.T) {
	dbURL := testenv.DatabaseURL(t)
	cfg := Config{DatabaseURL: dbURL, Role: "migrate", Port: "0", StartupWait: 10 * time.Second}
	if err := run(context.Background(), cfg, quiet); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, table := range []string{"payments", "idempotency_keys", "outbox"} {
		var exists bool
		if err := pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || !exists {
			t.Errorf("table %s missing after migrate (%v)", table, err)
		}
	}
}

// freePort is a port free now, outside the kernel's ephemeral range, so
// no test's outgoing connection or httptest server takes it before the
// service binds it.
func freePort(t *testing.T) int {
	t.Helper()
	p, err := ports.Free()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The start-up summary names every setting and shows no secret.
func TestConfigSummaryMasksTheAPIKeysTheStripeKeyAndTheDatabasePassword(t *testing.T) {
	testenv.Unsetenv(t, "STRIPE_MOCK_FIXTURES", "LISTEN_ADDR")
	t.Setenv("PAYMENTS_DATABASE_URL", "postgres://app:hunter2@db:5432/payments")
	t.Setenv("PAYMENTS_API_KEYS", "web:"+testAPIKey)
	t.Setenv("STRIPE_API_KEY", "sk_live_0123456789")
	cfg, err := loadConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	service.LogConfig(slog.New(slog.NewJSONHandler(&buf, nil)), cfg)
	out := buf.String()
	for _, secret := range []string{testAPIKey, "sk_live_0123456789", "hunter2"} {
		if strings.Contains(out, secret) {
			t.Errorf("config summary shows %q: %s", secret, out)
		}
	}
	for _, name := range []string{"PAYMENTS_API_KEYS", "STRIPE_API_KEY", "PAYMENTS_RATE_LIMIT", "RELAY_LEASE"} {
		if !strings.Contains(out, `"`+name+`"`) {
			t.Errorf("config summary lacks %s: %s", name, out)
		}
	}
}
