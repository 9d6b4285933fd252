package api_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/failpoint"
	"github.com/effectively-once/payments-cashback/pkg/httpidem"
	"github.com/effectively-once/payments-cashback/services/contract"
	"github.com/effectively-once/payments-cashback/services/payments/api"
	"github.com/effectively-once/payments-cashback/services/payments/store"
)

func TestCreatePaymentCommitsPaymentOutboxAndOneCharge(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	r := e.create("k-1", validBody)
	if r.status != http.StatusCreated {
		t.Fatalf("status %d, body %s", r.status, r.body)
	}
	if r.header.Get("Idempotent-Replayed") != "" {
		t.Error("a first response is marked as replayed")
	}
	p := r.payment(t)
	if !strings.HasPrefix(p.ID, "pay_") || p.UserID != "u_17" || p.AmountPaise != 120000 || p.Currency != "INR" ||
		p.Method != "upi" || p.Status != store.StatusSucceeded || p.Version != 1 ||
		!strings.HasPrefix(p.ProviderRef, "pi_") || p.CreatedAt.IsZero() {
		t.Errorf("payment %+v", p)
	}

	stored, err := store.Get(context.Background(), e.pool, "web", p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Status != store.StatusSucceeded || stored.Version != 1 || stored.ProviderRef != p.ProviderRef || stored.AmountPaise != 120000 {
		t.Errorf("stored payment %+v", stored)
	}

	out := e.outbox()
	if len(out) != 1 {
		t.Fatalf("outbox has %d rows, want 1: %+v", len(out), out)
	}
	o := out[0]
	if o.EventType != contract.PaymentSucceeded || o.AggregateID != p.ID || o.AggregateVersion != 1 {
		t.Errorf("outbox row %+v", o)
	}
	want := map[string]any{"payment_id": p.ID, "user_id": "u_17", "amount_paise": float64(120000), "currency": "INR", "status": "SUCCEEDED"}
	for k, v := range want {
		if o.Payload[k] != v {
			t.Errorf("payload[%s] = %v, want %v (payload %v)", k, o.Payload[k], v, o.Payload)
		}
	}

	charges := e.stripe.callsTo(chargesPath)
	if len(charges) != 1 || charges[0].Method != http.MethodPost || charges[0].Key != "pi:"+p.ID {
		t.Errorf("stripe charges %+v, want one POST with key pi:%s", charges, p.ID)
	}

	g := e.do(http.MethodGet, "/v1/payments/"+p.ID, "", "")
	if g.status != http.StatusOK {
		t.Fatalf("GET: status %d, body %s", g.status, g.body)
	}
	if got := g.payment(t); got != p {
		t.Errorf("GET = %+v, want %+v", got, p)
	}
}

func TestSameKeySameBodyReplaysTheSavedResponse(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	first := e.create("k-1", validBody)
	if first.status != http.StatusCreated {
		t.Fatalf("status %d, body %s", first.status, first.body)
	}
	p := first.payment(t)
	// The same request, byte for byte, then with other whitespace and field order.
	for _, body := range []string{validBody, `{ "method": "upi", "currency": "INR",
		"amount_paise": 120000, "user_id": "u_17" }`} {
		again := e.create("k-1", body)
		if again.status != first.status || !bytes.Equal(again.body, first.body) {
			t.Errorf("replay: status %d body %s, want %d %s", again.status, again.body, first.status, first.body)
		}
		if again.header.Get("Idempotent-Replayed") != "true" {
			t.Error("replay not marked Idempotent-Replayed: true")
		}
	}
	charges := e.stripe.callsTo(chargesPath)
	if len(charges) != 1 || charges[0].Key != "pi:"+p.ID {
		t.Errorf("stripe charges %+v, want exactly one with key pi:%s", charges, p.ID)
	}
	if n := e.count("SELECT count(*) FROM payments"); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}
	if n := len(e.outbox()); n != 1 {
		t.Errorf("%d outbox rows, want 1", n)
	}
}

