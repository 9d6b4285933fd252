// Package provider charges and refunds through Stripe (stripe-go v76), or
// stripe-mock in tests and local stacks.
//
// Every call carries a Stripe idempotency key derived from the payment id
// (ChargeKey, RefundKey), never a random one: a retry after a crash, a
// timeout or a lost response repeats the same call, and Stripe answers it
// with the original result instead of charging or refunding again. Stripe
// keeps keys for 24 hours, as long as the API keeps its own.
//
// Outcomes:
//   - a charge the card network refused (Stripe error type card_error) is a
//     *DeclinedError: final, the API saves and replays it;
//   - a call Stripe refused as invalid (invalid_request_error with 400 or
//     404: an amount below the currency's minimum, say) and a refund Stripe
//     reports failed or canceled are a *RejectedError: nothing was charged
//     or refunded, and asking again under the same key gets the same
//     answer;
//   - a call refused for its API key (401, 403) is an ordinary error that
//     NotExecuted recognises: Stripe did not act on it;
//   - anything else that fails (network, Stripe 5xx, timeouts, a response
//     we cannot interpret) is an ordinary error whose outcome is unknown:
//     the call may have been carried out, and repeating it under the same
//     key is how to learn its result.
package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/paymentintent"
	"github.com/stripe/stripe-go/v76/refund"
)

// ChargeKey is the Stripe idempotency key of a payment's charge.
func ChargeKey(paymentID string) string { return "pi:" + paymentID }

// RefundKey is the Stripe idempotency key of a payment's refund. A payment
// is refunded in full at most once, so the key is per payment: two refund
// requests with different API keys still make one Stripe refund.
func RefundKey(paymentID string) string { return "refund:" + paymentID }

// StripeKeyRetention is how long Stripe keeps an idempotency key (at
// least): a call repeated later under it could be a new charge.
const StripeKeyRetention = 24 * time.Hour

// KeyWindow is how long after a first call its ChargeKey or RefundKey
// may be repeated without its client and still get the first call's
// result: StripeKeyRetention less an hour of margin.
const KeyWindow = StripeKeyRetention - time.Hour

// Config configures Stripe.
type Config struct {
	URL           string        // API base URL: https://api.stripe.com, or stripe-mock's
	APIKey        string        // sk_test_... / sk_live_...
	PaymentMethod string        // the payment method confirmed server-side [pm_card_visa]
	Timeout       time.Duration // per HTTP attempt [20s]
	// MaxRetries is how often stripe-go itself retries a failed call (same
	// idempotency key) [2]; negative means none.
	MaxRetries int
	// MockFixtures accepts any 2xx payment intent from stripe-mock (a
	// response with its Stripe-Mock-Version header) as charged: its
	// fixtures always say "requires_payment_method", whatever happened.
	// For local stacks and tests against stripe-mock only
	// (STRIPE_MOCK_FIXTURES=true); off, only the status "succeeded" is a
	// charge, whatever headers come back.
	MockFixtures bool
	Logger       *slog.Logger
}

// Stripe is the payment provider.
type Stripe struct {
	intents      paymentintent.Client
	refunds      refund.Client
	method       string
	mockFixtures bool
}

// NewStripe returns a Stripe client with its own backend (no stripe-go
// globals), so tests can point one at a recording proxy.
func NewStripe(cfg Config) *Stripe {
	if cfg.PaymentMethod == "" {
		cfg.PaymentMethod = "pm_card_visa"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 20 * time.Second
	}
	retries := int64(cfg.MaxRetries)
	if cfg.MaxRetries == 0 {
		retries = 2
	} else if cfg.MaxRetries < 0 {
		retries = 0
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(cfg.URL),
		HTTPClient:        &http.Client{Timeout: cfg.Timeout},
		MaxNetworkRetries: stripe.Int64(retries),
		LeveledLogger:     slogAdapter{cfg.Logger},
	})
	return &Stripe{
		intents:      paymentintent.Client{B: backend, Key: cfg.APIKey},
		refunds:      refund.Client{B: backend, Key: cfg.APIKey},
		method:       cfg.PaymentMethod,
		mockFixtures: cfg.MockFixtures,
	}
}

