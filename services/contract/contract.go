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

// phoneInText is what may be a phone number inside free text: an optional
// + and at least 8 digits, possibly grouped by spaces, dashes or brackets
// ("+91 98000-00017", "(980) 000 0017"). Dots are not separators, so an
// IP address or a version is not taken for one.
var phoneInText = regexp.MustCompile(`\+?\(?[0-9](?:[ ()-]{0,2}[0-9]){7,}`)

// MaskPhones masks every phone number in a free text (a provider's answer
// that repeats the number it was sent to) as MaskPhone masks one: the
// first two digits and the last four are kept, every digit between them
// becomes *, the separators stay ("+91******0017"). A run of digits counts
// as a number from 8 digits after a +, from 9 without one (an 8-digit
// date is left alone); a longer id or timestamp is masked too, the safe
// side for text that goes to logs and rows.
func MaskPhones(text string) string {
	return phoneInText.ReplaceAllStringFunc(text, func(m string) string {
		digits := 0
		for i := 0; i < len(m); i++ {
			if m[i] >= '0' && m[i] <= '9' {
				digits++
			}
		}
		if m[0] != '+' && digits < 9 {
			return m
		}
		b := []byte(m)
		seen := 0
		for i, c := range b {
			if c >= '0' && c <= '9' {
				if seen >= 2 && seen < digits-4 {
					b[i] = '*'
				}
				seen++
			}
		}
		return string(b)
	})
}
