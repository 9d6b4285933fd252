package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/service"
)

// Limits of the request bodies.
const (
	MaxBodyBytes   = 64 << 10
	MaxAmountPaise = 99_999_999         // ₹999,999.99: Stripe's largest amount for INR (8 digits)
	maxUserIDLen   = events.MaxIDLength // user ids are checked by events.ValidID: an ASCII allowlist
)

// Currencies the service accepts. Amounts are in paise, so INR only.
var currencies = map[string]bool{"INR": true}

// Methods are the payment method labels the API accepts. The label is
// recorded on the payment and sent to Stripe as metadata; the Stripe payment
// method confirmed server-side is configured (STRIPE_PAYMENT_METHOD).
var methods = map[string]bool{"upi": true, "card": true, "netbanking": true, "wallet": true}

// requestError is a 4xx answer to a bad request: nothing was written.
type requestError struct {
	status      int
	code, field string
	message     string
}

func (e *requestError) write(w http.ResponseWriter) {
	service.WriteError(w, e.status, e.code, e.field, e.message)
}

func invalid(field, format string, args ...any) *requestError {
	return &requestError{http.StatusBadRequest, "invalid_field", field, fmt.Sprintf(format, args...)}
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
func parseCreate(w http.ResponseWriter, r *http.Request) (NewPayment, *requestError) {
	var req createRequest
	if err := decodeBody(w, r, &req, false); err != nil {
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
		return NewPayment{}, &requestError{http.StatusBadRequest, "unsupported_currency", "currency",
			fmt.Sprintf("currency %q is not supported: use INR (ISO 4217, upper case)", p.Currency)}
	}
	if !methods[p.Method] {
		return NewPayment{}, invalid("method", "method %q is not one of upi, card, netbanking, wallet", p.Method)
	}
	return p, nil
}

// refundRequest is the body of POST /v1/payments/{id}/refund: a refund is
// always of the full amount, so it has no fields. The body may be empty.
type refundRequest struct{}

func parseRefund(w http.ResponseWriter, r *http.Request) (refundRequest, *requestError) {
	var req refundRequest
	return req, decodeBody(w, r, &req, true)
}

// decodeBody decodes a JSON object of at most MaxBodyBytes into dst (a
// pointer to a struct), strictly: field names must match exactly (Go's
// decoder alone would accept "USER_ID"), unknown fields, wrong types and
// trailing data are errors.
func decodeBody(w http.ResponseWriter, r *http.Request, dst any, allowEmpty bool) *requestError {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &requestError{http.StatusRequestEntityTooLarge, "body_too_large", "body",
				fmt.Sprintf("the request body exceeds %d bytes", MaxBodyBytes)}
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return &requestError{http.StatusRequestTimeout, "request_timeout", "body", "the request body did not arrive in time"}
		}
		return &requestError{http.StatusBadRequest, "malformed_json", "body", "could not read the request body"}
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if allowEmpty {
			return nil
		}
		return &requestError{http.StatusBadRequest, "malformed_json", "body", "the request body must be a JSON object"}
	}
	// First as a generic object: the shape, and exact field names.
	var fields map[string]json.RawMessage
	if err := strictDecode(body, &fields); err != nil {
		return jsonError(err)
	}
	if fields == nil {
		return &requestError{http.StatusBadRequest, "malformed_json", "body", "the request body must be a JSON object, not null"}
	}
	if name, dup := events.DuplicateField(body); dup {
		// encoding/json keeps the last value silently; a client (or a proxy
		// in the middle) may have meant the first.
		return &requestError{http.StatusBadRequest, "duplicate_field", name, fmt.Sprintf("field %q appears more than once", name)}
	}
	known := jsonFields(dst)
	for name := range fields {
		if !known[name] {
			return &requestError{http.StatusBadRequest, "unknown_field", name, fmt.Sprintf("unknown field %q", name)}
		}
	}
	if err := strictDecode(body, dst); err != nil {
		return jsonError(err)
	}
	return nil
}

func strictDecode(body []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errTrailing
	}
	return nil
}

var errTrailing = errors.New("trailing data after the JSON object")

func jsonError(err error) *requestError {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field == "" {
			return &requestError{http.StatusBadRequest, "malformed_json", "body", "the request body must be a JSON object"}
		}
		want := typeErr.Type.Kind().String()
		switch typeErr.Type.Kind() {
		case reflect.Int64:
			want = "an integer"
		case reflect.String:
			want = "a string"
		}
		return &requestError{http.StatusBadRequest, "invalid_type", typeErr.Field,
			fmt.Sprintf("%s must be %s, got %s", typeErr.Field, want, typeErr.Value)}
	}
	var syntaxErr *json.SyntaxError
	if errors.As(err, &syntaxErr) {
		return &requestError{http.StatusBadRequest, "malformed_json", "body",
			fmt.Sprintf("malformed JSON at byte %d: %v", syntaxErr.Offset, err)}
	}
	return &requestError{http.StatusBadRequest, "malformed_json", "body", "malformed JSON: " + err.Error()}
}

// jsonFields lists the JSON names of a struct's fields.
func jsonFields(v any) map[string]bool {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	names := map[string]bool{}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names[name] = true
		}
	}
	return names
}