// DeclinedError is a final refusal of a charge.
type DeclinedError struct {
	Code    string // Stripe's decline code, e.g. card_declined, insufficient_funds
	Message string
}

func (e *DeclinedError) Error() string { return "declined: " + e.Code + ": " + e.Message }

// RejectedError is a call Stripe refused without acting on it, and would
// refuse again: nothing was charged or refunded.
type RejectedError struct {
	Code    string // Stripe's error code (amount_too_small, ...) or the refund's status
	Message string // Stripe's message, for the log
}

func (e *RejectedError) Error() string { return "rejected: " + e.Code + ": " + e.Message }

// NotExecuted reports whether err is a Stripe answer saying it did not act
// on the call at all: its API key refused (401, 403). Such a call is safe
// to give up on; any other ordinary error may have been carried out.
func NotExecuted(err error) bool {
	var se *stripe.Error
	return errors.As(err, &se) && (se.HTTPStatusCode == http.StatusUnauthorized || se.HTTPStatusCode == http.StatusForbidden)
}

// rejected turns Stripe's refusal of an invalid request into a
// *RejectedError, and returns nil for any other error. stripe-go repeats
// a timed-out call under the same key, and Stripe answers a repeat of a
// call it carried out with that call's result: a final 400 or 404 means
// none of the attempts was carried out.
func rejected(err error) *RejectedError {
	var se *stripe.Error
	if errors.As(err, &se) && se.Type == stripe.ErrorTypeInvalidRequest &&
		(se.HTTPStatusCode == http.StatusBadRequest || se.HTTPStatusCode == http.StatusNotFound) {
		code := string(se.Code)
		if code == "" {
			code = "invalid_request"
		}
		return &RejectedError{Code: code, Message: se.Msg}
	}
	return nil
}

// Charge is what to charge.
type Charge struct {
	PaymentID   string
	UserID      string
	AmountPaise int64
	Currency    string // ISO 4217, upper case
	Method      string // the API's method label (upi, card, ...), kept as metadata
}

// Charge creates and confirms a PaymentIntent under ChargeKey(PaymentID)
// and returns its id.
func (s *Stripe) Charge(ctx context.Context, c Charge) (string, error) {
	params := &stripe.PaymentIntentParams{
		Amount:             stripe.Int64(c.AmountPaise),
		Currency:           stripe.String(strings.ToLower(c.Currency)),
		PaymentMethod:      stripe.String(s.method),
		PaymentMethodTypes: stripe.StringSlice([]string{"card"}),
		Confirm:            stripe.Bool(true),
	}
	params.Context = ctx
	params.SetIdempotencyKey(ChargeKey(c.PaymentID))
	params.AddMetadata("payment_id", c.PaymentID)
	params.AddMetadata("user_id", c.UserID)
	params.AddMetadata("method", c.Method)
	pi, err := s.intents.New(params)
	if err != nil {
		var se *stripe.Error
		if errors.As(err, &se) && se.Type == stripe.ErrorTypeCard {
			code := string(se.DeclineCode)
			if code == "" {
				code = string(se.Code)
			}
			return "", &DeclinedError{Code: code, Message: se.Msg}
		}
		if r := rejected(err); r != nil {
			return "", r
		}
		return "", fmt.Errorf("stripe: create payment intent %s: %w", ChargeKey(c.PaymentID), err)
	}
	if s.mockFixtures && fromStripeMock(pi.LastResponse) {
		return pi.ID, nil
	}
	if !final(pi.Status) {
		// Stripe answers a repeat of the POST under the same key with the
		// first answer, for as long as it keeps the key: only a read of
		// the intent tells what became of it since.
		gp := &stripe.PaymentIntentParams{}
		gp.Context = ctx
		if pi, err = s.intents.Get(pi.ID, gp); err != nil {
			return "", fmt.Errorf("stripe: read payment intent %s: %w", ChargeKey(c.PaymentID), err)
		}
	}
	switch pi.Status {
	case stripe.PaymentIntentStatusSucceeded:
		return pi.ID, nil
	case stripe.PaymentIntentStatusRequiresPaymentMethod, stripe.PaymentIntentStatusCanceled:
		return "", &DeclinedError{Code: "payment_failed", Message: "the payment method was not charged (payment intent " + string(pi.Status) + ")"}
	case stripe.PaymentIntentStatusRequiresAction, stripe.PaymentIntentStatusRequiresConfirmation:
		// The customer would have to authenticate (3-D Secure), and this
		// service has no customer to ask: cancelled, the intent can never
		// charge later, and the decline is final.
		cp := &stripe.PaymentIntentCancelParams{}
		cp.Context = ctx
		if pi, err = s.intents.Cancel(pi.ID, cp); err != nil {
			return "", fmt.Errorf("stripe: cancel payment intent %s needing the customer: %w", ChargeKey(c.PaymentID), err)
		}
		if pi.Status == stripe.PaymentIntentStatusSucceeded {
			return pi.ID, nil
		}
		return "", &DeclinedError{Code: "authentication_required", Message: "the payment needs the customer to authenticate; the payment intent is cancelled"}
	default:
		// processing: not final. A retry (or Resume) reads the intent again.
		return "", fmt.Errorf("stripe: payment intent %s is %s: not completed yet", pi.ID, pi.Status)
	}
}

