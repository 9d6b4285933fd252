package api

import (
	"net/http"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/httpjson"
)

// Limits of the request bodies (which httpjson reads, at most
// httpjson.MaxBytes, strictly).
const (
	MaxAmountPaise = 99_999_999         // ₹999,999.99: Stripe's largest amount for INR (8 digits)
	maxUserIDLen   = events.MaxIDLength // user ids are checked by events.ValidID: an ASCII allowlist
)

// Currencies the service accepts. Amounts are in paise, so INR only.
var currencies = map[string]bool{"INR": true}

// Methods are the payment method labels the API accepts. The label is
// recorded on the payment and sent to Stripe as metadata; the Stripe payment
// method confirmed server-side is configured (STRIPE_PAYMENT_METHOD).
var methods = map[string]bool{"upi": true, "card": true, "netbanking": true, "wallet": true}

// invalid is a 400 invalid_field answer to a bad request: nothing was
// written.
func invalid(field, format string, args ...any) *httpjson.Error {
	return httpjson.Invalid("invalid_field", field, format, args...)
}

// createRequest is the body of POST /v1/payments as sent; pointers tell a
// missing field from a zero one.
type createRequest struct {
	UserID      *string `json:"user_id"`
	AmountPaise *int64  `json:"amount_paise"`
	Currency    *string `json:"currency"`
	Method      *string `json:"method"`
}

// NewPayment is a validated create request. It is also the request's
// idempotency fingerprint: the same key with a different NewPayment is 422.
type NewPayment struct {
	UserID      string `json:"user_id"`
	AmountPaise int64  `json:"amount_paise"`
	Currency    string `json:"currency"`
	Method      string `json:"method"`
}

// parseCreate reads and validates a create request. Every error names the
// offending field.
func parseCreate(w http.ResponseWriter, r *http.Request) (NewPayment, *httpjson.Error) {
	var req createRequest
	if err := httpjson.Decode(w, r, &req); err != nil {
		return NewPayment{}, err
	}
	switch {
	case req.UserID == nil:
		return NewPayment{}, invalid("user_id", "user_id is required")
	case req.AmountPaise == nil:
		return NewPayment{}, invalid("amount_paise", "amount_paise is required")
	case req.Currency == nil:
		return NewPayment{}, invalid("currency", "currency is required")
	case req.Method == nil:
		return NewPayment{}, invalid("method", "method is required")
	}
	p := NewPayment{UserID: *req.UserID, AmountPaise: *req.AmountPaise, Currency: *req.Currency, Method: *req.Method}
	if !events.ValidID(p.UserID) {
		return NewPayment{}, invalid("user_id", "user_id must be 1 to %d of A-Z a-z 0-9 _ . : @ -", maxUserIDLen)
	}
	if p.AmountPaise <= 0 {
		return NewPayment{}, invalid("amount_paise", "amount_paise must be a positive integer number of paise, got %d", p.AmountPaise)
	}
	if p.AmountPaise > MaxAmountPaise {
		return NewPayment{}, invalid("amount_paise", "amount_paise must be at most %d", MaxAmountPaise)
	}
	if !currencies[p.Currency] {
		// The value is not repeated: it is the caller's, of any length.
		return NewPayment{}, httpjson.Invalid("unsupported_currency", "currency",
			"currency is not supported: use INR (ISO 4217, upper case)")
	}
	if !methods[p.Method] {
		return NewPayment{}, invalid("method", "method must be one of upi, card, netbanking, wallet")
	}
	return p, nil
}

// refundRequest is the body of POST /v1/payments/{id}/refund: a refund is
// always of the full amount, so it has no fields. The body may be empty.
type refundRequest struct{}

func parseRefund(w http.ResponseWriter, r *http.Request) (refundRequest, *httpjson.Error) {
	var req refundRequest
	return req, httpjson.DecodeOptional(w, r, &req)
}