func TestSameKeyDifferentBodyIs422AndWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	first := e.create("k-1", validBody)
	if first.status != http.StatusCreated {
		t.Fatalf("status %d, body %s", first.status, first.body)
	}
	r := e.create("k-1", `{"user_id":"u_17","amount_paise":130000,"currency":"INR","method":"upi"}`)
	if r.status != http.StatusUnprocessableEntity {
		t.Fatalf("status %d, body %s, want 422", r.status, r.body)
	}
	if d := r.errorDetail(t); d.Code != "idempotency_key_reused" || d.Field != "Idempotency-Key" {
		t.Errorf("error %+v", d)
	}
	if bytes.Contains(r.body, []byte(first.payment(t).ID)) {
		t.Error("the 422 leaks the saved response")
	}
	if n := e.count("SELECT count(*) FROM payments"); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}
	if n := e.count("SELECT count(*) FROM payments WHERE amount_paise = 130000"); n != 0 {
		t.Error("the changed request was charged")
	}
	if n := len(e.outbox()); n != 1 {
		t.Errorf("%d outbox rows, want 1", n)
	}
	if n := len(e.stripe.callsTo(chargesPath)); n != 1 {
		t.Errorf("%d stripe charges, want 1", n)
	}
	// The saved response is untouched: the original request still replays.
	if again := e.create("k-1", validBody); !bytes.Equal(again.body, first.body) {
		t.Errorf("replay after the 422: %s", again.body)
	}
}

func TestSameKeyInFlightIs409(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.stripe.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == chargesPath {
			once.Do(func() { close(entered) })
			<-release // hold the charge: the first request is in flight
		}
		return false
	})
	firstDone := make(chan response, 1)
	go func() {
		r, err := e.try(e.client, http.MethodPost, "/v1/payments", "k-1", validBody)
		if err != nil {
			t.Error(err)
		}
		firstDone <- r
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("the charge never reached Stripe")
	}

	busy := e.create("k-1", validBody)
	if busy.status != http.StatusConflict || busy.errorDetail(t).Code != "idempotency_key_in_use" || busy.header.Get("Retry-After") == "" {
		t.Errorf("in flight: status %d, headers %v, body %s; want 409 idempotency_key_in_use with Retry-After", busy.status, busy.header, busy.body)
	}
	// The hash is checked before anything else: a changed body is 422 even in flight.
	changed := e.create("k-1", `{"user_id":"u_18","amount_paise":120000,"currency":"INR","method":"upi"}`)
	if changed.status != http.StatusUnprocessableEntity {
		t.Errorf("changed body in flight: status %d, want 422", changed.status)
	}
	if n := e.count("SELECT count(*) FROM payments"); n != 0 {
		t.Errorf("%d payments while the charge is held", n)
	}

	close(release)
	first := <-firstDone
	if first.status != http.StatusCreated {
		t.Fatalf("first: status %d, body %s", first.status, first.body)
	}
	if again := e.create("k-1", validBody); again.status != http.StatusCreated || !bytes.Equal(again.body, first.body) {
		t.Errorf("after completion: status %d body %s, want the saved 201", again.status, again.body)
	}
	if n := len(e.stripe.callsTo(chargesPath)); n != 1 {
		t.Errorf("%d stripe charges, want 1", n)
	}
}

