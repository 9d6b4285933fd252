package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/httpidem"
	"github.com/effectively-once/payments-cashback/services/payments/store"
)

// A charge whose outcome is unknown (Stripe answered 500: it may have
// charged the card) is answered 502 and released for the client's retry,
// and if the client never retries, Resume repeats the charge one lease
// later under the same Stripe key and records the payment: the card is
// never charged without a payment to show for it. The client's late retry
// replays that payment.
func TestAChargeWithAnUnknownOutcomeIsFinishedByResumeWhenTheClientNeverRetries(t *testing.T) {
	t.Parallel()
	const lease = 500 * time.Millisecond
	e := newEnv(t, lease)
	ctx := context.Background()
	e.stripe.setHook(stripeError(chargesPath, 1, http.StatusInternalServerError,
		`{"error":{"type":"api_error","message":"something went wrong"}}`))
	if r := e.create("k-1", validBody); r.status != http.StatusBadGateway || r.errorDetail(t).Code != "provider_unavailable" {
		t.Fatalf("status %d, body %s; want 502 provider_unavailable", r.status, r.body)
	}
	if n, err := e.keys.Resume(ctx, time.Hour, e.srv.Resume); err != nil || n != 0 {
		t.Fatalf("Resume within the lease = %d, %v; want 0: the client may retry", n, err)
	}
	time.Sleep(lease + 100*time.Millisecond)
	if n, err := e.keys.Resume(ctx, time.Hour, e.srv.Resume); err != nil || n != 1 {
		t.Fatalf("Resume after the lease = %d, %v; want the payment finished", n, err)
	}
	var paymentID string
	if err := e.pool.QueryRow(ctx, `SELECT id FROM payments`).Scan(&paymentID); err != nil {
		t.Fatalf("no payment after Resume: %v", err)
	}
	charges := e.stripe.callsTo(chargesPath)
	if len(charges) != 2 || charges[0].Key != "pi:"+paymentID || charges[1].Key != "pi:"+paymentID {
		t.Errorf("stripe calls %+v, want 2, both under pi:%s", charges, paymentID)
	}
	if n := len(e.outbox()); n != 1 {
		t.Errorf("%d outbox rows, want the one PaymentSucceeded", n)
	}
	late := e.create("k-1", validBody)
	if late.status != http.StatusCreated || late.header.Get(httpidem.HeaderReplayed) != "true" || late.payment(t).ID != paymentID {
		t.Errorf("the client's late retry: %d %s, want the resumed payment replayed", late.status, late.body)
	}
}

// Calls Stripe did not act on are not resumed: a charge refused as invalid
// (an amount below the currency's minimum) is 422 provider_rejected, with
// Stripe's code and not its text, and a charge refused for the API key is
// 502. Each leaves the key released and unmarked: Resume, after the lease,
// calls Stripe for neither, and no payment exists.
func TestACallStripeDidNotActOnIsNotResumed(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	e := newEnv(t, lease)
	ctx := context.Background()
	e.stripe.setHook(stripeError(chargesPath, 1, http.StatusBadRequest,
		`{"error":{"type":"invalid_request_error","code":"amount_too_small","param":"amount","message":"Amount must be at least ₹0.50 inr"}}`))
	r := e.create("k-small", validBody)
	if d := r.errorDetail(t); r.status != http.StatusUnprocessableEntity || d.Code != "provider_rejected" ||
		!strings.Contains(d.Message, "amount_too_small") || !strings.Contains(d.Message, "nothing was charged") || strings.Contains(d.Message, "at least") {
		t.Errorf("an amount Stripe refuses: %d %s; want 422 provider_rejected naming amount_too_small, without Stripe's text", r.status, r.body)
	}
	e.stripe.setHook(stripeError(chargesPath, 1, http.StatusUnauthorized,
		`{"error":{"type":"invalid_request_error","message":"Invalid API Key provided"}}`))
	if r := e.create("k-auth", validBody); r.status != http.StatusBadGateway {
		t.Errorf("a refused API key: %d %s; want 502", r.status, r.body)
	}
	if n := e.count(`SELECT count(*) FROM idempotency_keys WHERE response_code IS NULL AND locked_at IS NULL AND resume_after IS NULL`); n != 2 {
		t.Errorf("%d keys released and not marked for Resume, want 2", n)
	}
	time.Sleep(lease + 100*time.Millisecond)
	calls := e.stripe.total()
	if n, err := e.keys.Resume(ctx, time.Hour, e.srv.Resume); err != nil || n != 0 || e.stripe.total() != calls {
		t.Errorf("Resume = %d, %v with %d more Stripe calls; want nothing resumed", n, err, e.stripe.total()-calls)
	}
	if n := e.count(`SELECT count(*) FROM payments`); n != 0 {
		t.Errorf("%d payments, want 0", n)
	}
}

// A refund Stripe reports failed is final at Stripe (the same key answers
// the same), so it is 422 provider_rejected, not "retry": the payment stays
// SUCCEEDED and no PaymentRefunded is written.
func TestARefundStripeReportsFailedIs422AndChangesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	p := e.mustCreate("k-1")
	e.stripe.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != refundsPath {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"re_failed","object":"refund","status":"failed","failure_reason":"expired_or_canceled_card"}`))
		return true
	})
	r := e.refund(p.ID, "r-1")
	if d := r.errorDetail(t); r.status != http.StatusUnprocessableEntity || d.Code != "provider_rejected" || !strings.Contains(d.Message, "refund_failed") {
		t.Errorf("a failed refund: %d %s; want 422 provider_rejected naming refund_failed", r.status, r.body)
	}
	stored, err := store.Get(context.Background(), e.pool, "web", p.ID)
	if err != nil || stored.Status != store.StatusSucceeded {
		t.Errorf("payment after the failed refund: %+v, %v; want SUCCEEDED", stored, err)
	}
	if n := len(e.outbox()); n != 1 {
		t.Errorf("%d outbox rows, want only PaymentSucceeded", n)
	}
}
