package api_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// intentAt answers Stripe's POST of a payment intent with what Stripe
// replays for its idempotency key, however often it is asked (the intent
// as the first call left it: status first), and a GET of the intent with
// its current status, now().
func (e *env) intentAt(first string, now func() string) {
	e.stripe.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		var status string
		switch {
		case r.URL.Path == chargesPath && r.Method == http.MethodPost:
			status = first
		case r.URL.Path == chargesPath+"/pi_3Pending" && r.Method == http.MethodGet:
			status = now()
		case r.URL.Path == chargesPath+"/pi_3Pending/cancel" && r.Method == http.MethodPost:
			status = "canceled"
		default:
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"pi_3Pending","object":"payment_intent","status":"` + status + `","amount":120000,"currency":"inr"}`))
		return true
	})
}

// A charge Stripe left processing is not final, and Stripe's answer to the
// same POST under the same key stays "processing" for as long as it keeps
// the key: the service reads the intent itself. So once the charge has
// gone through at Stripe, Resume (or the client's retry) records the
// payment. It used to re-send the POST, read the replayed "processing"
// every time, and never record a charge that went through.
func TestAChargeLeftProcessingIsRecordedOnceStripeSaysItSucceeded(t *testing.T) {
	const lease = 300 * time.Millisecond
	e := newEnv(t, lease)
	var settled atomic.Bool
	e.intentAt("processing", func() string {
		if settled.Load() {
			return "succeeded"
		}
		return "processing"
	})
	if r := e.create("k-1", validBody); r.status != http.StatusBadGateway {
		t.Fatalf("while processing: %d %s, want 502 (retry)", r.status, r.body)
	}
	settled.Store(true)
	n := e.resumeAfter(t, lease)
	if c := e.count(`SELECT count(*) FROM payments WHERE status = 'SUCCEEDED' AND provider_ref = 'pi_3Pending'`); n != 1 || c != 1 {
		t.Fatalf("Resume finished %d, %d payments; want the charge that went through recorded", n, c)
	}
	if r := e.create("k-1", validBody); r.status != http.StatusCreated {
		t.Errorf("the client's retry: %d %s, want the payment replayed", r.status, r.body)
	}
}

// A charge that needs the customer (3-D Secure: requires_action) can never
// complete here, as this service has no customer to ask: the intent is
// cancelled, so that no charge can follow later, and the request is a
// saved decline, authentication_required. It used to be a 502 retried for
// a day, the intent left open.
func TestAChargeThatNeedsTheCustomerIsCancelledAndDeclined(t *testing.T) {
	e := newEnv(t, time.Minute)
	e.intentAt("requires_action", func() string { return "requires_action" })
	r := e.create("k-1", validBody)
	if r.status != http.StatusPaymentRequired || r.errorDetail(t).Code != "authentication_required" {
		t.Fatalf("%d %s, want 402 authentication_required", r.status, r.body)
	}
	if n := len(e.stripe.callsTo(chargesPath + "/pi_3Pending/cancel")); n != 1 {
		t.Errorf("%d cancels of the intent, want 1", n)
	}
	if again := e.create("k-1", validBody); again.status != http.StatusPaymentRequired || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: %d, want the saved decline", again.status)
	}
	if n := e.count(`SELECT count(*) FROM payments`); n != 0 {
		t.Errorf("%d payments for a cancelled intent", n)
	}
}