func TestConcurrentRequestsWithOneKeyMakeOnePayment(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	// A slow provider, so that the requests overlap.
	e.stripe.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		time.Sleep(200 * time.Millisecond)
		return false
	})
	const n = 20
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		results = make([]response, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			r, err := e.try(e.client, http.MethodPost, "/v1/payments", "same-key", validBody)
			if err != nil {
				t.Error(err)
			}
			results[i] = r
		})
	}
	close(start)
	wg.Wait()

	var created []response
	for _, r := range results {
		switch r.status {
		case http.StatusCreated:
			created = append(created, r)
		case http.StatusConflict:
		default:
			t.Errorf("status %d, body %s; want 201 or 409", r.status, r.body)
		}
	}
	if len(created) == 0 {
		t.Fatal("no request succeeded")
	}
	for _, r := range created[1:] {
		if !bytes.Equal(r.body, created[0].body) {
			t.Errorf("two different 201 bodies: %s and %s", r.body, created[0].body)
		}
	}
	p := created[0].payment(t)
	if c := e.count("SELECT count(*) FROM payments"); c != 1 {
		t.Errorf("%d payments, want 1", c)
	}
	if out := e.outbox(); len(out) != 1 || out[0].AggregateID != p.ID {
		t.Errorf("outbox %+v, want one row for %s", out, p.ID)
	}
	if charges := e.stripe.callsTo(chargesPath); len(charges) != 1 || charges[0].Key != "pi:"+p.ID {
		t.Errorf("stripe charges %+v, want one with key pi:%s", charges, p.ID)
	}
	t.Logf("%d x 201, %d x 409", len(created), n-len(created))
}

// A crash after Stripe charged and before the commit: the key stays
// claimed with the payment id, its lease expires, and the retry charges
// again under the SAME Stripe key, so Stripe returns the first charge.
func TestCrashAfterChargeBeforeCommitRetryReusesTheStripeKey(t *testing.T) {
	const lease = time.Second
	e := newEnv(t, lease)
	disable := failpoint.Enable(api.AfterChargeBeforeCommit, 1)
	noReuse := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}} // no transparent client retry
	_, err := e.try(noReuse, http.MethodPost, "/v1/payments", "k-1", validBody)
	disable()
	if err == nil {
		t.Fatal("the crashed request got a response")
	}

	// What the crash left: a claimed key with a payment id, nothing else.
	var paymentID string
	var unfinished, locked bool
	if err := e.pool.QueryRow(context.Background(), `SELECT resource_id, response_code IS NULL, locked_at IS NOT NULL
		FROM idempotency_keys WHERE scope = 'web POST /v1/payments' AND key = 'k-1'`).Scan(&paymentID, &unfinished, &locked); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(paymentID, "pay_") || !unfinished || !locked {
		t.Fatalf("key row: resource %q unfinished %v locked %v", paymentID, unfinished, locked)
	}
	if n := e.count("SELECT count(*) FROM payments"); n != 0 {
		t.Fatalf("%d payments after the crash, want 0", n)
	}
	if n := len(e.outbox()); n != 0 {
		t.Fatalf("%d outbox rows after the crash, want 0", n)
	}

	// Until the lease expires the key is busy...
	if r := e.create("k-1", validBody); r.status != http.StatusConflict {
		t.Errorf("retry within the lease: status %d, want 409", r.status)
	}
	// ...then the retry takes over.
	var r response
	deadline := time.Now().Add(lease + 5*time.Second)
	for {
		r = e.create("k-1", validBody)
		if r.status != http.StatusConflict || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r.status != http.StatusCreated {
		t.Fatalf("retry after the lease: status %d, body %s", r.status, r.body)
	}
	if p := r.payment(t); p.ID != paymentID {
		t.Errorf("retry created %s, want the crashed attempt's payment id %s", p.ID, paymentID)
	}
	charges := e.stripe.callsTo(chargesPath)
	if len(charges) != 2 {
		t.Fatalf("stripe calls %+v, want 2 (crashed attempt and retry)", charges)
	}
	for _, c := range charges {
		if c.Key != "pi:"+paymentID {
			t.Errorf("stripe call with key %q, want pi:%s on every attempt", c.Key, paymentID)
		}
	}
	if n := e.count("SELECT count(*) FROM payments"); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}
	if n := len(e.outbox()); n != 1 {
		t.Errorf("%d outbox rows, want 1", n)
	}
	if n := e.count("SELECT attempts FROM idempotency_keys WHERE key = 'k-1'"); n != 2 {
		t.Errorf("attempts = %d, want 2", n)
	}
}

