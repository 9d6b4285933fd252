package provider_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/effectively-once/payments-cashback/services/payments/provider"
)

// fakeStripe answers every payment intent creation with status, and marks
// the response as stripe-mock does (a Stripe-Mock-Version header), as a
// server in the path, or a misconfigured proxy, could.
func fakeStripe(t *testing.T, status string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Stripe-Mock-Version", "0.190.0")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"pi_123","object":"payment_intent","status":"`+status+`","amount":120000,"currency":"inr"}`)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

var charge = provider.Charge{PaymentID: "pay_1", UserID: "u_17", AmountPaise: 120000, Currency: "INR", Method: "upi"}

// On the production path only the payment intent's status says whether
// money moved: a Stripe-Mock-Version header on a response whose status is
// not "succeeded" is no charge.
func TestAStripeMockHeaderNeverTurnsAnUnpaidStatusIntoACharge(t *testing.T) {
	for _, status := range []string{"requires_payment_method", "processing", "requires_action", "canceled"} {
		gw := provider.NewStripe(provider.Config{URL: fakeStripe(t, status), APIKey: "sk_live_123", MaxRetries: -1, Logger: quiet})
		id, err := gw.Charge(context.Background(), charge)
		if err == nil {
			t.Errorf("status %s with a Stripe-Mock-Version header: charged as %s, want an error", status, id)
		}
	}
	gw := provider.NewStripe(provider.Config{URL: fakeStripe(t, "succeeded"), APIKey: "sk_live_123", MaxRetries: -1, Logger: quiet})
	if id, err := gw.Charge(context.Background(), charge); err != nil || id != "pi_123" {
		t.Errorf("status succeeded: %q, %v; want pi_123", id, err)
	}
	var declined *provider.DeclinedError
	gw = provider.NewStripe(provider.Config{URL: fakeStripe(t, "requires_payment_method"), APIKey: "sk_live_123", MaxRetries: -1, Logger: quiet})
	if _, err := gw.Charge(context.Background(), charge); !errors.As(err, &declined) {
		t.Errorf("requires_payment_method: %v, want a decline", err)
	}
}

// With MockFixtures (local stacks on stripe-mock), stripe-mock's fixture
// status is taken as a charge; a response without its header still is not.
func TestMockFixturesAcceptStripeMocksFixtureOnlyFromStripeMock(t *testing.T) {
	gw := provider.NewStripe(provider.Config{URL: fakeStripe(t, "requires_payment_method"), APIKey: "sk_test_123",
		MaxRetries: -1, MockFixtures: true, Logger: quiet})
	if id, err := gw.Charge(context.Background(), charge); err != nil || id != "pi_123" {
		t.Errorf("stripe-mock fixture with MockFixtures: %q, %v; want pi_123", id, err)
	}
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"pi_9","object":"payment_intent","status":"requires_payment_method"}`)
	}))
	t.Cleanup(plain.Close)
	gw = provider.NewStripe(provider.Config{URL: plain.URL, APIKey: "sk_test_123", MaxRetries: -1, MockFixtures: true, Logger: quiet})
	if id, err := gw.Charge(context.Background(), charge); err == nil {
		t.Errorf("requires_payment_method without the header, MockFixtures on: charged as %s", id)
	}
}
