package terms

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// Currency is the only currency cashback is computed in (amounts are paise).
const Currency = "INR"

// PaymentPayload is the payload of PaymentSucceeded and PaymentRefunded.
// Unknown fields are ignored: producers may add fields freely.
type PaymentPayload struct {
	PaymentID   string `json:"payment_id"`
	UserID      string `json:"user_id"`
	AmountPaise int64  `json:"amount_paise"`
	Currency    string `json:"currency"`
	Status      string `json:"status"`
	// Phone, if the producer knows it, is passed on as the SMS recipient.
	Phone string `json:"phone,omitempty"`
}

// CreditedPayload is the payload of CashbackCredited (aggregate: the
// payment id, version 1).
type CreditedPayload struct {
	PaymentID          string `json:"payment_id"`
	UserID             string `json:"user_id"`
	AmountPaise        int64  `json:"amount_paise"` // the cashback
	RateBP             int    `json:"rate_bp"`
	PaymentAmountPaise int64  `json:"payment_amount_paise"`
	Currency           string `json:"currency"`
	Recipient          string `json:"recipient"` // phone if known, else the user id
	SourceEventID      string `json:"source_event_id"`
}

// ReversedPayload is the payload of CashbackReversed (aggregate: the
// payment id, version 2).
type ReversedPayload struct {
	PaymentID     string `json:"payment_id"`
	UserID        string `json:"user_id"`
	AmountPaise   int64  `json:"amount_paise"` // the cashback taken back
	RateBP        int    `json:"rate_bp"`
	Currency      string `json:"currency"`
	Recipient     string `json:"recipient"`
	Reason        string `json:"reason"`
	SourceEventID string `json:"source_event_id"`
}

// Aggregate versions of the cashback events: one credit, one reversal per
// payment, so the version says which came first.
const (
	CreditedVersion = 1
	ReversedVersion = 2
)

// DecodeSucceeded reads and checks a PaymentSucceeded payload: ids that
// are ids, the aggregate's payment, a user, a positive amount in INR. Its
// errors are permanent: no redelivery changes the payload.
func DecodeSucceeded(e events.Envelope) (PaymentPayload, error) { return decodePayment(e, true) }

// DecodeRefunded reads and checks a PaymentRefunded payload: ids that are
// ids and the aggregate's payment; the amount is the credit's, not the
// payload's, so it is not required. Its errors are permanent.
func DecodeRefunded(e events.Envelope) (PaymentPayload, error) { return decodePayment(e, false) }

func decodePayment(e events.Envelope, needAmount bool) (PaymentPayload, error) {
	var p PaymentPayload
	if err := json.Unmarshal(e.Payload, &p); err != nil {
		return p, fmt.Errorf("%s payload: %w", e.EventType, err)
	}
	if p.PaymentID == "" {
		p.PaymentID = e.AggregateID
	}
	switch {
	case !events.ValidID(p.PaymentID):
		return p, fmt.Errorf("%s payload: payment_id %q is not an id (1-%d of A-Z a-z 0-9 _ . : @ -)", e.EventType, clip(p.PaymentID), events.MaxIDLength)
	case p.UserID != "" && !events.ValidID(p.UserID):
		return p, fmt.Errorf("%s payload: user_id %q is not an id (1-%d of A-Z a-z 0-9 _ . : @ -)", e.EventType, clip(p.UserID), events.MaxIDLength)
	case p.Phone != "" && !contract.ValidPhone(p.Phone):
		return p, fmt.Errorf("%s payload: phone is not an E.164 number", e.EventType) // the number itself stays out of logs
	case p.PaymentID != e.AggregateID:
		return p, fmt.Errorf("%s payload: payment_id %q differs from aggregate_id %q", e.EventType, p.PaymentID, e.AggregateID)
	case needAmount && p.UserID == "":
		return p, fmt.Errorf("%s payload: user_id missing", e.EventType)
	case needAmount && p.AmountPaise <= 0:
		return p, fmt.Errorf("%s payload: amount_paise must be positive, got %d", e.EventType, p.AmountPaise)
	case needAmount && !strings.EqualFold(p.Currency, Currency):
		return p, fmt.Errorf("%s payload: currency %q: cashback is only paid on %s", e.EventType, p.Currency, Currency)
	}
	return p, nil
}

// clip shortens a refused value for an error message (errors are logged and
// travel as the DLQ park_reason).
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Recipient is who hears of the cashback: the phone if the producer knew
// it, else the user id.
func (p PaymentPayload) Recipient() string {
	if p.Phone != "" {
		return p.Phone
	}
	return p.UserID
}