// The same crash, and the client never retries: Resume (the service's
// resume task) finishes the payment after the lease, under the same Stripe
// key, with the request the crashed attempt was given. The card charged in
// the crashed attempt is recorded; the client's retry, when it comes, is a
// replay of that payment. A refund that crashed the same way is finished too.
func TestCrashAfterChargeBeforeCommitIsFinishedByResumeWithoutTheClient(t *testing.T) {
	const lease = 500 * time.Millisecond
	e := newEnv(t, lease)
	ctx := context.Background()
	noReuse := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	disable := failpoint.Enable(api.AfterChargeBeforeCommit, 1)
	_, err := e.try(noReuse, http.MethodPost, "/v1/payments", "k-1", validBody)
	disable()
	if err == nil {
		t.Fatal("the crashed request got a response")
	}
	var paymentID string
	if err := e.pool.QueryRow(ctx, `SELECT resource_id FROM idempotency_keys WHERE key = 'k-1'`).Scan(&paymentID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(lease + 100*time.Millisecond)
	if n, err := e.keys.Resume(ctx, time.Hour, e.srv.Resume); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v; want the crashed payment finished", n, err)
	}
	var user string
	var amount int64
	if err := e.pool.QueryRow(ctx, `SELECT user_id, amount_paise FROM payments WHERE id = $1 AND client = 'web'`, paymentID).Scan(&user, &amount); err != nil {
		t.Fatalf("payment %s after Resume: %v", paymentID, err)
	}
	if user != "u_17" || amount != 120000 {
		t.Errorf("resumed payment is %s %d paise, want the crashed request's u_17 120000", user, amount)
	}
	if n := len(e.outbox()); n != 1 {
		t.Errorf("%d outbox rows after Resume, want 1 (its PaymentSucceeded)", n)
	}
	charges := e.stripe.callsTo(chargesPath)
	if len(charges) != 2 || charges[0].Key != "pi:"+paymentID || charges[1].Key != "pi:"+paymentID {
		t.Errorf("stripe calls %+v, want 2 under pi:%s (the crashed attempt and the resume)", charges, paymentID)
	}
	r := e.create("k-1", validBody)
	if r.status != http.StatusCreated || r.header.Get(httpidem.HeaderReplayed) != "true" || r.payment(t).ID != paymentID {
		t.Errorf("the client's late retry: %d %s, want the resumed payment %s replayed", r.status, r.body, paymentID)
	}
	if n := len(e.stripe.callsTo(chargesPath)); n != 2 {
		t.Errorf("%d stripe charges after the replay, want still 2", n)
	}

	// A refund whose attempt crashed the same way (its key claimed, its
	// lease expired, no response) is finished too: refunded once, under
	// Stripe's refund:<id> key, with its PaymentRefunded event.
	if _, err := e.pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, key, request_hash, request, lock_token, locked_at)
		VALUES ('web POST /v1/payments/' || $1 || '/refund', 'r-1', '\x00', '{}', gen_random_uuid(), now() - interval '1 hour')`, paymentID); err != nil {
		t.Fatal(err)
	}
	if n, err := e.keys.Resume(ctx, time.Hour, e.srv.Resume); err != nil || n != 1 {
		t.Fatalf("Resume of the crashed refund = %d, %v; want 1", n, err)
	}
	var status string
	if err := e.pool.QueryRow(ctx, `SELECT status FROM payments WHERE id = $1`, paymentID).Scan(&status); err != nil || status != "REFUNDED" {
		t.Errorf("payment after the resumed refund: %q, %v; want REFUNDED", status, err)
	}
	if refunds := e.stripe.callsTo(refundsPath); len(refunds) != 1 || refunds[0].Key != "refund:"+paymentID {
		t.Errorf("stripe refund calls %+v, want one under refund:%s", refunds, paymentID)
	}
	if n := len(e.outbox()); n != 2 {
		t.Errorf("%d outbox rows after the resumed refund, want 2", n)
	}
}

// A provider failure with an unknown outcome saves nothing and releases
// the key at once; the retry repeats the call under the same Stripe key.
func TestProviderFailureReleasesTheKeyForAnImmediateRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	e.stripe.setHook(stripeError(chargesPath, 1, http.StatusInternalServerError,
		`{"error":{"type":"api_error","message":"something went wrong"}}`))
	first := e.create("k-1", validBody)
	if first.status != http.StatusBadGateway || first.errorDetail(t).Code != "provider_unavailable" {
		t.Fatalf("status %d, body %s; want 502 provider_unavailable", first.status, first.body)
	}
	if n := e.count("SELECT count(*) FROM idempotency_keys WHERE response_code IS NULL AND locked_at IS NULL"); n != 1 {
		t.Errorf("want the key unfinished and released, got %d such rows", n)
	}
	if n := e.count("SELECT count(*) FROM payments"); n != 0 {
		t.Errorf("%d payments after the failure", n)
	}
	retry := e.create("k-1", validBody)
	if retry.status != http.StatusCreated {
		t.Fatalf("retry: status %d, body %s", retry.status, retry.body)
	}
	p := retry.payment(t)
	charges := e.stripe.callsTo(chargesPath)
	if len(charges) != 2 || charges[0].Key != "pi:"+p.ID || charges[1].Key != "pi:"+p.ID {
		t.Errorf("stripe calls %+v, want 2, both with key pi:%s", charges, p.ID)
	}
	if n := e.count("SELECT count(*) FROM payments"); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}
}

// A decline answers with a code from Stripe's customer-facing set and a
// message of the service's own: a fraud-screening code (fraudulent,
// stolen_card, ...) is answered as generic_decline, as Stripe advises, and
// Stripe's own text, which can name a Radar rule, is never passed on (nor
// saved for replay). The code is kept otherwise, so the client can act.
func TestADeclineNamesNoFraudScreeningAndCarriesNoProviderText(t *testing.T) {
	t.Parallel()
	for stripeCode, want := range map[string]string{
		"fraudulent": "generic_decline", "stolen_card": "generic_decline", "lost_card": "generic_decline",
		"merchant_blacklist": "generic_decline", "pickup_card": "generic_decline",
		"expired_card": "expired_card", "Bad Code!": "generic_decline",
	} {
		e := newEnv(t, time.Minute)
		e.stripe.setHook(stripeError(chargesPath, 1, http.StatusPaymentRequired,
			`{"error":{"type":"card_error","code":"card_declined","decline_code":"`+stripeCode+`","message":"Your card was declined. Radar rule 'block if :risk_score: > 65' (rule_123)"}}`))
		r := e.create("k-1", validBody)
		d := r.errorDetail(t)
		if r.status != http.StatusPaymentRequired || d.Code != want {
			t.Errorf("decline %q: %d code %q, want 402 %q", stripeCode, r.status, d.Code, want)
		}
		if strings.Contains(string(r.body), "Radar") || strings.Contains(string(r.body), stripeCode) && want != stripeCode {
			t.Errorf("decline %q: the answer carries Stripe's text or code: %s", stripeCode, r.body)
		}
	}
}

// A decline is a final outcome: saved, and replayed (errors included).
func TestDeclineIsSavedAndReplayed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	e.stripe.setHook(stripeError(chargesPath, -1, http.StatusPaymentRequired,
		`{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","message":"Your card has insufficient funds."}}`))
	first := e.create("k-1", validBody)
	if first.status != http.StatusPaymentRequired || first.errorDetail(t).Code != "insufficient_funds" {
		t.Fatalf("status %d, body %s; want 402 insufficient_funds", first.status, first.body)
	}
	again := e.create("k-1", validBody)
	if again.status != http.StatusPaymentRequired || !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: status %d body %s, want the saved 402", again.status, again.body)
	}
	if n := len(e.stripe.callsTo(chargesPath)); n != 1 {
		t.Errorf("%d stripe charges, want 1", n)
	}
	if n := e.count("SELECT count(*) FROM payments"); n != 0 {
		t.Errorf("%d payments for a declined charge", n)
	}
	if n := len(e.outbox()); n != 0 {
		t.Errorf("%d outbox rows for a declined charge", n)
	}
}

func TestBadRequestsAreRefusedAndWriteNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	huge := `{"user_id":"` + strings.Repeat("x", 70<<10) + `","amount_paise":1,"currency":"INR","method":"upi"}`
	cases := []struct {
		name, key, body string
		status          int
		code, field     string
	}{
		{"missing key", "", validBody, 400, "idempotency_key_missing", "Idempotency-Key"},
		{"key too long", strings.Repeat("k", 256), validBody, 400, "idempotency_key_invalid", "Idempotency-Key"},
		{"empty body", "k", ``, 400, "malformed_json", "body"},
		{"malformed JSON", "k", `{"user_id":`, 400, "malformed_json", "body"},
		{"not an object", "k", `[1,2]`, 400, "malformed_json", "body"},
		{"null", "k", `null`, 400, "malformed_json", "body"},
		{"trailing data", "k", validBody + `{}`, 400, "malformed_json", "body"},
		{"unknown field", "k", `{"user_id":"u_17","amount_paise":120000,"currency":"INR","method":"upi","tip":5}`, 400, "unknown_field", "tip"},
		{"field name in other case", "k", `{"USER_ID":"u_17","amount_paise":120000,"currency":"INR","method":"upi"}`, 400, "unknown_field", "USER_ID"},
		{"missing user_id", "k", `{"amount_paise":120000,"currency":"INR","method":"upi"}`, 400, "invalid_field", "user_id"},
		{"empty user_id", "k", `{"user_id":"","amount_paise":120000,"currency":"INR","method":"upi"}`, 400, "invalid_field", "user_id"},
		{"user_id not a string", "k", `{"user_id":17,"amount_paise":120000,"currency":"INR","method":"upi"}`, 400, "invalid_type", "user_id"},
		{"missing amount", "k", `{"user_id":"u_17","currency":"INR","method":"upi"}`, 400, "invalid_field", "amount_paise"},
		{"zero amount", "k", `{"user_id":"u_17","amount_paise":0,"currency":"INR","method":"upi"}`, 400, "invalid_field", "amount_paise"},
		{"negative amount", "k", `{"user_id":"u_17","amount_paise":-5,"currency":"INR","method":"upi"}`, 400, "invalid_field", "amount_paise"},
		{"fractional amount", "k", `{"user_id":"u_17","amount_paise":1200.5,"currency":"INR","method":"upi"}`, 400, "invalid_type", "amount_paise"},
		{"amount as a string", "k", `{"user_id":"u_17","amount_paise":"120000","currency":"INR","method":"upi"}`, 400, "invalid_type", "amount_paise"},
		{"amount too large", "k", `{"user_id":"u_17","amount_paise":100000000,"currency":"INR","method":"upi"}`, 400, "invalid_field", "amount_paise"},
		{"unknown currency", "k", `{"user_id":"u_17","amount_paise":120000,"currency":"XYZ","method":"upi"}`, 400, "unsupported_currency", "currency"},
		{"lower-case currency", "k", `{"user_id":"u_17","amount_paise":120000,"currency":"inr","method":"upi"}`, 400, "unsupported_currency", "currency"},
		{"missing currency", "k", `{"user_id":"u_17","amount_paise":120000,"method":"upi"}`, 400, "invalid_field", "currency"},
		{"unknown method", "k", `{"user_id":"u_17","amount_paise":120000,"currency":"INR","method":"cash"}`, 400, "invalid_field", "method"},
		{"body over 64 KiB", "k", huge, 413, "body_too_large", "body"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.create(c.key, c.body)
			if r.status != c.status {
				t.Fatalf("status %d, body %s; want %d", r.status, r.body, c.status)
			}
			if d := r.errorDetail(t); d.Code != c.code || d.Field != c.field || d.Message == "" {
				t.Errorf("error %+v, want code %q field %q and a message", d, c.code, c.field)
			}
		})
	}
	e.assertNothingWritten()

	// Nothing was saved under the key: fixing the request works with it.
	if r := e.create("k", validBody); r.status != http.StatusCreated {
		t.Errorf("the fixed request with the same key: status %d, body %s", r.status, r.body)
	}
}

