package sender_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/failpoint"
	"github.com/effectively-once/payments-cashback/pkg/migrate"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/contract"
	"github.com/effectively-once/payments-cashback/services/notifications/intent"
	"github.com/effectively-once/payments-cashback/services/notifications/intent/compose"
	"github.com/effectively-once/payments-cashback/services/notifications/migrations"
	"github.com/effectively-once/payments-cashback/services/notifications/sender"
	"github.com/effectively-once/payments-cashback/services/notifications/sms"
	"github.com/effectively-once/payments-cashback/services/notifications/smsprovider"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// env is a notifications database and a dev provider.
type env struct {
	t        *testing.T
	pool     *pgxpool.Pool
	provider *smsprovider.Server
	client   *sms.HTTPProvider
	url      string
	payments int // intents recorded, each for a payment of its own
}

func setup(t *testing.T) *env {
	t.Helper()
	pool := testenv.DB(t)
	if err := migrate.Up(context.Background(), pool, migrations.FS, migrations.VersionTable); err != nil {
		t.Fatal(err)
	}
	p := smsprovider.New()
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return &env{t: t, pool: pool, provider: p, client: sms.NewHTTPProvider(srv.URL, "", 200*time.Millisecond), url: srv.URL}
}

// fast is a sender config with test-sized timings: calls time out after
// 200ms, a SENDING row is stale after 400ms, retries wait ~50ms.
func fast() sender.Config {
	return sender.Config{SendTimeout: 200 * time.Millisecond, Lease: 400 * time.Millisecond,
		RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond, MaxAttempts: 5}
}

