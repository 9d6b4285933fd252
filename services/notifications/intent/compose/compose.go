// Package compose decides, from a cashback event alone, the SMS it asks
// for: the recipient, the kind, the body and the idempotency key every
// provider call for it carries. It reads no database and calls nothing:
// package intent records what it composes, package sender sends it.
package compose

import (
	"encoding/json"
	"fmt"

	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/pkg/errs"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// Channel is the only channel so far.
const Channel = "sms"

// Message kinds: each has its own SENDING policy (see package sender).
const (
	KindCashback         = "cashback"          // CashbackCredited
	KindCashbackReversed = "cashback_reversed" // CashbackReversed
)

// Kinds lists every kind, for configuration.
var Kinds = []string{KindCashback, KindCashbackReversed}

// Key is the provider idempotency key of the SMS for an event (rule 6, docs/design.md):
// derived from the event id, so every attempt, by any sender, after any
// crash, carries the same one.
func Key(eventID uuid.UUID) string { return "sms:" + eventID.String() }

// cashbackPayload is the part of CashbackCredited / CashbackReversed this
// service reads (services/rewards/cashback writes them).
type cashbackPayload struct {
	PaymentID   string `json:"payment_id"`
	UserID      string `json:"user_id"`
	AmountPaise *int64 `json:"amount_paise"`
	Recipient   string `json:"recipient"`
}

// Intent is the SMS an event asks for, as intent.Record stores it.
type Intent struct {
	EventID   uuid.UUID
	EventType string
	Kind      string
	Recipient string
	Body      string
	// NoSMS, when set, says why the event asks for no SMS (nothing was
	// credited or reversed: 0 paise); Body is then empty.
	NoSMS string
}

// Build derives the SMS intent of an event. Unknown event types and
// unusable payloads (no amount_paise among them) are permanent errors. A
// cashback of 0 paise, such as every credit while the rate is 0, is no
// error but asks for no SMS (Intent.NoSMS): "You got ₹0.00 cashback"
// tells the customer nothing.
func Build(e events.Envelope) (Intent, error) {
	var kind string
	switch e.EventType {
	case contract.CashbackCredited:
		kind = KindCashback
	case contract.CashbackReversed:
		kind = KindCashbackReversed
	default:
		return Intent{}, errs.Permanent(fmt.Errorf("notifications does not handle event type %q", e.EventType))
	}
	var p cashbackPayload
	if err := json.Unmarshal(e.Payload, &p); err != nil {
		return Intent{}, errs.Permanent(fmt.Errorf("%s payload: %w", e.EventType, err))
	}
	if p.PaymentID == "" {
		p.PaymentID = e.AggregateID
	}
	to := p.Recipient
	if to == "" {
		to = p.UserID
	}
	if to == "" {
		return Intent{}, errs.Permanent(fmt.Errorf("%s payload: no recipient nor user_id", e.EventType))
	}
	if !contract.ValidPhone(to) && !events.ValidID(to) {
		// The value stays out of the error: it may be a malformed number.
		return Intent{}, errs.Permanent(fmt.Errorf("%s payload: recipient is neither an E.164 number nor a user id", e.EventType))
	}
	if !events.ValidID(p.PaymentID) {
		return Intent{}, errs.Permanent(fmt.Errorf("%s payload: payment_id is not an id", e.EventType))
	}
	if p.AmountPaise == nil {
		return Intent{}, errs.Permanent(fmt.Errorf("%s payload: no amount_paise", e.EventType))
	}
	amount := *p.AmountPaise
	if amount < 0 {
		// Credits and reversals carry magnitudes: a negative one is a
		// producer's bug, not an SMS to send.
		return Intent{}, errs.Permanent(fmt.Errorf("%s payload: amount_paise %d is negative", e.EventType, amount))
	}
	in := Intent{EventID: e.EventID, EventType: e.EventType, Kind: kind, Recipient: to}
	if kind == KindCashback {
		in.Body = fmt.Sprintf("You got %s cashback on payment %s. It is in your wallet.", Rupees(amount), p.PaymentID)
	} else {
		in.Body = fmt.Sprintf("The %s cashback on payment %s was reversed: the payment was refunded.", Rupees(amount), p.PaymentID)
	}
	if amount == 0 {
		in.Body, in.NoSMS = "", "nothing was credited or reversed: 0 paise"
	}
	return in, nil
}

// Rupees formats paise the Indian way: "₹1,23,456.78" (the last three
// digits of the rupees, then groups of two).
func Rupees(paise int64) string {
	sign, abs := "", uint64(paise)
	if paise < 0 {
		// In uint64, so that -MinInt64 does not overflow back to itself.
		sign, abs = "-", -uint64(paise)
	}
	whole := fmt.Sprint(abs / 100)
	if len(whole) > 3 {
		head, tail := whole[:len(whole)-3], whole[len(whole)-3:]
		for i := len(head) - 2; i > 0; i -= 2 {
			head = head[:i] + "," + head[i:]
		}
		whole = head + "," + tail
	}
	return fmt.Sprintf("%s₹%s.%02d", sign, whole, abs%100)
}