func TestKeysAreScopedPerEndpointAndPath(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	p := e.mustCreate("shared")
	q := e.mustCreate("other")
	// The same string as a refund key, on two payments: three scopes.
	for _, id := range []string{p.ID, q.ID} {
		if r := e.refund(id, "shared"); r.status != http.StatusOK || r.payment(t).ID != id {
			t.Errorf("refund %s with key 'shared': status %d, body %s", id, r.status, r.body)
		}
	}
	if n := e.count("SELECT count(*) FROM idempotency_keys WHERE key = 'shared'"); n != 3 {
		t.Errorf("%d rows for key 'shared', want 3 scopes", n)
	}
	// And the payment scope still replays its own response.
	if r := e.create("shared", validBody); r.payment(t).ID != p.ID || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("payment key replay: %s", r.body)
	}
}

func TestRefundMarksRefundedAndEmitsPaymentRefunded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	p := e.mustCreate("k-1")
	r := e.refund(p.ID, "r-1")
	if r.status != http.StatusOK {
		t.Fatalf("refund: status %d, body %s", r.status, r.body)
	}
	q := r.payment(t)
	if q.ID != p.ID || q.Status != store.StatusRefunded || q.Version != 2 || !strings.HasPrefix(q.ProviderRefundRef, "re_") ||
		q.ProviderRef != p.ProviderRef || q.AmountPaise != p.AmountPaise {
		t.Errorf("refunded payment %+v", q)
	}
	stored, err := store.Get(context.Background(), e.pool, "web", p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Status != store.StatusRefunded || stored.Version != 2 {
		t.Errorf("stored %+v", stored)
	}
	out := e.outbox()
	if len(out) != 2 {
		t.Fatalf("outbox %+v, want PaymentSucceeded and PaymentRefunded", out)
	}
	var refunded *outboxRow
	for i := range out {
		if out[i].EventType == contract.PaymentRefunded {
			refunded = &out[i]
		}
	}
	if refunded == nil || refunded.AggregateID != p.ID || refunded.AggregateVersion != 2 ||
		refunded.Payload["status"] != "REFUNDED" || refunded.Payload["payment_id"] != p.ID ||
		refunded.Payload["amount_paise"] != float64(120000) || refunded.Payload["user_id"] != "u_17" {
		t.Errorf("PaymentRefunded row %+v", refunded)
	}
	refunds := e.stripe.callsTo(refundsPath)
	if len(refunds) != 1 || refunds[0].Key != "refund:"+p.ID {
		t.Errorf("stripe refunds %+v, want one with key refund:%s", refunds, p.ID)
	}

	again := e.refund(p.ID, "r-1")
	if again.status != http.StatusOK || !bytes.Equal(again.body, r.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: status %d body %s", again.status, again.body)
	}
	if n := len(e.stripe.callsTo(refundsPath)); n != 1 {
		t.Errorf("%d stripe refunds after the replay, want 1", n)
	}
	if g := e.do(http.MethodGet, "/v1/payments/"+p.ID, "", ""); g.payment(t).Status != store.StatusRefunded {
		t.Errorf("GET after refund: %s", g.body)
	}
	// A refund takes no parameters.
	bad := e.do(http.MethodPost, "/v1/payments/"+p.ID+"/refund", "r-2", `{"amount_paise":5}`)
	if bad.status != http.StatusBadRequest || bad.errorDetail(t).Field != "amount_paise" {
		t.Errorf("refund with a body: status %d, body %s", bad.status, bad.body)
	}
}

