// Package contract is what the services of this system agree on and the
// library in pkg/ does not know: the names of the events they exchange and
// the shape of the personal data those events carry. The wire format
// itself (the envelope, its ids) is pkg/events; the queues, tables and API
// are described in docs/design.md.
package contract

import (
	"regexp"
	"strings"
)

// Event types of this system. Consumers treat any other type as poison.
const (
	// PaymentSucceeded and PaymentRefunded: payments → rewards, on payments-events.
	PaymentSucceeded = "PaymentSucceeded"
	PaymentRefunded  = "PaymentRefunded"
	// CashbackCredited and CashbackReversed: rewards → notifications, on rewards-events.
	CashbackCredited = "CashbackCredited"
	CashbackReversed = "CashbackReversed"
)

var phoneShape = regexp.MustCompile(`^\+[1-9][0-9]{7,14}$`)

// ValidPhone reports whether s is an E.164 phone number (+ and 8-15 digits).
func ValidPhone(s string) bool { return phoneShape.MatchString(s) }

// MaskPhone hides a phone number for logs, keeping the country code and
// the last four digits ("+91******3210") so a support person can still
// match it; anything that is not a +digits number is returned unchanged
// (a user id used as the recipient is not personal data of that kind).
func MaskPhone(s string) string {
	if len(s) < 8 || s[0] != '+' {
		return s
	}
	for _, c := range s[1:] {
		if c < '0' || c > '9' {
			return s
		}
	}
	return s[:3] + strings.Repeat("*", len(s)-7) + s[len(s)-4:]
}