// final reports whether a payment intent in status st will not change
// without this service acting: succeeded, or failed for good.
func final(st stripe.PaymentIntentStatus) bool {
	switch st {
	case stripe.PaymentIntentStatusSucceeded, stripe.PaymentIntentStatusRequiresPaymentMethod, stripe.PaymentIntentStatusCanceled:
		return true
	}
	return false
}

// Refund refunds the payment intent in full under RefundKey(paymentID) and
// returns the refund id.
func (s *Stripe) Refund(ctx context.Context, paymentID, intentID string) (string, error) {
	params := &stripe.RefundParams{PaymentIntent: stripe.String(intentID)}
	params.Context = ctx
	params.SetIdempotencyKey(RefundKey(paymentID))
	params.AddMetadata("payment_id", paymentID)
	r, err := s.refunds.New(params)
	if err != nil {
		if r := rejected(err); r != nil {
			return "", r
		}
		return "", fmt.Errorf("stripe: refund %s: %w", RefundKey(paymentID), err)
	}
	switch r.Status {
	case stripe.RefundStatusSucceeded, stripe.RefundStatusPending:
		return r.ID, nil // pending refunds complete without further action
	case stripe.RefundStatusFailed, stripe.RefundStatusCanceled:
		return "", &RejectedError{Code: "refund_" + string(r.Status), Message: "refund " + r.ID + " is " + string(r.Status)}
	default:
		return "", fmt.Errorf("stripe: refund %s is %s", r.ID, r.Status)
	}
}

// fromStripeMock reports whether a response came from stripe-mock, which
// marks every response with a Stripe-Mock-Version header and answers with
// hard-coded fixtures: its payment intents always say
// "requires_payment_method", whatever happened. Only with
// Config.MockFixtures is a 2xx then taken as the charge succeeding: a
// header is something any server or proxy in the path can send.
func fromStripeMock(resp *stripe.APIResponse) bool {
	return resp != nil && resp.Header.Get("Stripe-Mock-Version") != ""
}

// slogAdapter routes stripe-go's own log lines into the service's JSON log.
// Its errors are returned to us as well, and handled there: they are
// logged as warnings here, and its chatter as debug.
type slogAdapter struct{ log *slog.Logger }

func (a slogAdapter) Debugf(format string, v ...any) {
	a.log.Debug("stripe-go: " + fmt.Sprintf(format, v...))
}
func (a slogAdapter) Infof(format string, v ...any) {
	a.log.Debug("stripe-go: " + fmt.Sprintf(format, v...))
}
func (a slogAdapter) Warnf(format string, v ...any) {
	a.log.Warn("stripe-go: " + fmt.Sprintf(format, v...))
}
func (a slogAdapter) Errorf(format string, v ...any) {
	a.log.Warn("stripe-go: " + fmt.Sprintf(format, v...))
}