func TestRefundTwiceWithANewKeyIs409(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	p := e.mustCreate("k-1")
	if r := e.refund(p.ID, "r-1"); r.status != http.StatusOK {
		t.Fatalf("first refund: %d %s", r.status, r.body)
	}
	second := e.refund(p.ID, "r-2")
	if second.status != http.StatusConflict || second.errorDetail(t).Code != "payment_already_refunded" {
		t.Fatalf("second refund: status %d, body %s; want 409 payment_already_refunded", second.status, second.body)
	}
	// Saved like any outcome: the same key replays it.
	if again := e.refund(p.ID, "r-2"); again.status != http.StatusConflict || !bytes.Equal(again.body, second.body) {
		t.Errorf("replay: %d %s", again.status, again.body)
	}
	if n := len(e.stripe.callsTo(refundsPath)); n != 1 {
		t.Errorf("%d stripe refunds, want 1", n)
	}
	if n := e.count("SELECT count(*) FROM outbox WHERE event_type = 'PaymentRefunded'"); n != 1 {
		t.Errorf("%d PaymentRefunded rows, want 1", n)
	}
	if n := e.count("SELECT version FROM payments WHERE id = $1", p.ID); n != 2 {
		t.Errorf("version %d, want 2", n)
	}
}

func TestConcurrentRefundsWithDifferentKeysRefundOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	p := e.mustCreate("k-1")
	e.stripe.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		time.Sleep(100 * time.Millisecond)
		return false
	})
	const n = 10
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, err := e.try(e.client, http.MethodPost, "/v1/payments/"+p.ID+"/refund", "r-"+string(rune('a'+i)), "")
			if err != nil {
				t.Error(err)
			}
			statuses[i] = r.status
		})
	}
	wg.Wait()
	ok := 0
	for _, s := range statuses {
		switch s {
		case http.StatusOK:
			ok++
		case http.StatusConflict:
		default:
			t.Errorf("status %d", s)
		}
	}
	if ok != 1 {
		t.Errorf("%d refunds succeeded, want 1 (statuses %v)", ok, statuses)
	}
	if c := e.count("SELECT count(*) FROM outbox WHERE event_type = 'PaymentRefunded'"); c != 1 {
		t.Errorf("%d PaymentRefunded rows, want 1", c)
	}
	// Every Stripe refund call, whichever API key it served, carried the
	// one key of this payment's refund: Stripe makes one refund of them.
	calls := e.stripe.callsTo(refundsPath)
	if len(calls) == 0 {
		t.Errorf("no Stripe refund call, want at least one")
	}
	for _, c := range calls {
		if c.Key != "refund:"+p.ID {
			t.Errorf("stripe refund with key %q, want refund:%s", c.Key, p.ID)
		}
	}
}

func TestRefundOfUnknownPaymentIs404AndWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	r := e.refund("pay_doesnotexist", "r-1")
	if r.status != http.StatusNotFound || r.errorDetail(t).Code != "payment_not_found" {
		t.Fatalf("status %d, body %s; want 404 payment_not_found", r.status, r.body)
	}
	if r := e.refund("pay_doesnotexist", ""); r.status != http.StatusBadRequest || r.errorDetail(t).Field != "Idempotency-Key" {
		t.Errorf("refund without a key: status %d, body %s; want 400", r.status, r.body)
	}
	e.assertNothingWritten()
}

func TestGetUnknownPaymentIs404(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	r := e.do(http.MethodGet, "/v1/payments/pay_nope", "", "")
	if r.status != http.StatusNotFound || r.errorDetail(t).Code != "payment_not_found" {
		t.Errorf("status %d, body %s", r.status, r.body)
	}
}