func (e *env) sender(p sms.Provider, cfg sender.Config) *sender.Sender {
	e.t.Helper()
	s, err := sender.New(e.pool, p, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// intent records the SMS intent of a fresh CashbackCredited, of a payment
// of its own, and returns it.
func (e *env) intent() events.Envelope {
	e.t.Helper()
	e.payments++
	pay := fmt.Sprintf("pay_%d", e.payments)
	ev, err := events.New(contract.CashbackCredited, pay, 1, map[string]any{
		"payment_id": pay, "user_id": "u_17", "amount_paise": 2400, "rate_bp": 200, "recipient": "+919800000017"})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if ok, err := intent.Record(ctx, slog.New(slog.DiscardHandler), tx, ev); err != nil || !ok {
		e.t.Fatalf("record: %v %v", ok, err)
	}
	if err := tx.Commit(ctx); err != nil {
		e.t.Fatal(err)
	}
	return ev
}

// intents records n fresh intents, in order.
func (e *env) intents(n int) []events.Envelope {
	e.t.Helper()
	evs := make([]events.Envelope, n)
	for i := range evs {
		evs[i] = e.intent()
	}
	return evs
}

type state struct {
	Status, Key  string
	MessageID    *string
	Attempts     int
	Reason, Last *string
	NextAttempt  time.Time
}

func (e *env) row(ev events.Envelope) state {
	e.t.Helper()
	var s state
	err := e.pool.QueryRow(context.Background(), `SELECT status, idempotency_key, provider_message_id, attempts,
		failure_reason, last_error, next_attempt_at FROM notifications WHERE event_id = $1 AND channel = 'sms'`, ev.EventID).
		Scan(&s.Status, &s.Key, &s.MessageID, &s.Attempts, &s.Reason, &s.Last, &s.NextAttempt)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

func (e *env) delivery(key string) (smsprovider.Delivery, bool) {
	for _, d := range e.provider.Deliveries() {
		if d.IdempotencyKey == key {
			return d, true
		}
	}
	return smsprovider.Delivery{}, false
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// observer is a provider that records the row's committed status, read on
// another connection, at the moment the provider is called.
type observer struct {
	sms.Provider
	pool *pgxpool.Pool
	mu   sync.Mutex
	seen []string
}

func (o *observer) Send(ctx context.Context, m sms.Message) (sms.Receipt, error) {
	var status string
	if err := o.pool.QueryRow(ctx, `SELECT status FROM notifications WHERE idempotency_key = $1`, m.IdempotencyKey).Scan(&status); err != nil {
		return sms.Receipt{}, err
	}
	o.mu.Lock()
	o.seen = append(o.seen, status)
	o.mu.Unlock()
	return o.Provider.Send(ctx, m)
}

// PENDING → SENDING (committed before the call) → SENT with the provider's
// message id, key sms:<event_id>, one delivery.
func TestPendingSendingSent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ev := e.intent()
	if r := e.row(ev); r.Status != "PENDING" || r.Key != "sms:"+ev.EventID.String() {
		t.Fatalf("recorded %+v; want PENDING with key sms:%s", r, ev.EventID)
	}
	obs := &observer{Provider: e.client, pool: e.pool}
	s := e.sender(obs, fast())
	if n, err := s.SendOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("SendOnce = %d, %v", n, err)
	}
	if len(obs.seen) != 1 || obs.seen[0] != "SENDING" {
		t.Errorf("status seen by another session during the call: %v, want SENDING (committed first)", obs.seen)
	}
	r := e.row(ev)
	d, ok := e.delivery("sms:" + ev.EventID.String())
	if !ok || d.Requests != 1 || d.To != "+919800000017" || !strings.Contains(d.Body, "₹24.00") {
		t.Fatalf("provider delivery = %+v (found %v); want one request to the recipient about ₹24.00", d, ok)
	}
	if r.Status != "SENT" || deref(r.MessageID) != d.MessageID || r.Attempts != 1 {
		t.Errorf("row = %+v; want SENT with message id %s after 1 attempt", r, d.MessageID)
	}
	// Nothing more to do.
	if n, _ := s.SendOnce(context.Background()); n != 0 {
		t.Errorf("a SENT row was claimed again")
	}
}

// crash leaves ev's row SENDING after the provider accepted it, as a
// sender killed at failpoint in-sending would.
func (e *env) crash(s *sender.Sender, ev events.Envelope) {
	e.t.Helper()
	disable := failpoint.Enable(sender.InSending, 1)
	defer disable()
	if _, err := s.SendOnce(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	if r := e.row(ev); r.Status != "SENDING" {
		e.t.Fatalf("after the crash the row is %s, want SENDING", r.Status)
	}
	if d, ok := e.delivery("sms:" + ev.EventID.String()); !ok || d.Requests != 1 {
		e.t.Fatalf("provider should have accepted the message once before the crash: %+v", d)
	}
}

// reconcile runs the reconciler once the lease has run out.
func reconcile(t *testing.T, s *sender.Sender) {
	t.Helper()
	if n, _ := s.ReconcileOnce(context.Background()); n != 0 {
		t.Fatal("a row was reconciled before its lease ran out")
	}
	time.Sleep(450 * time.Millisecond)
	if n, err := s.ReconcileOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("ReconcileOnce = %d, %v; want the stuck row", n, err)
	}
}

// Crash in SENDING, provider with lookup: the reconciler finds the message
// at the provider and marks it SENT, without a second send.
func TestCrashInSendingReconciledByLookup(t *testing.T) {
	e := setup(t)
	ev := e.intent()
	e.crash(e.sender(e.client, fast()), ev)
	s := e.sender(e.client, fast()) // the restarted sender
	if !s.CanLookup() {
		t.Fatal("the HTTP provider should offer lookup")
	}
	reconcile(t, s)
	d, _ := e.delivery("sms:" + ev.EventID.String())
	if r := e.row(ev); r.Status != "SENT" || deref(r.MessageID) != d.MessageID || r.Attempts != 1 {
		t.Errorf("row = %+v; want SENT with %s, still 1 attempt", r, d.MessageID)
	}
	if d.Requests != 1 {
		t.Errorf("provider saw %d requests for the key, want 1 (no resend)", d.Requests)
	}
}

// Crash in SENDING, provider without lookup, policy resend: sent again with
// the same key; the provider sees the key twice and delivers once.
func TestCrashInSendingNoLookupResend(t *testing.T) {
	e := setup(t)
	ev := e.intent()
	noLookup := sms.WithoutLookup(e.client)
	e.crash(e.sender(noLookup, fast()), ev)
	cfg := fast()
	cfg.Policies = map[string]sender.Policy{compose.KindCashback: sender.PolicyResend}
	s := e.sender(noLookup, cfg)
	if s.CanLookup() {
		t.Fatal("WithoutLookup should hide lookup")
	}
	reconcile(t, s)
	if r := e.row(ev); r.Status != "PENDING" {
		t.Fatalf("after reconcile: %s, want PENDING (to resend)", r.Status)
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.row(ev).Status != "SENT" && time.Now().Before(deadline) {
		if _, err := s.SendOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	d, _ := e.delivery("sms:" + ev.EventID.String())
	r := e.row(ev)
	if r.Status != "SENT" || deref(r.MessageID) != d.MessageID || r.Attempts != 2 {
		t.Errorf("row = %+v; want SENT with the original message id %s after 2 attempts", r, d.MessageID)
	}
	if d.Requests != 2 || len(e.provider.Deliveries()) != 1 {
		t.Errorf("provider: %d requests for the key, %d deliveries; want 2 and 1", d.Requests, len(e.provider.Deliveries()))
	}
}

// Crash in SENDING, provider without lookup, policy skip: FAILED "unknown
// outcome", never sent again.
func TestCrashInSendingNoLookupSkip(t *testing.T) {
	e := setup(t)
	ev := e.intent()
	noLookup := sms.WithoutLookup(e.client)
	e.crash(e.sender(noLookup, fast()), ev)
	cfg := fast()
	cfg.Policies = map[string]sender.Policy{compose.KindCashback: sender.PolicySkip}
	s := e.sender(noLookup, cfg)
	reconcile(t, s)
	if r := e.row(ev); r.Status != "FAILED" || deref(r.Reason) != sender.ReasonUnknownOutcome {
		t.Errorf("row = %+v; want FAILED with reason %q", r, sender.ReasonUnknownOutcome)
	}
	if n, _ := s.SendOnce(context.Background()); n != 0 {
		t.Error("a FAILED row was claimed")
	}
	if d, _ := e.delivery("sms:" + ev.EventID.String()); d.Requests != 1 {
		t.Errorf("provider saw %d requests, want 1", d.Requests)
	}
}

// Provider failures back off in the row (next_attempt_at), then SENT.
func TestProviderFailuresBackOffThenSent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ev := e.intent()
	e.provider.SetControl(smsprovider.Control{FailNext: ptr(2)})
	cfg := fast()
	cfg.RetryBase, cfg.RetryMax = 300*time.Millisecond, time.Second
	s := e.sender(e.client, cfg)
	ctx := context.Background()
	if _, err := s.SendOnce(ctx); err != nil {
		t.Fatal(err)
	}
	r := e.row(ev)
	if r.Status != "PENDING" || r.Attempts != 1 || !strings.Contains(deref(r.Last), "503") || !r.NextAttempt.After(time.Now().Add(100*time.Millisecond)) {
		t.Fatalf("after a 503: %+v; want PENDING, 1 attempt, the error kept, next attempt ≥ 100ms away", r)
	}
	if n, _ := s.SendOnce(ctx); n != 0 {
		t.Error("the row was claimed again before its backoff")
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.row(ev).Status != "SENT" && time.Now().Before(deadline) {
		if _, err := s.SendOnce(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r = e.row(ev)
	d, _ := e.delivery("sms:" + ev.EventID.String())
	if r.Status != "SENT" || r.Attempts != 3 || deref(r.MessageID) != d.MessageID || d.Requests != 3 {
		t.Errorf("row = %+v, delivery = %+v; want SENT after 3 attempts, one delivery", r, d)
	}
}

// Past MaxAttempts the row is FAILED, observably.
func TestAttemptsExhaustedFails(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ev := e.intent()
	e.provider.SetControl(smsprovider.Control{FailNext: ptr(100)})
	cfg := fast()
	cfg.MaxAttempts, cfg.RetryBase, cfg.RetryMax = 3, time.Millisecond, time.Millisecond
	s := e.sender(e.client, cfg)
	for range 20 {
		s.SendOnce(context.Background())
		time.Sleep(10 * time.Millisecond)
	}
	if r := e.row(ev); r.Status != "FAILED" || r.Attempts != 3 || deref(r.Reason) != "gave up after 3 attempts" {
		t.Errorf("row = %+v; want FAILED after 3 attempts", r)
	}
	if e.provider.Requests("sms:"+ev.EventID.String()) != 3 {
		t.Errorf("provider saw %d requests, want 3", e.provider.Requests("sms:"+ev.EventID.String()))
	}
}

// A rejection (4xx) fails at once: retrying cannot help.
func TestRejectedFailsAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ev := e.intent()
	e.provider.SetControl(smsprovider.Control{FailNext: ptr(1), FailStatus: ptr(400)})
	s := e.sender(e.client, fast())
	s.SendOnce(context.Background())
	if r := e.row(ev); r.Status != "FAILED" || !strings.HasPrefix(deref(r.Reason), "rejected by provider") || r.Attempts != 1 {
		t.Errorf("row = %+v; want FAILED (rejected) after 1 attempt", r)
	}
}

// The provider accepts, then hangs: the call times out (outcome unknown),
// the lookup finds the message, SENT without a second delivery.
func TestProviderHangsAfterAccept(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ev := e.intent()
	e.provider.SetControl(smsprovider.Control{HangMS: ptr(1500), HangAfterAccept: ptr(true)})
	s := e.sender(e.client, fast())
	start := time.Now()
	if _, err := s.SendOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("a hanging provider held the sender %v; the send timeout is 200ms", el)
	}
	d, _ := e.delivery("sms:" + ev.EventID.String())
	if r := e.row(ev); r.Status != "SENT" || deref(r.MessageID) != d.MessageID || d.Requests != 1 {
		t.Errorf("row = %+v, delivery %+v; want SENT via lookup, one request", r, d)
	}
}

// The provider hangs before accepting, without lookup, policy skip: the
// timed-out call is an unknown outcome and the row FAILS rather than risk
// a second delivery.
func TestProviderHangsNoLookupSkip(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ev := e.intent()
	e.provider.SetControl(smsprovider.Control{HangMS: ptr(400)})
	cfg := fast()
	cfg.Policies = map[string]sender.Policy{compose.KindCashback: sender.PolicySkip}
	s := e.sender(sms.WithoutLookup(e.client), cfg)
	s.SendOnce(context.Background())
	if r := e.row(ev); r.Status != "FAILED" || deref(r.Reason) != sender.ReasonUnknownOutcome {
		t.Errorf("row = %+v; want FAILED %q", r, sender.ReasonUnknownOutcome)
	}
}

// Several senders on one table: every message is claimed by one of them
// and delivered once.
func TestConcurrentSendersDeliverOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	evs := e.intents(30)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 3 {
		cfg := fast()
		cfg.PollInterval = 10 * time.Millisecond
		// 30 rows over 3 senders on a loaded machine: fast()'s 200 ms a
		// send can run out before the provider accepts, and the resend
		// then looks like the double send this test is about.
		cfg.SendTimeout, cfg.Lease = time.Second, 5*time.Second
		s := e.sender(sms.NewHTTPProvider(e.url, "", time.Second), cfg)
		wg.Go(func() { _ = s.Run(ctx) })
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM notifications WHERE status = 'SENT'`).Scan(&n)
		if n == len(evs) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	for _, ev := range evs {
		if r := e.row(ev); r.Status != "SENT" || r.Attempts != 1 {
			t.Errorf("%s: %+v; want SENT after 1 attempt", ev.EventID, r)
		}
	}
	for _, d := range e.provider.Deliveries() {
		if d.Requests != 1 {
			t.Errorf("key %s sent %d times", d.IdempotencyKey, d.Requests)
		}
	}
	if got := len(e.provider.Deliveries()); got != len(evs) {
		t.Errorf("%d deliveries, want %d", got, len(evs))
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := sender.New(e.pool, e.client, sender.Config{SendTimeout: time.Second, Lease: time.Second}); err == nil {
		t.Error("a lease shorter than twice the send timeout was accepted")
	}
	if _, err := sender.New(e.pool, e.client, sender.Config{Policies: map[string]sender.Policy{"cashback": "maybe"}}); err == nil {
		t.Error("an unknown policy was accepted")
	}
	if _, err := sender.ParsePolicy("resend"); err != nil {
		t.Error(err)
	}
}

func ptr[T any](v T) *T { return &v }

// Logs carry the recipient masked, never the whole number.
func TestLogsMaskTheRecipientsPhoneNumber(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.intent()
	var logs testenv.Buffer
	cfg := fast()
	cfg.Logger = slog.New(service.NewContextHandler(&logs, slog.LevelDebug))
	s := e.sender(e.client, cfg)
	if n, err := s.SendOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("SendOnce = %d, %v", n, err)
	}
	out := logs.String()
	if !strings.Contains(out, "notification SENT") || !strings.Contains(out, `"to":"+91******0017"`) {
		t.Errorf("no SENT line with the masked recipient in:\n%s", out)
	}
	if strings.Contains(out, "919800000017") {
		t.Errorf("the full phone number is in the logs:\n%s", out)
	}
}

// A provider's answer often repeats the number it was sent to: a 400
// "invalid destination +91…", or a 201 in a schema the client cannot read.
// That text reaches the logs and the row (last_error, failure_reason)
// through the call's error, so it must carry the number masked as the
// recipient is ("+91******0017"), never whole: the status and the rest of
// the answer stay, for whoever reads the log.
func TestAProviderAnswerRepeatingThePhoneNumberReachesLogsAndRowsMasked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   string // in the log and the row, besides the masked number
	}{
		{"rejected", http.StatusBadRequest, `{"error":"invalid destination +919800000017"}`, "400 Bad Request"},
		{"accepted, unreadable", http.StatusCreated, `{"id":"m1","to":"+919800000017","status":"queued"}`, "accepted with an unreadable answer"},
		{"bare number", http.StatusBadRequest, `{"error":"919800000017 is not reachable"}`, "is not reachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			}))
			t.Cleanup(srv.Close)
			var logs testenv.Buffer
			cfg := fast()
			cfg.Logger = slog.New(service.NewContextHandler(&logs, slog.LevelDebug))
			s := e.sender(sms.WithoutLookup(sms.NewHTTPProvider(srv.URL, "", cfg.SendTimeout)), cfg)
			ev := e.intent()
			if n, err := s.SendOnce(context.Background()); err != nil || n != 1 {
				t.Fatalf("SendOnce = %d, %v", n, err)
			}
			r := e.row(ev)
			for what, text := range map[string]string{"log": logs.String(), "last_error": deref(r.Last), "failure_reason": deref(r.Reason)} {
				if strings.Contains(text, "9800000017") {
					t.Errorf("%s holds the full phone number: %s", what, text)
				}
			}
			for what, text := range map[string]string{"log": logs.String(), "last_error": deref(r.Last)} {
				if !strings.Contains(text, tc.want) || !strings.Contains(text, "******0017") {
					t.Errorf("%s lacks %q or the masked number: %s", what, tc.want, text)
				}
			}
		})
	}
}

// acceptThenFail is a provider front that passes each send to the dev
// provider (which stores and delivers it) and then answers 500 anyway, as a
// provider that fails after accepting does; lookups pass through.
func (e *env) acceptThenFail() *sms.HTTPProvider {
	e.t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/messages" {
			e.provider.ServeHTTP(httptest.NewRecorder(), r)
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		e.provider.ServeHTTP(w, r)
	}))
	e.t.Cleanup(srv.Close)
	return sms.NewHTTPProvider(srv.URL, "", 200*time.Millisecond)
}

// A 5xx does not say the message was not accepted: it is an unknown outcome,
// resolved like a timeout. With lookup the accepted message is found and the
// row SENT without a second send; without lookup the kind's policy decides,
// and policy skip fails the row rather than risk a second delivery.
func TestProvider5xxIsAnUnknownOutcome(t *testing.T) {
	t.Parallel()
	t.Run("lookup finds it", func(t *testing.T) {
		e := setup(t)
		ev := e.intent()
		s := e.sender(e.acceptThenFail(), fast())
		if _, err := s.SendOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		d, _ := e.delivery("sms:" + ev.EventID.String())
		if r := e.row(ev); r.Status != "SENT" || deref(r.MessageID) != d.MessageID || d.Requests != 1 {
			t.Errorf("row = %+v, delivery %+v; want SENT via lookup after one request", r, d)
		}
	})
	t.Run("no lookup, policy skip", func(t *testing.T) {
		e := setup(t)
		ev := e.intent()
		cfg := fast()
		cfg.Policies = map[string]sender.Policy{compose.KindCashback: sender.PolicySkip}
		s := e.sender(sms.WithoutLookup(e.acceptThenFail()), cfg)
		for range 3 {
			if _, err := s.SendOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			time.Sleep(cfg.RetryMax)
		}
		if r := e.row(ev); r.Status != "FAILED" || deref(r.Reason) != sender.ReasonUnknownOutcome {
			t.Errorf("row = %+v; want FAILED %q", r, sender.ReasonUnknownOutcome)
		}
		if n := e.provider.Requests("sms:" + ev.EventID.String()); n != 1 {
			t.Errorf("provider saw %d send requests, want 1", n)
		}
	})
}

// A provider that ignores idempotency keys reads a send (and delivers it),
// then drops the reused keep-alive connection without answering. Under
// policy skip ("maybe never delivered, never twice") that must cost one
// provider request and end FAILED "unknown outcome": the sender alone
// decides on resends. net/http would otherwise replay the POST on a fresh
// connection by itself, since it carries an Idempotency-Key header, and
// the key-ignoring provider would deliver the SMS twice, recorded SENT.
func TestSkipPolicySendsOnceWhenTheProviderDropsTheConnectionAfterAccepting(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var mu sync.Mutex
	requests := map[string]int{} // per key: what a key-ignoring provider delivers
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		requests[key]++
		n, keys := requests[key], len(requests)
		mu.Unlock()
		if keys == 2 && n == 1 {
			// The second message's first request: read in full, then the
			// connection is dropped before any answer.
			c, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			c.Close()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"message_id":"m_`+key+`"}`)
	}))
	t.Cleanup(srv.Close)

	cfg := fast()
	cfg.Policies = map[string]sender.Policy{compose.KindCashback: sender.PolicySkip}
	s := e.sender(sms.WithoutLookup(sms.NewHTTPProvider(srv.URL, "", cfg.SendTimeout)), cfg)
	ctx := context.Background()
	first := e.intent()
	if _, err := s.SendOnce(ctx); err != nil { // opens the keep-alive connection
		t.Fatal(err)
	}
	second := e.intent()
	if _, err := s.SendOnce(ctx); err != nil { // reuses it, and the provider drops it
		t.Fatal(err)
	}
	mu.Lock()
	n := requests["sms:"+second.EventID.String()]
	mu.Unlock()
	if n != 1 {
		t.Errorf("the provider received the second SMS %d times under policy skip; want 1", n)
	}
	if r := e.row(first); r.Status != "SENT" {
		t.Errorf("first row = %+v; want SENT", r)
	}
	if r := e.row(second); r.Status != "FAILED" || deref(r.Reason) != sender.ReasonUnknownOutcome || r.Attempts != 1 {
		t.Errorf("second row = %+v (reason %s); want FAILED %q after 1 attempt", r, deref(r.Reason), sender.ReasonUnknownOutcome)
	}
}
